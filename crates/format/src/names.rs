//! The rules for snapshot files' names, in one place: which files of a
//! folder are snapshots, which are the files capture writes beside them,
//! which process wrote a dump, and which dumps are exit dumps. The Python
//! package's fleet lists files by the same rules (`_SNAPSHOT` and
//! `_PROCESS` in `python/snapdiff/_fleet.py`; `docs/format.md` states them).

use std::path::Path;

/// The extensions of files read as snapshots when a folder is given.
pub const SNAPSHOT_EXTENSIONS: [&str; 10] = [
    "snap", "pickle", "pkl", "json", "pt", "zip", "gz", "zst", "xz", "bz2",
];

/// The manifest capture and the runtime write beside their dumps: a JSON
/// line for each.
pub const MANIFEST_FILE_NAME: &str = "manifest.jsonl";

/// The end of an owners file's name (`NAME.owners.json` beside `NAME.pickle`).
pub const OWNERS_SUFFIX: &str = ".owners.json";

/// Whether a file found in a folder is read as a snapshot: by its
/// extension, owners files excepted.
pub fn is_snapshot_name(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| SNAPSHOT_EXTENSIONS.contains(&e))
        && !name.ends_with(OWNERS_SUFFIX)
}

/// Whether `path` is one of the files capture writes beside its dumps
/// (the manifest, owners files), never a snapshot, even when named.
pub fn is_capture_file(path: &Path) -> bool {
    path.file_name()
        .map(|n| n.to_string_lossy())
        .is_some_and(|n| n == MANIFEST_FILE_NAME || n.ends_with(OWNERS_SUFFIX))
}

/// The process that wrote the file `name`, as capture names files:
/// `rank0-step10.pickle` (rank 0) and `pid123-step10.pickle` from the PyTorch
/// hook, `snapdiff-123-dev0-0001-step.snap` from the runtime (process 123,
/// device 0). `None` for any other name.
pub fn process_of(name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("snapdiff-") {
        let mut parts = rest.splitn(3, '-');
        let (pid, dev) = (parts.next()?, parts.next()?);
        let valid = pid.bytes().all(|b| b.is_ascii_digit()) && dev.starts_with("dev");
        return valid.then(|| format!("process {pid} {dev}"));
    }
    let (who, _) = name.split_once("-step")?;
    let number = |prefix: &str| {
        who.strip_prefix(prefix)
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if let Some(rank) = number("rank") {
        return Some(format!("rank{rank}"));
    }
    number("pid").map(|pid| format!("pid{pid}"))
}

/// Whether the file `name` is an exit dump: its name ends in `-exit`
/// (`rank0-step40-exit.pickle`, `snapdiff-7-dev0-0009-exit.snap`), or in
/// `-exit-N` where capture found the name taken by an earlier run, before
/// its extension and any compression's.
pub fn is_exit_dump(name: &str) -> bool {
    let name = [".gz", ".zst", ".xz", ".bz2"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext))
        .unwrap_or(name);
    let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
    let stem = match stem.rsplit_once('-') {
        Some((head, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => stem,
    };
    stem.ends_with("-exit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_told_by_capture_names_only() {
        assert_eq!(process_of("rank3-step40.pickle").as_deref(), Some("rank3"));
        assert_eq!(
            process_of("rank3-step41-exit.pickle").as_deref(),
            Some("rank3")
        );
        assert_eq!(process_of("pid812-step5.pickle").as_deref(), Some("pid812"));
        assert_eq!(
            process_of("snapdiff-77-dev1-0003-step-000010.snap").as_deref(),
            Some("process 77 dev1")
        );
        assert_eq!(process_of("step-100.pickle"), None);
        assert_eq!(process_of("run-step-100.pickle"), None);
        assert_eq!(process_of("snapshot.pickle"), None);
    }

    #[test]
    fn exit_dumps_are_told_by_their_names() {
        for exit in [
            "rank0-step40-exit.pickle",
            "rank0-step40-exit-2.pickle",
            "rank0-step40-exit.pickle.gz",
            "snapdiff-7-dev0-0009-exit.snap",
        ] {
            assert!(is_exit_dump(exit), "{exit}");
        }
        for not in [
            "rank0-step40.pickle",
            "exit.pickle",
            "rank0-step40-2.pickle",
        ] {
            assert!(!is_exit_dump(not), "{not}");
        }
    }

    #[test]
    fn capture_files_are_not_snapshots() {
        assert!(is_snapshot_name(Path::new("a/rank0-step5.pickle")));
        assert!(!is_snapshot_name(Path::new("a/rank0-step5.owners.json")));
        assert!(is_capture_file(Path::new("a/manifest.jsonl")));
        assert!(is_capture_file(Path::new("rank0-step5.owners.json")));
    }
}
