//! `manifest.jsonl`: what the PyTorch capture hook writes beside its dumps,
//! one JSON line per dump (file, rank, pid, device, step, time, reason, and
//! the memory it measured outside the snapshot: resident and device bytes).
//!
//! PyTorch's pickles carry neither step nor time of the dump; the manifest
//! does, so reports can order and label checkpoints by step and seconds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;
use snapdiff_format::{Extra, Snapshot, Value};

/// The manifest's file name.
pub const FILE_NAME: &str = snapdiff_format::names::MANIFEST_FILE_NAME;

/// A manifest larger than this is not read (a real one has a line per dump,
/// about 150 bytes each).
const MAX_BYTES: u64 = 64 << 20;

/// One dump, as the hook described it.
#[derive(Debug, Deserialize)]
pub struct Entry {
    /// The dump's file name in the folder; `None` for a dump that failed.
    pub file: Option<String>,
    /// The rank of the process that dumped it, if distributed.
    pub rank: Option<u32>,
    /// The process id.
    pub pid: Option<u32>,
    /// The training step (optimizer steps counted by the hook).
    pub step: Option<u64>,
    /// Unix time in seconds.
    pub time: Option<f64>,
    /// step, interval, signal, oom or exit.
    pub reason: Option<String>,
    /// Why the dump failed.
    pub error: Option<String>,
    /// How long writing the dump (and its owners) held the process.
    pub seconds: Option<f64>,
    /// How much of it finding and writing the owners took (`--owners`).
    pub owners_seconds: Option<f64>,
    /// Interval dumps the process skipped so far, a dump being written.
    pub skipped: Option<u64>,
    /// The interval in seconds, where this dump widened it.
    pub interval: Option<f64>,
    /// `cpu` (capture's recorder) or `cuda:N`.
    pub device: Option<String>,
    /// The machine the process ran on.
    pub host: Option<String>,
    /// The run of `snapdiff capture` it was part of.
    pub run: Option<String>,
    /// Why the recording had stopped by this dump (the job replaced the
    /// allocator the recorder wraps), when it had.
    pub stopped: Option<String>,
    /// The process's resident memory when the dump was taken.
    pub rss_bytes: Option<u64>,
    /// Bytes in use on the device then, by every user of it.
    pub device_used_bytes: Option<u64>,
}

/// The entries of the manifest at `path` after its first `from` bytes; lines
/// that are not entries are passed over.
pub fn entries(path: &Path, from: u64) -> Vec<Entry> {
    let Ok(text) = read_bounded(path) else {
        return Vec::new();
    };
    let new = text.get(from as usize..).unwrap_or_default();
    String::from_utf8_lossy(new)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The entries in the whole lines of the manifest at `path` after its
/// first `from` bytes, and where the last whole line ends: a line being
/// appended is left for the next read, unless it is longer than a manifest
/// may be (no entry: passed over, so that it is not read again).
pub fn new_entries(path: &Path, from: u64) -> (Vec<Entry>, u64) {
    use std::io::{Read, Seek};
    let mut text = Vec::new();
    let read = snapdiff_format::open_regular(path).and_then(|mut f| {
        f.seek(std::io::SeekFrom::Start(from))?;
        f.take(MAX_BYTES).read_to_end(&mut text)
    });
    if read.is_err() {
        return (Vec::new(), from);
    }
    let Some(end) = text.iter().rposition(|&b| b == b'\n') else {
        let past = if text.len() as u64 >= MAX_BYTES {
            MAX_BYTES
        } else {
            0
        };
        return (Vec::new(), from + past);
    };
    let entries = String::from_utf8_lossy(&text[..end])
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    (entries, from + end as u64 + 1)
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut text = Vec::new();
    snapdiff_format::open_regular(path)?
        .take(MAX_BYTES)
        .read_to_end(&mut text)?;
    Ok(text)
}

/// Fills in step, time, process and label of each snapshot that a manifest
/// beside its file describes, where the snapshot does not say them itself.
/// Returns, for each snapshot, the process the manifest says wrote it
/// (`rank3`, or `pid812` without a rank).
pub fn describe(snapshots: &mut [(&PathBuf, Snapshot)]) -> Vec<Option<String>> {
    let manifests = Manifests::default();
    snapshots
        .iter_mut()
        .map(|(path, snap)| manifests.describe(path, snap))
        .collect()
}

/// The manifests of the folders snapshots are read from, each read once
/// however many files of its folder are described, by any thread. Each
/// file is described once, so its entry is let go once used: what is held
/// is the entries of the files not yet read.
#[derive(Default)]
pub struct Manifests(Mutex<HashMap<PathBuf, HashMap<String, Entry>>>);

impl Manifests {
    /// What [`describe`] does for one snapshot read from `path`.
    pub fn describe(&self, path: &Path, snap: &mut Snapshot) -> Option<String> {
        let folder = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = path.file_name()?.to_string_lossy().into_owned();
        let entry = {
            let mut folders = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let entries = folders.entry(folder).or_insert_with_key(|folder| {
                entries(&folder.join(FILE_NAME), 0)
                    .into_iter()
                    .filter_map(|e| Some((e.file.clone()?, e)))
                    .collect()
            });
            let entry = entries.remove(&name);
            // A folder read whole keeps no room for entries (1,250 folders'
            // leftover room was a third of a 10,000-rank job's heap).
            if entries.is_empty() || entries.len() < entries.capacity() / 4 {
                entries.shrink_to_fit();
            }
            entry
        };
        apply(&entry?, snap)
    }
}

/// Fills in what `entry` says of its dump where `snap` does not say it
/// itself, and returns the process it says wrote it (`rank3`, or `pid812`
/// without a rank).
pub fn apply(entry: &Entry, snap: &mut Snapshot) -> Option<String> {
    let meta = &mut snap.meta;
    meta.step = meta.step.or(entry.step);
    meta.created_us = meta
        .created_us
        .or(entry.time.map(|t| (t * 1e6).round() as i64));
    meta.pid = meta.pid.or(entry.pid);
    if meta.host.is_none() {
        meta.host.clone_from(&entry.host);
    }
    if meta.run_id.is_none()
        && let Some(run) = &entry.run
    {
        // Capture's run is every process's of the job: with the process.
        meta.run_id = Some(match entry.pid {
            Some(pid) => format!("{run}-{pid}"),
            None => run.clone(),
        });
    }
    if meta.label.is_none() {
        meta.label = match (entry.rank, &entry.reason) {
            (Some(rank), Some(reason)) => Some(format!("rank {rank}, {reason}")),
            (None, Some(reason)) => Some(reason.clone()),
            (_, None) => None,
        };
    }
    add_outside(entry, &mut meta.extra);
    match (entry.rank, entry.pid) {
        (Some(rank), _) => Some(format!("rank{rank}")),
        (None, Some(pid)) => Some(format!("pid{pid}")),
        (None, None) => None,
    }
}

/// What the dump measured outside the recorded memory, as the analyses
/// read it from a snapshot's extra keys (see `snapdiff_analyze::Outside`).
fn add_outside(entry: &Entry, extra: &mut Extra) {
    use snapdiff_analyze::outside::{CPU_KEY, DEVICE_KEY, DEVICE_USED_KEY, RSS_KEY};
    let mut put = |key: &str, value: Value| {
        if !extra.iter().any(|(k, _)| k == key) {
            extra.push((key.to_owned(), value));
        }
    };
    if let Some(rss) = entry.rss_bytes {
        put(RSS_KEY, Value::Int(rss.into()));
    }
    let device = entry.device.as_deref().unwrap_or_default();
    if device == "cpu" {
        put(CPU_KEY, Value::Bool(true));
    }
    if let Some(used) = entry.device_used_bytes {
        put(DEVICE_USED_KEY, Value::Int(used.into()));
        let ordinal = device
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<u32>().ok());
        put(DEVICE_KEY, Value::Int(ordinal.unwrap_or(0).into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_longer_than_a_manifest_may_be_is_passed_over_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.jsonl");
        let mut text = vec![b'x'; MAX_BYTES as usize + 10];
        text.extend_from_slice(b"\n{\"file\": \"a.pickle\", \"pid\": 7}\n{\"file\": \"b");
        std::fs::write(&path, &text).unwrap();
        let (entries, to) = new_entries(&path, 0);
        assert!(entries.is_empty());
        assert_eq!(to, MAX_BYTES);
        // The rest of the long line, then one whole entry; the entry
        // being written is left for later.
        let (entries, to) = new_entries(&path, to);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].file.as_deref(), Some("a.pickle"));
        assert_eq!(to as usize, text.len() - b"{\"file\": \"b".len());
    }
}
