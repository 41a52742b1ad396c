//! Finding the dumps a running job writes, each once, when it is whole.
//!
//! Folders are polled, not watched through the kernel: inotify sees
//! nothing of what other machines write to a shared file system, where a
//! fleet's ranks dump. A poll lists again only the folders whose
//! modification time moved (a new name in a folder moves it), so its cost
//! is a `stat` a folder, whatever the number of dumps.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use snapdiff_fleet::{Unreadable, is_table_folder};
use snapdiff_format::names::{MANIFEST_FILE_NAME, is_capture_file, is_snapshot_name};

use snapdiff_runs::manifest::{self, Entry};

/// How long a dump in a folder with a manifest waits for its line there
/// (the capture hook writes it just after the dump) before it is read
/// without it.
const MANIFEST_GRACE: Duration = Duration::from_secs(30);
/// A folder modified this recently is listed again even if its time did
/// not move: on file systems with coarse times, two changes within one
/// tick show one time.
const RECENT: Duration = Duration::from_secs(2);

/// A dump found whole, ready to be read.
pub(crate) struct Ready {
    pub(crate) path: PathBuf,
    pub(crate) bytes: u64,
    /// Its line in the folder's manifest, when there is one.
    pub(crate) entry: Option<Entry>,
}

/// A dump seen but not read yet.
struct Waiting {
    /// Size and modification time at the last poll: a file still being
    /// written changes between polls.
    seen: (u64, Option<SystemTime>),
    since: Instant,
    /// A read failed while the file was this size and time.
    failed: Option<(u64, Option<SystemTime>)>,
}

/// One folder's manifest: what has been read of it, and what it says.
#[derive(Default)]
struct Manifest {
    read_to: u64,
    /// The file's length when last read: unchanged, it is not read again.
    seen_len: u64,
    entries: HashMap<String, Entry>,
}

/// The folders given, what was found in them, and which processes ended.
pub(crate) struct Follower {
    roots: Vec<PathBuf>,
    /// Every folder found, with its modification time when last listed.
    folders: HashMap<PathBuf, Option<SystemTime>>,
    /// Canonical paths of the folders, so that a link back is listed once.
    canonical_folders: HashSet<PathBuf>,
    /// Dumps seen and not yet read, by path.
    waiting: HashMap<PathBuf, Waiting>,
    /// Dumps read (or given up on), by a hash of their path: eight bytes
    /// a dump, so that a week of dumps is followed in little memory.
    done: HashSet<u64>,
    manifests: HashMap<PathBuf, Manifest>,
    /// Processes the manifests name, (pid, host), and whether each ended.
    processes: HashMap<(u32, Option<String>), bool>,
    host: Option<String>,
}

impl Follower {
    /// Follows `paths`: folders (searched recursively, also those made
    /// later) or single files. A path that does not exist yet is waited for.
    pub(crate) fn new(paths: &[PathBuf]) -> Follower {
        Follower {
            roots: paths.to_vec(),
            folders: HashMap::new(),
            canonical_folders: HashSet::new(),
            waiting: HashMap::new(),
            done: HashSet::new(),
            manifests: HashMap::new(),
            processes: HashMap::new(),
            host: host_name(),
        }
    }

    /// Dumps not read yet (being written, or waiting for their manifest line).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Looks for new dumps: those whole now are returned, in path order;
    /// with `last` (the watch ends), every dump there is, whole or not.
    /// A file that is not a regular file is named as unreadable.
    pub(crate) fn poll(&mut self, last: bool) -> (Vec<Ready>, Vec<Unreadable>) {
        let mut unreadable = Vec::new();
        for root in self.roots.clone() {
            if root.is_dir() {
                self.add_folder(&root);
            } else if root.exists() {
                self.saw(&root, &mut unreadable);
            }
        }
        let folders: Vec<PathBuf> = self.folders.keys().cloned().collect();
        for folder in folders {
            self.list(&folder, &mut unreadable);
        }
        let now = Instant::now();
        let mut ready = Vec::new();
        let mut paths: Vec<PathBuf> = self.waiting.keys().cloned().collect();
        paths.sort();
        for path in paths {
            let Some(state) = std::fs::metadata(&path).ok().map(|m| stamp(&m)) else {
                self.waiting.remove(&path); // removed before it was read
                continue;
            };
            let waiting = &self.waiting[&path];
            let folder = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let entry = self
                .manifests
                .get_mut(&folder)
                .and_then(|m| m.entries.remove(&name));
            let has_manifest = folder.join(MANIFEST_FILE_NAME).is_file();
            let whole = match &entry {
                Some(_) => true,
                None if last => true,
                None if has_manifest => now.duration_since(waiting.since) > MANIFEST_GRACE,
                None => waiting.seen == state,
            };
            let retried = !last && waiting.failed.is_some_and(|f| f == state);
            if whole && !retried {
                ready.push(Ready {
                    path: path.clone(),
                    bytes: state.0,
                    entry,
                });
            } else if let Some(w) = self.waiting.get_mut(&path) {
                w.seen = state;
                if let Some(entry) = entry {
                    // Put back until the file is read.
                    if let Some(m) = self.manifests.get_mut(&folder) {
                        m.entries.insert(name, entry);
                    }
                }
            }
        }
        (ready, unreadable)
    }

    /// Takes the dumps waiting that were last written before `started` as
    /// read: those in the folders before the job began are not its own.
    pub(crate) fn pass_over_older_than(&mut self, started: SystemTime) {
        let older: Vec<PathBuf> = self
            .waiting
            .keys()
            .filter(|p| {
                std::fs::metadata(p)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t < started)
            })
            .cloned()
            .collect();
        for path in older {
            self.read(&path);
        }
    }

    /// `path` was read: never again.
    pub(crate) fn read(&mut self, path: &Path) {
        self.waiting.remove(path);
        self.done.insert(path_hash(path));
    }

    /// `path` could not be read: tried again each time it changes (a
    /// writer that does not rename into place may write it in many pieces,
    /// with long pauses on a slow file system), and at the last poll, which
    /// names it unreadable if it still cannot be read.
    pub(crate) fn failed(&mut self, path: &Path) {
        let now = std::fs::metadata(path).ok().map(|m| stamp(&m));
        match (self.waiting.get_mut(path), now) {
            (Some(w), Some(now)) => {
                w.failed = Some(now);
                w.seen = now;
            }
            _ => self.read(path), // gone, or never waited for
        }
    }

    /// Whether every dump waiting failed to read and has not changed
    /// since: nothing more will come of them before the last poll.
    fn only_failed_wait(&self) -> bool {
        self.waiting.iter().all(|(path, w)| {
            w.failed.is_some() && std::fs::metadata(path).ok().map(|m| stamp(&m)) == w.failed
        })
    }

    /// Whether every process the manifests name has ended (its exit dump
    /// is written, or, on this machine, it no longer runs) and no dump
    /// waits to be read. False while no manifest named a process: a job
    /// without manifests is followed until interrupted.
    pub(crate) fn job_ended(&mut self) -> bool {
        if self.processes.is_empty() || !self.only_failed_wait() {
            return false;
        }
        self.note_ended_here();
        self.processes.values().all(|&ended| ended)
    }

    /// Notes the processes of this machine that no longer run as ended.
    fn note_ended_here(&mut self) {
        for ((pid, host), ended) in &mut self.processes {
            if !*ended && host.is_some() && *host == self.host {
                *ended = !process_runs(*pid);
            }
        }
    }

    /// The runs known to have ended: (process id, machine).
    pub(crate) fn ended_runs(&mut self) -> Vec<(u32, Option<String>)> {
        self.note_ended_here();
        let ended = self.processes.iter().filter(|(_, ended)| **ended);
        ended.map(|(run, _)| run.clone()).collect()
    }

    /// Takes the dumps of runs that had ended before the watch began (their
    /// exit line is in the manifest, or on this machine they no longer
    /// run) as read, and forgets those runs: a folder used again is
    /// followed for its new run, never judged on the old one's. Returns
    /// the dumps and the runs passed over.
    /// `ready`: what the first poll found whole (the others are found
    /// again by the next poll).
    pub(crate) fn pass_over_ended_runs(&mut self, ready: Vec<Ready>) -> (usize, usize) {
        let ended: HashSet<(u32, Option<String>)> = self.ended_runs().into_iter().collect();
        let of_ended = |entry: &Entry| {
            entry
                .pid
                .is_some_and(|pid| ended.contains(&(pid, entry.host.clone())))
        };
        let mut dumps = 0;
        for r in ready {
            match r.entry {
                Some(entry) if of_ended(&entry) => {
                    dumps += 1;
                    self.read(&r.path);
                }
                // Its line goes back, for the poll that reads it.
                Some(entry) => {
                    let folder = r.path.parent().unwrap_or(Path::new(".")).to_path_buf();
                    let name = r.path.file_name().unwrap_or_default().to_string_lossy();
                    if let Some(m) = self.manifests.get_mut(&folder) {
                        m.entries.insert(name.into_owned(), entry);
                    }
                }
                None => {}
            }
        }
        let mut old = Vec::new();
        for (folder, manifest) in &mut self.manifests {
            manifest.entries.retain(|file, entry| {
                let ended = of_ended(entry);
                if ended {
                    old.push(folder.join(file));
                }
                !ended
            });
        }
        dumps += old.iter().filter(|p| self.waiting.contains_key(*p)).count();
        for path in old {
            self.read(&path);
        }
        self.processes.retain(|_, ended| !*ended);
        (dumps, ended.len())
    }

    fn add_folder(&mut self, folder: &Path) {
        if self.folders.contains_key(folder) {
            return;
        }
        let canonical = std::fs::canonicalize(folder).unwrap_or_else(|_| folder.to_path_buf());
        if self.canonical_folders.insert(canonical) {
            self.folders.insert(folder.to_path_buf(), None);
        }
    }

    /// Lists `folder` again when it changed: new sub-folders are followed,
    /// new dumps wait to be read, its manifest's new lines are read.
    fn list(&mut self, folder: &Path, unreadable: &mut Vec<Unreadable>) {
        let Ok(meta) = std::fs::metadata(folder) else {
            return; // removed: its dumps were read or never will be
        };
        self.read_manifest(folder);
        let modified = meta.modified().ok();
        let recent = modified
            .and_then(|m| m.elapsed().ok())
            .is_none_or(|age| age < RECENT);
        if self.folders.get(folder) == Some(&modified) && !recent {
            return;
        }
        self.folders.insert(folder.to_path_buf(), modified);
        if is_table_folder(folder) {
            return; // site tables: not a job's dumps
        }
        let Ok(entries) = std::fs::read_dir(folder) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                self.add_folder(&path);
            } else if is_snapshot_name(&path) {
                self.saw(&path, unreadable);
            }
        }
    }

    fn saw(&mut self, path: &Path, unreadable: &mut Vec<Unreadable>) {
        if self.waiting.contains_key(path) || is_capture_file(path) {
            return;
        }
        let hash = path_hash(path);
        if self.done.contains(&hash) {
            return;
        }
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => {
                self.waiting.insert(
                    path.to_path_buf(),
                    Waiting {
                        seen: (u64::MAX, None), // not whole before a second look
                        since: Instant::now(),
                        failed: None,
                    },
                );
            }
            Ok(_) => {
                self.done.insert(hash);
                unreadable.push(Unreadable {
                    source: path.to_string_lossy().into_owned(),
                    error: format!(
                        "{}: not a regular file (a FIFO, device or socket is never read)",
                        crate::output::shown(path)
                    ),
                });
            }
            Err(_) => {}
        }
    }

    /// Reads the whole lines added to `folder`'s manifest since the last
    /// time (a `stat` when there are none).
    fn read_manifest(&mut self, folder: &Path) {
        let path = folder.join(MANIFEST_FILE_NAME);
        let manifest = self.manifests.entry(folder.to_path_buf()).or_default();
        let Some(len) = std::fs::metadata(&path).ok().map(|m| m.len()) else {
            return;
        };
        if len == manifest.seen_len {
            return; // nothing new, or only more of a line being written
        }
        if len < manifest.read_to {
            manifest.read_to = 0; // a new manifest in the old one's place
        }
        manifest.seen_len = len;
        let (entries, read_to) = manifest::new_entries(&path, manifest.read_to);
        manifest.read_to = read_to;
        for entry in entries {
            if let Some(pid) = entry.pid {
                let ended = entry.reason.as_deref() == Some("exit");
                let known = self.processes.entry((pid, entry.host.clone())).or_default();
                *known |= ended;
            }
            if let Some(file) = entry.file.clone()
                && !self.done.contains(&path_hash(&folder.join(&file)))
            {
                manifest.entries.insert(file, entry);
            }
        }
    }
}

/// A file's size and modification time: what changes while it is written.
fn stamp(meta: &std::fs::Metadata) -> (u64, Option<SystemTime>) {
    (meta.len(), meta.modified().ok())
}

fn path_hash(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut hasher);
    hasher.finish()
}

/// This machine's name, as the capture hook writes it in the manifest.
fn host_name() -> Option<String> {
    let mut name = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes.
    let done = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    if done != 0 {
        return None;
    }
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Whether process `pid` runs on this machine.
fn process_runs(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let sent = unsafe { libc::kill(pid, 0) };
    sent == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
