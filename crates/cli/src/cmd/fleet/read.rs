//! Reading a fleet's snapshot files in parallel, a process at a time, so
//! that what is held is each process's site tables, never its snapshots.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use snapdiff_fleet::{ProcessRows, StackStore, Unreadable};

use crate::manifest::Manifests;
use crate::processes::{by_process, process_of_snapshot};

/// What reading the files came to, besides the processes' rows.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Files that could not be read, in path order.
    pub(crate) unreadable: Vec<Unreadable>,
    /// Files read.
    pub(crate) files: usize,
    /// Their bytes.
    pub(crate) bytes: u64,
}

/// Reads `files` on the current rayon pool and hands each process's rows to
/// `done` once all its files are read. Files whose names say their process
/// (`rank7-step100.pickle`) are read a process at a time, each process's
/// files in turn on one thread; the others are told apart after reading
/// (manifest, recorded process id) and handed on at the end. `only` keeps
/// one process's files (see [`wanted`]).
pub(crate) fn read_processes(
    files: &[PathBuf],
    only: Option<&str>,
    stacks: &StackStore,
    done: impl Fn(ProcessRows) + Sync,
) -> Outcome {
    let progress = Progress::new(files);
    let reader = FileReader {
        manifests: Manifests::default(),
        outcome: Mutex::new(Outcome::default()),
        progress: &progress,
        stacks,
    };
    let unnamed: Mutex<BTreeMap<String, ProcessRows>> = Mutex::new(BTreeMap::new());
    by_process(files).par_iter().for_each(|(name, files)| {
        if name.is_empty() {
            files.par_iter().for_each(|path| {
                reader.read(path, None, only, |one| {
                    let mut unnamed = unnamed.lock().unwrap_or_else(|e| e.into_inner());
                    match unnamed.get_mut(&one.process) {
                        Some(rows) => rows.append(one),
                        None => {
                            unnamed.insert(one.process.clone(), one);
                        }
                    }
                });
            });
        } else if wanted(name, only) {
            let mut rows = ProcessRows::new(name.clone());
            for path in files {
                reader.read(path, Some(name), only, |one| rows.append(one));
            }
            if rows.checkpoint_count() > 0 {
                done(rows);
            }
        } else {
            progress.skip(files);
        }
    });
    for (_, rows) in unnamed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        done(rows);
    }
    progress.finish();
    let mut outcome = reader
        .outcome
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    outcome.unreadable.sort_by(|a, b| a.source.cmp(&b.source));
    outcome
}

/// What every reading thread shares.
struct FileReader<'a> {
    manifests: Manifests,
    outcome: Mutex<Outcome>,
    progress: &'a Progress,
    stacks: &'a StackStore,
}

impl FileReader<'_> {
    /// Reads `path` and hands its rows, as one process's (`process`, else
    /// as the manifest or the snapshot says), to `add`, unless `only` wants
    /// another process. The snapshot is dropped before this returns.
    fn read(
        &self,
        path: &PathBuf,
        process: Option<&str>,
        only: Option<&str>,
        add: impl FnOnce(ProcessRows),
    ) {
        let len = std::fs::metadata(path).map_or(0, |m| m.len());
        let result = crate::input::read_state_quietly(path);
        self.progress.file_done(len);
        let mut snap = match result {
            Ok(snap) => snap,
            Err(e) => {
                self.outcome
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .unreadable
                    .push(Unreadable {
                        source: path.to_string_lossy().into_owned(),
                        error: snapdiff_format::visible::escaped(&e.to_string()).into_owned(),
                    });
                return;
            }
        };
        let writer = self.manifests.describe(path, &mut snap);
        let process = process.map_or_else(
            || process_of_snapshot(path, &snap, writer.as_deref()),
            str::to_owned,
        );
        if wanted(&process, only) {
            let mut rows = ProcessRows::new(process);
            let owners = crate::owners::by_site(path, &snap);
            rows.add_snapshot(&path.to_string_lossy(), &snap, self.stacks, owners.as_ref());
            add(rows);
        }
        drop(snap);
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        outcome.files += 1;
        outcome.bytes += len;
    }
}

/// Whether `process` is the one `only` asks for: all when `None`; a number
/// `7` asks for `rank7`.
pub(crate) fn wanted(process: &str, only: Option<&str>) -> bool {
    match only {
        None => true,
        Some(r) if !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()) => {
            process.strip_prefix("rank") == Some(r)
        }
        Some(name) => process == name,
    }
}

/// One progress bar for all the files, on a terminal only: files and bytes
/// done, rate, time left.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    files: usize,
    done: AtomicUsize,
}

impl Progress {
    fn new(files: &[PathBuf]) -> Progress {
        use std::io::IsTerminal;
        let bar = (std::io::stderr().is_terminal() && files.len() > 1).then(|| {
            let bytes = files
                .iter()
                .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
                .sum();
            let bar = indicatif::ProgressBar::new(bytes);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "reading {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_message(format!("0/{} files", files.len()));
            bar
        });
        Progress {
            bar,
            files: files.len(),
            done: AtomicUsize::new(0),
        }
    }

    fn file_done(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
            bar.set_message(format!("{done}/{} files", self.files));
            bar.inc(bytes);
        }
    }

    fn skip(&self, files: &[PathBuf]) {
        for path in files {
            self.file_done(std::fs::metadata(path).map_or(0, |m| m.len()));
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
