//! Runs: which run of a process a dump is from, and the names runs of one
//! process are judged under.
//!
//! A run is told by the process id and machine that wrote its dumps and
//! the run of `snapdiff capture` it was part of, where the file or its
//! manifest says. Runs of one name that dumped at the same time (two jobs
//! writing one folder, both as `rank0`) are two processes: each is judged
//! on its own dumps, under a name that tells it apart (`rank0@pid812`). Of
//! runs that followed one another (a restarted rank), the latest is judged.

use snapdiff_format::Meta;

/// One run of a process, as far as its dumps say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Run {
    /// The process id.
    pub pid: Option<u32>,
    /// The machine.
    pub host: Option<String>,
    /// The recording's own run id (the runtime's, or capture's with the
    /// process id).
    pub id: Option<String>,
}

impl Run {
    /// The run a snapshot's metadata names.
    pub fn of(meta: &Meta) -> Run {
        Run {
            pid: meta.pid,
            host: meta.host.clone(),
            id: meta.run_id.clone(),
        }
    }

    /// In words, for notes: `process 812 on node3`.
    pub fn describe(&self) -> String {
        match (self.pid, &self.host) {
            (Some(pid), Some(host)) => format!("process {pid} on {host}"),
            (Some(pid), None) => format!("process {pid}"),
            (None, Some(host)) => format!("on {host}"),
            (None, None) => "another process".to_owned(),
        }
    }
}

/// The names `runs` of the process `name` are judged under when they ran
/// at the same time, in their order: `name@pid812` where the process ids
/// tell them apart, `name@pid812.node3` where the machines do, else
/// `name@run1`, `name@run2`, ... in order.
pub fn names_apart(name: &str, runs: &[&Run]) -> Vec<String> {
    let pids: Vec<Option<String>> = runs
        .iter()
        .map(|r| Some(format!("pid{}", r.pid?)))
        .collect();
    let pids_hosts: Vec<Option<String>> = runs
        .iter()
        .map(|r| Some(format!("pid{}.{}", r.pid?, r.host.as_deref()?)))
        .collect();
    let labels: Vec<String> = if distinct(&pids) {
        pids.into_iter().flatten().collect()
    } else if distinct(&pids_hosts) {
        pids_hosts.into_iter().flatten().collect()
    } else {
        (1..=runs.len()).map(|i| format!("run{i}")).collect()
    };
    labels
        .iter()
        .map(|label| format!("{name}@{label}"))
        .collect()
}

/// Whether every label is known and no two are alike.
fn distinct(labels: &[Option<String>]) -> bool {
    labels.iter().all(Option::is_some)
        && labels
            .iter()
            .enumerate()
            .all(|(i, l)| !labels[..i].contains(l))
}

/// Whether two runs' spans of time, `(first, last)` dump times in
/// microseconds, overlap: they dumped at the same time.
pub fn overlap(a: (i64, i64), b: (i64, i64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// A run told by its process id and machine alone (for tests).
#[cfg(test)]
pub(crate) fn run(pid: Option<u32>, host: Option<&str>) -> Run {
    Run {
        pid,
        host: host.map(str::to_owned),
        id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_named_by_what_tells_them_apart() {
        let (a, b) = (run(Some(812), Some("n1")), run(Some(813), Some("n1")));
        assert_eq!(
            names_apart("rank0", &[&a, &b]),
            ["rank0@pid812", "rank0@pid813"]
        );
        let (a, b) = (run(Some(7), Some("n1")), run(Some(7), Some("n2")));
        assert_eq!(
            names_apart("rank0", &[&a, &b]),
            ["rank0@pid7.n1", "rank0@pid7.n2"]
        );
        let (a, b) = (run(Some(7), None), run(Some(7), None));
        assert_eq!(
            names_apart("rank0", &[&a, &b]),
            ["rank0@run1", "rank0@run2"]
        );
        assert!(overlap((1, 5), (5, 9)) && overlap((1, 9), (3, 4)) && !overlap((1, 4), (5, 9)));
    }
}
