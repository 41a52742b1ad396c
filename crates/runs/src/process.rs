//! Which process wrote a snapshot file: one rule for every command.

use std::path::{Path, PathBuf};

use snapdiff_format::Snapshot;

/// `files` grouped by the process their names say wrote them (see
/// [`process_named`]), before any is read; files whose names say nothing
/// form one group, named "". Groups are sorted by name, files kept in
/// their order. Each group is made at its size, the files counted first:
/// for 100,000 files the groups' growing copies were a third of what a
/// fleet held at its peak.
pub fn by_process(files: Vec<PathBuf>) -> Vec<(String, Vec<PathBuf>)> {
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

/// The process a file's name says wrote it (see
/// [`snapdiff_format::names::process_of`]), "" when it says nothing.
pub fn process_named(file: &Path) -> String {
    file.file_name()
        .and_then(|n| snapdiff_format::names::process_of(&n.to_string_lossy()))
        .unwrap_or_default()
}

/// The process that wrote a snapshot already read from `path`, `writer`
/// being what its manifest says (see [`manifest`](crate::manifest)):
///
/// 1. as the file's name says (`rank3-step40.pickle`);
/// 2. else as the manifest says;
/// 3. else by the process id the file records (runtime `.snap` files do);
/// 4. else as its folder's name says (`rank3/step40.pickle` is rank3's);
/// 5. else its folder itself (ranks that each dump plain PyTorch
///    snapshots into a folder of their own are never one series);
/// 6. "" for a file in the current folder that nothing names.
pub fn process_of(path: &Path, snap: &Snapshot, writer: Option<&str>) -> String {
    if let Some(said) = process_said(path, snap, writer) {
        return said;
    }
    match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder.to_string_lossy().into_owned(),
        _ => String::new(),
    }
}

/// The process that wrote a snapshot where something says it: rules 1 to
/// 4 of [`process_of`], never a folder that only holds the file (a file
/// copied elsewhere is not another process's).
pub fn process_said(path: &Path, snap: &Snapshot, writer: Option<&str>) -> Option<String> {
    path.file_name()
        .and_then(|n| snapdiff_format::names::process_of(&n.to_string_lossy()))
        .or_else(|| writer.map(str::to_owned))
        .or_else(|| snap.meta.pid.map(|pid| format!("pid{pid}")))
        .or_else(|| {
            let folder = path.parent()?.file_name()?;
            rank_folder(&folder.to_string_lossy())
        })
}

/// `rankN` for a folder named `rankN`, `rank_N` or `rank-N`.
fn rank_folder(name: &str) -> Option<String> {
    let digits = name.strip_prefix("rank")?.trim_start_matches(['_', '-']);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("rank{digits}"))
}

/// The rank a process name gives: 7 for `rank7`, and for `rank7@pid812`
/// (rank 7, one of two runs judged apart; see [`names_apart`](crate::names_apart)).
pub fn rank_of(process: &str) -> Option<u32> {
    let name = process.split_once('@').map_or(process, |(name, _)| name);
    name.strip_prefix("rank")?.parse().ok()
}

/// Whether `process` is the one `only` asks for: all when `None`; a number
/// `7` asks for `rank7`.
pub fn wanted(process: &str, only: Option<&str>) -> bool {
    match only {
        None => true,
        Some(r) if !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()) => {
            r.parse().ok() == rank_of(process)
        }
        Some(name) => process == name,
    }
}

/// Items grouped by the name paired with each, groups sorted by name, items
/// kept in their order. (A map, not a search of the groups so far: a job
/// of 10,000 ranks has 100,000 files.)
pub fn group<T>(items: impl IntoIterator<Item = (String, T)>) -> Vec<(String, Vec<T>)> {
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
    fn a_file_is_the_process_its_name_manifest_id_or_folder_says() {
        let snap = Snapshot::default();
        let of = |path: &str| process_of(Path::new(path), &snap, None);
        assert_eq!(of("job/rank3/step40.pickle"), "rank3");
        assert_eq!(of("job/rank_12/step40.pickle"), "rank12");
        assert_eq!(of("job/node-a/step40.pickle"), "job/node-a");
        assert_eq!(of("job/rank1-step40.pickle"), "rank1");
        assert_eq!(of("step40.pickle"), "");
        assert_eq!(
            process_of(Path::new("job/x/step40.pickle"), &snap, Some("rank4")),
            "rank4"
        );
        let mut with_pid = Snapshot::default();
        with_pid.meta.pid = Some(812);
        assert_eq!(
            process_of(Path::new("job/x/step40.pickle"), &with_pid, None),
            "pid812"
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

    #[test]
    fn ranks_are_asked_for_by_number_or_name() {
        assert_eq!(rank_of("rank7@pid812"), Some(7));
        assert!(wanted("rank7", Some("7")) && !wanted("rank17", Some("7")));
        assert!(wanted("pid5", Some("pid5")) && wanted("x", None));
    }
}
