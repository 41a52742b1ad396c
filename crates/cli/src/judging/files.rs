//! The verdict on the files of one process or of several, as `trend`,
//! `report`, `capture` and `demo` give it: the files read, told apart by
//! process and run (see `snapdiff_runs`), each run judged by the
//! analyzer's judge.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use snapdiff_analyze::baseline::{Baseline, Peaks};
use snapdiff_analyze::{NamedSnapshot, StackKeys, Trend, TrendOptions, judge_keyed_dumps};
use snapdiff_format::Snapshot;
use snapdiff_render::trend::process_name;

/// The verdict on each process (each run judged apart) whose files are
/// `files`, and whether some file could not be read (said on stderr).
/// Files are read a process at a time as their names tell processes
/// apart; files whose names do not are told apart after reading, by
/// manifest, recorded process id or folder.
pub(crate) fn judge_files(
    files: Vec<PathBuf>,
    options: &TrendOptions,
) -> anyhow::Result<(Vec<(String, Trend)>, bool)> {
    let mut trends = Vec::new();
    let mut errored = false;
    for (_, files) in snapdiff_runs::by_process(files) {
        let (read, e) = read_all(&files);
        errored |= e;
        for (process, snapshots) in split_by_process(read) {
            trends.push((process, judge(snapshots, options)?.0));
        }
    }
    Ok((trends, errored))
}

/// The verdict on `files`, one process's (capture has told processes apart
/// by their files' names already); `None` when none could be read.
pub(crate) fn judge_one_process(
    files: &[PathBuf],
    options: &TrendOptions,
) -> anyhow::Result<Option<Trend>> {
    let (read, _) = read_all(files);
    if read.is_empty() {
        return Ok(None);
    }
    let (trend, _) = judge(read.into_iter().map(|(r, _)| r).collect(), options)?;
    Ok(Some(trend))
}

/// The baseline of the run whose files are `files` (`snapdiff baseline`,
/// `snapdiff check`): each process's (see [`Baseline::of`]), then the
/// largest figure of each over the processes (a fleet's ranks), `None`
/// when no file could be read (each one's reason is said as it fails); and
/// whether some file could not be read. A process whose files give no
/// trend (one file without a trace) still gives its peak and sites.
pub(crate) fn baseline_of(files: Vec<PathBuf>, options: &TrendOptions) -> (Option<Baseline>, bool) {
    let mut each = Vec::new();
    let mut errored = false;
    for (_, files) in snapdiff_runs::by_process(files) {
        let (read, e) = read_all(&files);
        errored |= e;
        for (_, read) in split_by_process(read) {
            // The stack keys serve both; then the verdict and the peaks, each
            // a replay of the traces, side by side.
            let keys: Vec<StackKeys> = read
                .par_iter()
                .map(|r| StackKeys::new(&r.snapshot))
                .collect();
            let (trend, peaks) = rayon::join(
                || judged(&read, &keys, options).ok().map(|j| j.trend),
                || {
                    let snapshots = read.iter().map(|r| &r.snapshot);
                    Peaks::of_keyed(snapshots.zip(&keys), &options.rules)
                },
            );
            each.push(Baseline::with_trend(peaks, trend.as_ref()));
        }
    }
    ((!each.is_empty()).then(|| Baseline::largest(each)), errored)
}

/// The analyzer's judge on one process's snapshots, the owners files
/// beside them read when it asks; `keys`, where not empty, their stack
/// keys.
fn judged(
    read: &[Read<'_>],
    keys: &[StackKeys],
    options: &TrendOptions,
) -> Result<snapdiff_analyze::Judged, snapdiff_analyze::TraceError> {
    let names: Vec<String> = read
        .iter()
        .map(|r| {
            r.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect();
    let dumps: Vec<NamedSnapshot<'_>> = names
        .iter()
        .zip(read)
        .map(|(name, r)| NamedSnapshot {
            name,
            snapshot: &r.snapshot,
        })
        .collect();
    judge_keyed_dumps(
        &dumps,
        keys,
        |i| snapdiff_format::read_owners_beside(read[i].path),
        options,
    )
}

/// One process's trend, for the report.
pub(crate) struct ProcessTrend {
    /// The process, as `trend` names it.
    pub(crate) process: String,
    pub(crate) trend: Trend,
    /// Its last snapshot in order (exit dumps left out).
    pub(crate) last: PathBuf,
}

/// The trend of each process whose files are among `files`, for the
/// report. A process whose files have no trend (one file without a trace)
/// is left out.
pub(crate) fn trends_of(files: &[PathBuf], options: &TrendOptions) -> Vec<ProcessTrend> {
    let (read, _) = read_all(files);
    split_by_process(read)
        .into_iter()
        .filter_map(|(process, read)| {
            let (trend, last) = judge(read, options).ok()?;
            let process = process_name(&process).into_owned();
            Some(ProcessTrend {
                process,
                trend,
                last,
            })
        })
        .collect()
}

/// A snapshot read, with its path.
struct Read<'a> {
    path: &'a Path,
    snapshot: Snapshot,
    /// On one file of a process: how many earlier runs of it were left out.
    earlier_runs: usize,
}

/// Reads `files` in parallel, with what their manifests say of them, each
/// paired with the process that wrote it. An unreadable file is reported on
/// stderr and left out (the flag says so).
fn read_all(files: &[PathBuf]) -> (Vec<(Read<'_>, String)>, bool) {
    // One file may take two threads; several take one each.
    let alone = files.len() == 1;
    let read = move |p| {
        if alone {
            crate::input::read(p)
        } else {
            crate::input::read_beside(p, snapdiff_format::Parts::All)
        }
    };
    // One file is read on this thread: a thread of its own would only add
    // its start, and hand the memory its reading freed (the decompressed
    // bytes) back to the system on exit, for the analysis to fault in again.
    let results: Vec<_> = if alone {
        files.iter().map(|p| read(p)).collect()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = files.iter().map(|p| s.spawn(move || read(p))).collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("reader thread"))
                .collect()
        })
    };
    let mut errored = false;
    let mut read = Vec::new();
    for (r, path) in results.into_iter().zip(files) {
        match r {
            Ok(s) => read.push((path, s)),
            Err(e) => {
                eprintln!(
                    "snapdiff: {}",
                    snapdiff_format::visible::escaped(&e.to_string())
                );
                errored = true;
            }
        }
    }
    let writers = snapdiff_runs::manifest::describe(&mut read);
    let read = read
        .into_iter()
        .zip(writers)
        .map(|((path, snapshot), writer)| {
            let process = snapdiff_runs::process_of(path, &snapshot, writer.as_deref());
            let read = Read {
                path,
                snapshot,
                earlier_runs: 0,
            };
            (read, process)
        })
        .collect();
    (read, errored)
}

/// Snapshots grouped by the process that wrote them, each process's runs
/// to judge (see [`runs_to_judge`]).
fn split_by_process(read: Vec<(Read<'_>, String)>) -> Vec<(String, Vec<Read<'_>>)> {
    snapdiff_runs::group(read.into_iter().map(|(r, process)| (process, r)))
        .into_iter()
        .flat_map(|(process, reads)| runs_to_judge(process, reads))
        .collect()
}

/// The runs of one process name to judge, as `fleet` judges them (see
/// [`snapdiff_runs::Run`]): two runs of one job under one name (another
/// process id, machine, capture run, or sibling folder) are never one
/// series. The latest run is judged with every run that dumped while it
/// did, or of which nothing says when, each under a name that tells it
/// apart (`rank0@pid812`, `rank1@runA`); the note of the earlier ones
/// left out is on the first file of each run judged.
fn runs_to_judge(process: String, reads: Vec<Read<'_>>) -> Vec<(String, Vec<Read<'_>>)> {
    let mut runs: Vec<(snapdiff_runs::Run, Vec<Read<'_>>)> = Vec::new();
    for r in reads {
        let run = snapdiff_runs::Run::of(&r.snapshot.meta, r.path);
        match runs.iter_mut().find(|(k, _)| *k == run) {
            Some((_, members)) => members.push(r),
            None => runs.push((run, vec![r])),
        }
    }
    let each: Vec<&snapdiff_runs::Run> = runs.iter().map(|(run, _)| run).collect();
    let dumps: Vec<usize> = runs.iter().map(|(_, reads)| reads.len()).collect();
    if snapdiff_runs::folder_steps_are_one_run(&each, &dumps) {
        let reads = runs.into_iter().flat_map(|(_, reads)| reads).collect();
        runs = vec![(snapdiff_runs::Run::default(), reads)];
    }
    let runs: Vec<(snapdiff_runs::Run, Vec<Read<'_>>)> = runs
        .into_iter()
        .flat_map(|(run, reads)| apart_at_pauses(run, reads))
        .collect();
    let spans: Vec<snapdiff_runs::Span> = runs
        .iter()
        .map(|(_, reads)| {
            let mut span = snapdiff_runs::Span::default();
            for r in reads {
                span.add(r.snapshot.meta.created_us, r.snapshot.meta.step);
            }
            span
        })
        .collect();
    let choice = snapdiff_runs::choose(&spans);
    let mut runs: Vec<_> = runs.into_iter().map(Some).collect();
    let mut judged: Vec<(snapdiff_runs::Run, Vec<Read<'_>>)> = choice
        .judged
        .iter()
        .filter_map(|&i| runs[i].take())
        .collect();
    for (_, reads) in &mut judged {
        reads[0].earlier_runs = choice.left_out.len();
    }
    let names = if judged.len() > 1 {
        let each: Vec<&snapdiff_runs::Run> = judged.iter().map(|(run, _)| run).collect();
        snapdiff_runs::names_apart(&process, &each)
    } else {
        vec![process]
    };
    names
        .into_iter()
        .zip(judged.into_iter().map(|(_, reads)| reads))
        .collect()
}

/// The dumps of `run`, one folder's run as far as anything says, as the
/// runs they hold where their times pause far longer than their spacing
/// (see [`snapdiff_runs::time_jumps`]); a run told by its process is one.
fn apart_at_pauses(
    run: snapdiff_runs::Run,
    mut reads: Vec<Read<'_>>,
) -> Vec<(snapdiff_runs::Run, Vec<Read<'_>>)> {
    let times: Option<Vec<i64>> = reads.iter().map(|r| r.snapshot.meta.created_us).collect();
    let Some(mut times) = times.filter(|_| run.pid.is_none()) else {
        return vec![(run, reads)];
    };
    reads.sort_by_key(|r| r.snapshot.meta.created_us);
    times.sort_unstable();
    let jumps = snapdiff_runs::time_jumps(&times);
    if jumps.is_empty() {
        return vec![(run, reads)];
    }
    let mut parts = Vec::new();
    for &at in jumps.iter().rev() {
        let later = reads.split_off(at);
        let since_us = Some(times[at]);
        parts.push((
            snapdiff_runs::Run {
                since_us,
                ..run.clone()
            },
            later,
        ));
    }
    parts.push((run, reads));
    parts.reverse();
    parts
}

/// Analyses the snapshots of one process with the analyzer's judge, the
/// owners files beside them read when it asks; with its last snapshot in
/// order (exit dumps left out).
fn judge(read: Vec<Read<'_>>, options: &TrendOptions) -> anyhow::Result<(Trend, PathBuf)> {
    let earlier_runs: usize = read.iter().map(|r| r.earlier_runs).sum();
    let judged = judged(&read, &[], options);
    let judged = judged.map_err(|e| anyhow::anyhow!("{}: {e}", read[0].path.display()))?;
    let last = read[judged.last().unwrap_or(0)].path.to_path_buf();
    let mut trend = judged.trend;
    if earlier_runs > 0 {
        trend.notes.push(format!(
            "files of {} earlier run{} of this process (another process id, machine or folder, or \
             dumps before a pause far longer than their spacing) left out: only its latest run is \
             judged",
            earlier_runs,
            if earlier_runs == 1 { "" } else { "s" }
        ));
    }
    crate::input::release(read.into_iter().map(|r| r.snapshot).collect::<Vec<_>>());
    Ok((trend, last))
}
