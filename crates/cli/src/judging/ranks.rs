//! Reading a fleet's snapshot files in parallel, a process at a time, so
//! that what is held is each process's site tables, never its snapshots.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use snapdiff_analyze::TrendOptions;
use snapdiff_fleet::{ProcessRows, StackStore, Unreadable};
use snapdiff_runs::{Run, Span, wanted};

use snapdiff_runs::Census;
use snapdiff_runs::manifest::Manifests;

/// What reading the files came to, besides the processes' rows.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Files that could not be read, in path order.
    pub(crate) unreadable: Vec<Unreadable>,
    /// Files read.
    pub(crate) files: usize,
    /// Their bytes.
    pub(crate) bytes: u64,
    /// Processes whose files came from more than one run (another process
    /// id or machine under the same rank): only the latest run is judged.
    pub(crate) earlier_runs: Vec<String>,
    /// Runs of one process name that dumped at the same time (or of which
    /// nothing says when), each judged apart: the names they are judged
    /// under.
    pub(crate) runs_at_once: Vec<Vec<String>>,
}

impl Outcome {
    /// What to say of the runs: those left out, those judged apart.
    pub(crate) fn run_notes(&self) -> Vec<String> {
        self.earlier_runs_note()
            .into_iter()
            .chain(self.runs_at_once_note())
            .collect()
    }

    /// What to say of `earlier_runs`, when there were any.
    fn earlier_runs_note(&self) -> Option<String> {
        let runs = &self.earlier_runs;
        let first = runs.first()?;
        let who = match runs.len() {
            1 => first.clone(),
            n => format!("{first} and {} other processes", n - 1),
        };
        Some(format!(
            "{who} had files from more than one run (another process id, machine or folder \
             under the same name, or dumps before a pause far longer than their spacing): each \
             is judged on its latest run, the earlier ones left out"
        ))
    }

    /// What to say of `runs_at_once`, when there were any.
    fn runs_at_once_note(&self) -> Option<String> {
        let first = self.runs_at_once.first()?;
        let more = match self.runs_at_once.len() {
            1 => String::new(),
            n => format!(" (and {} other processes alike)", n - 1),
        };
        Some(format!(
            "{} are runs under one name that ran at the same time, or of which nothing says \
             when{more}: each is judged on its own files",
            first.join(" and ")
        ))
    }
}

/// The files of one process name, by the run they are from (see
/// [`snapdiff_runs::Run`]): two runs of one job under one name (another
/// process id, machine, capture run, or sibling folder) are never one
/// series.
#[derive(Default)]
struct Runs(Vec<(Run, ProcessRows)>);

impl Runs {
    fn add(&mut self, run: Run, rows: ProcessRows) {
        match self.0.iter_mut().find(|(r, _)| *r == run) {
            Some((_, into)) => into.append(rows),
            None => self.0.push((run, rows)),
        }
    }

    /// The runs to judge (see [`snapdiff_runs::choose`]; runs of one
    /// folder apart where their dumps pause far longer than their spacing),
    /// each under a
    /// name that tells it apart when there are several (`rank0@pid812`),
    /// and whether earlier runs were left out.
    fn into_judged(self) -> (Vec<ProcessRows>, bool) {
        let mut runs = self.0;
        let each: Vec<&Run> = runs.iter().map(|(run, _)| run).collect();
        let dumps: Vec<usize> = runs.iter().map(|(_, rows)| dumps_of(rows)).collect();
        if snapdiff_runs::folder_steps_are_one_run(&each, &dumps) {
            let (_, mut one) = runs.remove(0);
            for (_, rows) in runs {
                one.append(rows);
            }
            runs = vec![(Run::default(), one)];
        }
        let runs: Vec<(Run, ProcessRows)> = runs
            .into_iter()
            .flat_map(|(run, rows)| apart_at_pauses(run, rows))
            .collect();
        let spans: Vec<Span> = runs
            .iter()
            .map(|(_, rows)| {
                let mut span = Span::default();
                for c in rows.devices.iter().flat_map(|d| &d.checkpoints) {
                    span.add(c.time_us, c.step);
                }
                span
            })
            .collect();
        let choice = snapdiff_runs::choose(&spans);
        let mut runs: Vec<_> = runs.into_iter().map(Some).collect();
        let mut judged: Vec<(Run, ProcessRows)> = choice
            .judged
            .iter()
            .filter_map(|&i| runs[i].take())
            .collect();
        if judged.len() > 1 {
            let names = snapdiff_runs::names_apart(
                &judged[0].1.process,
                &judged.iter().map(|(run, _)| run).collect::<Vec<_>>(),
            );
            for ((_, rows), name) in judged.iter_mut().zip(names) {
                rows.process = name;
            }
        }
        let left_out = !choice.left_out.is_empty();
        (judged.into_iter().map(|(_, rows)| rows).collect(), left_out)
    }
}

/// The rows of `run`, one folder's run as far as anything says, as the runs
/// they hold where their times pause far longer than their spacing (see
/// [`snapdiff_runs::time_jumps`]); a run told by its process is one.
fn apart_at_pauses(run: Run, mut rows: ProcessRows) -> Vec<(Run, ProcessRows)> {
    let times: Option<Vec<i64>> = (rows.devices.iter())
        .flat_map(|d| &d.checkpoints)
        .map(|c| c.time_us)
        .collect();
    let Some(mut times) = times.filter(|_| run.pid.is_none()) else {
        return vec![(run, rows)];
    };
    times.sort_unstable();
    times.dedup();
    let mut parts = Vec::new();
    for &at in snapdiff_runs::time_jumps(&times).iter().rev() {
        let later = rows.split_off_from(times[at]);
        let since_us = Some(times[at]);
        parts.push((
            Run {
                since_us,
                ..run.clone()
            },
            later,
        ));
    }
    parts.push((run, rows));
    parts.reverse();
    parts
}

/// The dumps a process's rows were read from: its most checkpoints on one
/// device.
fn dumps_of(rows: &ProcessRows) -> usize {
    rows.devices
        .iter()
        .map(|d| d.checkpoints.len())
        .max()
        .unwrap_or(0)
}

/// Reads the files of `census` on the current rayon pool and hands each
/// process's rows to `done` once all its files are read. A thread of its
/// own walks the folders again ([`Census::stream`]) and hands on each
/// process's files as soon as all are found; the pool reads them, each
/// process's files in turn on one thread. Files whose names say no
/// process are told apart after reading (manifest, recorded process id)
/// and handed on at the end.
///
/// With `trace` (how to cut a trace), a process (a run) that left one file
/// is read by its trace, cut into checkpoints as `trend` cuts it, where
/// that trace records allocations; else, and without `trace` (site tables
/// hold one checkpoint a dump), by its one dump.
pub(crate) fn read_processes(
    census: Census,
    stacks: &StackStore,
    trace: Option<&TrendOptions>,
    done: impl Fn(ProcessRows) + Sync,
) -> Outcome {
    let progress = Progress::new(census.files, census.bytes);
    let only = census.only().map(str::to_owned);
    let only = only.as_deref();
    let reader = FileReader {
        manifests: Manifests::default(),
        outcome: Mutex::new(Outcome::default()),
        progress: &progress,
        stacks,
        trace,
    };
    let unnamed: Mutex<BTreeMap<String, Runs>> = Mutex::new(BTreeMap::new());
    let hand_on = |runs: Runs| {
        let (judged, left_out) = runs.into_judged();
        let mut outcome = reader.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if left_out && let Some(rows) = judged.first() {
            let name = rows
                .process
                .split_once('@')
                .map_or(&*rows.process, |(n, _)| n);
            outcome.earlier_runs.push(name.to_owned());
        }
        if judged.len() > 1 {
            outcome
                .runs_at_once
                .push(judged.iter().map(|r| r.process.clone()).collect());
        }
        drop(outcome);
        for rows in judged.into_iter().filter(|r| r.checkpoint_count() > 0) {
            done(reader.by_trace(rows));
        }
    };
    let read_group = |(name, files): (String, Vec<PathBuf>)| {
        if name.is_empty() {
            files.par_iter().for_each(|path| {
                reader.read(path, None, only, false, |one, run| {
                    let mut unnamed = unnamed.lock().unwrap_or_else(|e| e.into_inner());
                    unnamed
                        .entry(one.process.clone())
                        .or_default()
                        .add(run, one);
                });
            });
        } else {
            let mut runs = Runs::default();
            let whole = files.len() == 1;
            for path in &files {
                reader.read(path, Some(&name), only, whole, |one, run| {
                    runs.add(run, one);
                });
            }
            hand_on(runs);
        }
        // Each process's paths are dropped here, once read.
    };
    // A few groups found ahead of the readers, no more: the walk waits.
    let (found, groups) = std::sync::mpsc::sync_channel(2 * rayon::current_num_threads());
    let walk_failed = std::thread::scope(|scope| {
        let walker = scope.spawn(move || {
            census.stream(|name, files| {
                // Read from the disk while the groups before it are.
                files.iter().for_each(|f| snapdiff_format::prefetch(f));
                // Fails only when the readers stopped (a panic), which
                // the scope passes on.
                let _ = found.send((name, files));
            })
        });
        groups.into_iter().par_bridge().for_each(read_group);
        walker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    for (_, runs) in unnamed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        hand_on(runs);
    }
    progress.finish();
    let mut outcome = reader
        .outcome
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    outcome.unreadable.extend(walk_failed);
    outcome.unreadable.sort_by(|a, b| a.source.cmp(&b.source));
    outcome.earlier_runs.sort();
    outcome
}

/// What every reading thread shares.
struct FileReader<'a> {
    manifests: Manifests,
    outcome: Mutex<Outcome>,
    progress: &'a Progress,
    stacks: &'a StackStore,
    /// How to cut the trace of a process's one file, when it is judged so.
    trace: Option<&'a TrendOptions>,
}

impl FileReader<'_> {
    /// Reads `path` and hands its rows, as one process's (`process`, else
    /// as the manifest or the snapshot says), to `add`, unless `only` wants
    /// another process; `whole`: the process's only file, its rows cut
    /// from its trace where it can be (see [`read_processes`]). The
    /// snapshot is dropped before this returns.
    fn read(
        &self,
        path: &PathBuf,
        process: Option<&str>,
        only: Option<&str>,
        whole: bool,
        add: impl FnOnce(ProcessRows, Run),
    ) {
        let len = std::fs::metadata(path).map_or(0, |m| m.len());
        let whole = whole && self.trace.is_some();
        let result = crate::input::read_quietly(path, whole);
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
            || snapdiff_runs::process_of(path, &snap, writer.as_deref()),
            str::to_owned,
        );
        if wanted(&process, only) {
            let mut rows = ProcessRows::new(process);
            let source = path.to_string_lossy();
            let by_trace = (self.trace.filter(|_| whole)).is_some_and(|cut| {
                self.stacks
                    .add_trace(&mut rows, &source, &snap, cut)
                    .is_ok()
            });
            if !by_trace {
                let owners = crate::owners::by_site(path, &snap);
                (self.stacks).add_snapshot(&mut rows, &source, &snap, owners.as_ref());
            }
            add(rows, Run::of(&snap.meta, path));
        }
        drop(snap);
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        outcome.files += 1;
        outcome.bytes += len;
    }
}

impl FileReader<'_> {
    /// `rows` of a process, or of its one file read again and cut from its
    /// trace, where it left one file that was not read so (its name did
    /// not tell its process) and its trace records allocations.
    fn by_trace(&self, rows: ProcessRows) -> ProcessRows {
        let (Some(cut), Some(source)) = (self.trace, rows.one_dump()) else {
            return rows;
        };
        let source = source.to_owned();
        let Ok(snap) = crate::input::read_quietly(std::path::Path::new(&source), true) else {
            return rows;
        };
        let mut by_trace = ProcessRows::new(rows.process.clone());
        match self.stacks.add_trace(&mut by_trace, &source, &snap, cut) {
            Ok(()) => by_trace,
            Err(_) => rows,
        }
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
    /// A bar for `files` files of `bytes` bytes in all.
    fn new(files: usize, bytes: u64) -> Progress {
        use std::io::IsTerminal;
        let bar = (std::io::stderr().is_terminal() && files > 1).then(|| {
            let bar = indicatif::ProgressBar::new(bytes);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "reading {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_message(format!("0/{files} files"));
            bar
        });
        Progress {
            bar,
            files,
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

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
