//! Which process wrote a snapshot file, from its name, so that files of
//! different ranks or processes are never judged as one series.

use std::path::{Path, PathBuf};

use snapdiff_format::Snapshot;
use snapdiff_format::names::process_of;

/// `files` grouped by the process that wrote them, as their names say (see
/// [`process_of`]); files whose names say nothing form one group, named "".
/// Groups are sorted by name, files kept in their order. Each group is
/// made at its size, the files counted first: for 100,000 files the
/// groups' growing copies were a third of what a fleet held at its peak.
pub(crate) fn by_process(files: Vec<PathBuf>) -> Vec<(String, Vec<PathBuf>)> {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for file in &files {
        *counts.entry(process_named(file)).or_default() += 1;
    }
    let mut groups: std::collections::BTreeMap<String, Vec<PathBuf>> = counts
        .into_iter()
        .map(|(name, n)| (name, Vec::with_capacity(n)))
        .collect();
    for file in files {
        if let Some(group) = groups.get_mut(&process_named(&file)) {
            group.push(file);
        }
    }
    groups.into_iter().collect()
}

/// The process a file's name says wrote it (see [`process_of`]), "" when
/// it says nothing.
pub(crate) fn process_named(file: &Path) -> String {
    file.file_name()
        .and_then(|n| process_of(&n.to_string_lossy()))
        .unwrap_or_default()
}

/// The process that wrote a snapshot already read: as its file name says
/// (see [`process_of`]), else as its manifest says (`writer`), else by the
/// process id the file records (runtime `.snap` files do). "" when nothing
/// says.
pub(crate) fn process_of_snapshot(path: &Path, snap: &Snapshot, writer: Option<&str>) -> String {
    path.file_name()
        .and_then(|n| process_of(&n.to_string_lossy()))
        .or_else(|| writer.map(str::to_owned))
        .or_else(|| snap.meta.pid.map(|pid| format!("pid{pid}")))
        .unwrap_or_default()
}

/// [`process_of_snapshot`] where many processes' files are read together
/// (`fleet`, `export`, `watch`): a file nothing names is its folder's
/// process, as the folder's name says (`rank3/step40.pickle` is rank3's),
/// else named by the folder itself. Ranks that each dump plain PyTorch
/// snapshots into a folder of their own are then never one series.
pub(crate) fn process_of_fleet_file(path: &Path, snap: &Snapshot, writer: Option<&str>) -> String {
    let named = process_of_snapshot(path, snap, writer);
    match path.parent() {
        Some(folder) if named.is_empty() && !folder.as_os_str().is_empty() => folder
            .file_name()
            .and_then(|n| rank_folder(&n.to_string_lossy()))
            .unwrap_or_else(|| folder.to_string_lossy().into_owned()),
        _ => named,
    }
}

/// `rankN` for a folder named `rankN`, `rank_N` or `rank-N`.
fn rank_folder(name: &str) -> Option<String> {
    let digits = name.strip_prefix("rank")?.trim_start_matches(['_', '-']);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("rank{digits}"))
}

/// Items grouped by the name paired with each, groups sorted by name, items
/// kept in their order. (A map, not a search of the groups so far: a job
/// of 10,000 ranks has 100,000 files.)
pub(crate) fn group<T>(items: impl IntoIterator<Item = (String, T)>) -> Vec<(String, Vec<T>)> {
    let mut groups: std::collections::BTreeMap<String, Vec<T>> = Default::default();
    for (name, item) in items {
        groups.entry(name).or_default().push(item);
    }
    groups.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_nothing_names_is_its_folders_process_in_a_fleet() {
        let snap = Snapshot::default();
        let of = |path: &str| process_of_fleet_file(Path::new(path), &snap, None);
        assert_eq!(of("job/rank3/step40.pickle"), "rank3");
        assert_eq!(of("job/rank_12/step40.pickle"), "rank12");
        assert_eq!(of("job/node-a/step40.pickle"), "job/node-a");
        assert_eq!(of("job/rank1-step40.pickle"), "rank1");
        assert_eq!(of("job/x/step40.pickle"), "job/x");
        assert_eq!(of("step40.pickle"), "");
        assert_eq!(
            process_of_snapshot(Path::new("job/rank3/step40.pickle"), &snap, None),
            ""
        );
    }

    #[test]
    fn files_are_grouped_by_the_process_their_names_say() {
        let files: Vec<PathBuf> = [
            "rank1-step2.pickle",
            "rank0-step2.pickle",
            "rank1-step4.pickle",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let groups = by_process(files);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].0, "rank0");
        assert_eq!(groups[1].1.len(), 2);
    }
}
