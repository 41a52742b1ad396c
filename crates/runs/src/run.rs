//! Runs: which run of a process a dump is from, which runs of a process
//! are judged, and the names runs judged apart go by.
//!
//! A run is told by the process id and machine that wrote its dumps and
//! the run of `snapdiff capture` it was part of, where the file or its
//! manifest says; where nothing says (PyTorch's own dumps without a
//! manifest), by the folder that holds the process's files, so that two
//! runs of one job in sibling folders (`job/runA/rank1-step10.pickle`,
//! `job/runB/rank1-step10.pickle`) are two runs. Of runs that followed one
//! another (a restarted rank), the latest is judged; runs that dumped at
//! the same time, or of which nothing says when they ran, are each judged
//! on their own dumps, under names that tell them apart (`rank0@pid812`,
//! `rank1@runA`).

use std::path::{Path, PathBuf};

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
    /// The folder that holds the dump, where nothing above tells the run.
    pub folder: Option<PathBuf>,
    /// Where a folder's dumps hold several runs, told by a pause far
    /// longer than their spacing (see [`time_jumps`]): the first dump time
    /// of this one.
    pub since_us: Option<i64>,
}

impl Run {
    /// The run of a dump read from `path` whose metadata is `meta` (its
    /// manifest's facts filled in).
    pub fn of(meta: &Meta, path: &Path) -> Run {
        let mut run = Run {
            pid: meta.pid,
            host: meta.host.clone(),
            id: meta.run_id.clone(),
            folder: None,
            since_us: None,
        };
        if run == Run::default() {
            run.folder = Some(path.parent().unwrap_or(Path::new("")).to_path_buf());
        }
        run
    }

    /// In words, for notes: `process 812 on node3`, `the files in job/runA`.
    pub fn describe(&self) -> String {
        match (self.pid, &self.host, &self.folder) {
            (Some(pid), Some(host), _) => format!("process {pid} on {host}"),
            (Some(pid), None, _) => format!("process {pid}"),
            (None, Some(host), _) => format!("on {host}"),
            (None, None, Some(folder)) => format!("the files in {}", folder.display()),
            (None, None, None) => "another process".to_owned(),
        }
    }
}

/// How many times its own spacing a pause between two dumps of one folder
/// must last to be taken for a new run.
const JUMP_SPACINGS: i64 = 50;
/// And how long at least: a job that saves a checkpoint for minutes between
/// dumps a second apart is one run.
const JUMP_AT_LEAST_US: i64 = 3600 * 1_000_000;

/// Where dumps taken at `times` (in order) hold several runs: after a pause
/// more than 50 times their median spacing and more than an hour long (two
/// runs of a job, one folder, nothing else telling them apart). Returns
/// the indices at which each later run begins; none for fewer than four
/// dumps, whose spacing says nothing.
pub fn time_jumps(times: &[i64]) -> Vec<usize> {
    if times.len() < 4 {
        return Vec::new();
    }
    let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let mut sorted = gaps.clone();
    sorted.sort_unstable();
    let spacing = sorted[sorted.len() / 2].max(1);
    (gaps.iter().enumerate())
        .filter(|&(_, &gap)| gap > JUMP_SPACINGS.saturating_mul(spacing) && gap > JUMP_AT_LEAST_US)
        .map(|(i, _)| i + 1)
        .collect()
}

/// When a run dumped: the times of its first and last dumps and its last
/// step, as far as its dumps say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// The first and last dump times, in microseconds since the epoch.
    pub times: Option<(i64, i64)>,
    /// The last step dumped.
    pub last_step: Option<u64>,
}

impl Span {
    /// Widens the span by a dump taken at `time_us` and `step`.
    pub fn add(&mut self, time_us: Option<i64>, step: Option<u64>) {
        if let Some(t) = time_us {
            self.times = Some(self.times.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        }
        self.last_step = self.last_step.max(step);
    }

    /// Whether two spans overlap in time: the runs dumped at once.
    fn overlaps(&self, other: &Span) -> bool {
        match (self.times, other.times) {
            (Some(a), Some(b)) => a.0 <= b.1 && b.0 <= a.1,
            _ => false,
        }
    }
}

/// Which runs of one process to judge, by their index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Choice {
    /// Runs judged, each on its own dumps, in their order.
    pub judged: Vec<usize>,
    /// Runs that ended before the latest began: left out, said.
    pub left_out: Vec<usize>,
}

/// The runs of one process to judge, of runs that dumped over `spans`:
/// the latest (by the time of its last dump, else its last step, else the
/// last given); every run that dumped while it did; and every run of which
/// the dumps say no time, since nothing says it ended before. The others
/// ended before the latest began and are left out.
pub fn choose(spans: &[Span]) -> Choice {
    let Some(latest) = (0..spans.len()).max_by_key(|&i| {
        let span = &spans[i];
        ((span.times.map(|t| t.1), span.last_step), i)
    }) else {
        return Choice::default();
    };
    let mut choice = Choice::default();
    for (i, span) in spans.iter().enumerate() {
        let at_once = i == latest
            || span.overlaps(&spans[latest])
            || span.times.is_none()
            || spans[latest].times.is_none();
        if at_once {
            choice.judged.push(i);
        } else {
            choice.left_out.push(i);
        }
    }
    choice
}

/// Whether runs told only by their folders, `dumps[i]` dumps each, are
/// one run after all: when each folder holds one dump of the process, the
/// folders are its steps (`step10/rank3.pickle`), not its runs.
pub fn folder_steps_are_one_run(runs: &[&Run], dumps: &[usize]) -> bool {
    runs.len() > 1 && runs.iter().all(|r| r.folder.is_some()) && dumps.iter().all(|&n| n == 1)
}

/// The names `runs` of the process `name` are judged under when each is
/// judged on its own, in their order: `name@pid812` where the process ids
/// tell them apart, `name@pid812.node3` where the machines do,
/// `name@runA` where their folders' names do, else `name@run1`,
/// `name@run2`, ... in order.
pub fn names_apart(name: &str, runs: &[&Run]) -> Vec<String> {
    let pids: Vec<Option<String>> = runs
        .iter()
        .map(|r| Some(format!("pid{}", r.pid?)))
        .collect();
    let pids_hosts: Vec<Option<String>> = runs
        .iter()
        .map(|r| Some(format!("pid{}.{}", r.pid?, r.host.as_deref()?)))
        .collect();
    let folders: Vec<Option<String>> = runs
        .iter()
        .map(|r| {
            Some(
                r.folder
                    .as_ref()?
                    .file_name()?
                    .to_string_lossy()
                    .into_owned(),
            )
        })
        .collect();
    let labels: Vec<String> = if distinct(&pids) {
        pids.into_iter().flatten().collect()
    } else if distinct(&pids_hosts) {
        pids_hosts.into_iter().flatten().collect()
    } else if distinct(&folders) {
        folders.into_iter().flatten().collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pid: Option<u32>, host: Option<&str>) -> Run {
        Run {
            pid,
            host: host.map(str::to_owned),
            ..Run::default()
        }
    }

    fn folder(path: &str) -> Run {
        Run::of(
            &Meta::default(),
            &Path::new(path).join("rank1-step10.pickle"),
        )
    }

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
        let (a, b) = (folder("job/runA"), folder("job/runB"));
        assert_eq!(
            names_apart("rank1", &[&a, &b]),
            ["rank1@runA", "rank1@runB"]
        );
        let (a, b) = (run(Some(7), None), run(Some(7), None));
        assert_eq!(
            names_apart("rank0", &[&a, &b]),
            ["rank0@run1", "rank0@run2"]
        );
    }

    #[test]
    fn a_run_is_its_process_else_its_folder() {
        let mut meta = Meta::default();
        assert_eq!(folder("job/runA").folder, Some(PathBuf::from("job/runA")));
        assert_ne!(folder("job/runA"), folder("job/runB"));
        meta.pid = Some(5);
        let a = Run::of(&meta, Path::new("job/runA/x.pickle"));
        assert_eq!(a, Run::of(&meta, Path::new("job/runB/x.pickle")));
        assert_eq!(a.folder, None);
    }

    #[test]
    fn the_latest_run_is_judged_with_those_at_once_or_of_unknown_time() {
        let span = |a, b| Span {
            times: Some((a, b)),
            last_step: None,
        };
        let choice = choose(&[span(1, 4), span(5, 9), span(8, 12)]);
        assert_eq!((choice.judged, choice.left_out), (vec![1, 2], vec![0]));
        let unknown = Span::default();
        let choice = choose(&[unknown, unknown]);
        assert_eq!((choice.judged, choice.left_out), (vec![0, 1], vec![]));
        let choice = choose(&[span(1, 4), unknown]);
        assert_eq!(choice.judged, [0, 1]);
    }

    #[test]
    fn a_pause_far_longer_than_the_spacing_is_a_new_run() {
        let second = 1_000_000;
        let day = 86_400 * second;
        let run = |start: i64| (0..5).map(move |i| start + i * 10 * second);
        let two: Vec<i64> = run(0).chain(run(1157 * day)).collect();
        assert_eq!(time_jumps(&two), [5]);
        // A pause of minutes for a checkpoint save is the same run.
        let save: Vec<i64> = run(0).chain(run(40 * 60 * second)).collect();
        assert!(time_jumps(&save).is_empty());
        assert!(time_jumps(&[0, 7 * day]).is_empty());
    }

    #[test]
    fn folders_of_one_dump_each_are_steps_not_runs() {
        let (a, b) = (folder("s/step10"), folder("s/step20"));
        assert!(folder_steps_are_one_run(&[&a, &b], &[1, 1]));
        assert!(!folder_steps_are_one_run(&[&a, &b], &[6, 1]));
        let p = run(Some(1), None);
        assert!(!folder_steps_are_one_run(&[&p, &b], &[1, 1]));
    }
}
