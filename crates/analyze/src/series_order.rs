//! The order of a process's snapshots in its series, and which of them a
//! trend judges: by step, else time, else file name (numbers as numbers),
//! exit dumps left out.

use serde::Serialize;
use snapdiff_format::Snapshot;

/// A snapshot with the name it is known by, its file's name: what orders
/// snapshots that record neither step nor time.
#[derive(Clone, Copy, Debug)]
pub struct NamedSnapshot<'a> {
    /// The file's name (`step-200.pickle`); empty when it has none.
    pub name: &'a str,
    /// The snapshot.
    pub snapshot: &'a Snapshot,
}

/// How the snapshots of a trend were put in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotOrder {
    /// By the step each records.
    Steps,
    /// By the time each was taken.
    Times,
    /// By their names, numbers compared as numbers (`step-200` before
    /// `step-1000`): they record neither step nor time.
    Names,
    /// As given: they record neither step nor time, and have no names.
    Given,
}

/// What puts a snapshot in its place in a series: its step, its time, and
/// its file's name.
#[derive(Clone, Copy, Debug, Default)]
pub struct OrderKey<'a> {
    /// The training step it records.
    pub step: Option<u64>,
    /// When it was taken, in microseconds since the Unix epoch.
    pub time_us: Option<i64>,
    /// Its file's name; empty when it has none.
    pub name: &'a str,
}

/// The order of snapshots with `keys`: by step if all record one, else by
/// time if all record one, else by name with numbers compared as numbers,
/// else as given. Returns the indices of `keys` in order, and which order
/// it is.
pub fn snapshot_order(keys: &[OrderKey<'_>]) -> (Vec<usize>, SnapshotOrder) {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    let by = if keys.iter().all(|k| k.step.is_some()) {
        order.sort_by_key(|&i| (keys[i].step, keys[i].time_us));
        SnapshotOrder::Steps
    } else if keys.iter().all(|k| k.time_us.is_some()) {
        order.sort_by_key(|&i| keys[i].time_us);
        SnapshotOrder::Times
    } else if keys.iter().any(|k| !k.name.is_empty()) {
        order.sort_by_cached_key(|&i| natural_key(keys[i].name));
        SnapshotOrder::Names
    } else {
        SnapshotOrder::Given
    };
    (order, by)
}

/// Which snapshots of a series to judge, by their files' names: exit dumps
/// (a name ending in `-exit`, or `-exit-N` where the name was taken, as
/// capture names them) are taken after the
/// program freed its own variables, so what leaked into them is gone; among
/// three or more other dumps they would hide every leak, and are left out.
/// Returns whether each is kept, and a note when some are not.
pub fn without_exit_dumps(names: &[&str]) -> (Vec<bool>, Option<String>) {
    let is_exit = |name: &str| snapdiff_format::names::is_exit_dump(name);
    let exits = names.iter().filter(|n| is_exit(n)).count();
    if exits == 0 || names.len() - exits < 3 {
        return (vec![true; names.len()], None);
    }
    let keep = names.iter().map(|n| !is_exit(n)).collect();
    let note = format!(
        "{exits} exit snapshot{} left out: taken after the program freed its variables, \
         {} would hide what leaked into them",
        if exits == 1 { "" } else { "s" },
        if exits == 1 { "it" } else { "they" },
    );
    (keep, Some(note))
}

/// A sort key that compares runs of digits as numbers: `step-200` < `step-1000`.
fn natural_key(text: &str) -> Vec<(u8, u128, String)> {
    let mut key = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits > 0 {
            let (num, tail) = rest.split_at(digits);
            key.push((0, num.parse().unwrap_or(u128::MAX), String::new()));
            rest = tail;
        } else {
            let text_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let (word, tail) = rest.split_at(text_len);
            key.push((1, 0, word.to_owned()));
            rest = tail;
        }
    }
    key
}

#[cfg(test)]
mod tests {
    #[test]
    fn natural_order_compares_numbers_as_numbers() {
        let mut names = vec![
            "step-1000.pickle",
            "step-200.pickle",
            "step-30.pickle",
            "a.pickle",
        ];
        names.sort_by_cached_key(|n| super::natural_key(n));
        assert_eq!(
            names,
            [
                "a.pickle",
                "step-30.pickle",
                "step-200.pickle",
                "step-1000.pickle"
            ]
        );
    }
}
