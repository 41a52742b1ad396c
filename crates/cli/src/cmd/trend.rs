//! `snapdiff trend FILE...`.

use std::io::Write;
use std::path::PathBuf;

use snapdiff_analyze::{NamedSnapshot, Trend, TrendOptions, judge_dumps};
use snapdiff_format::Snapshot;

use crate::args::{ReportArgs, TrendArgs};
use crate::exit::Exit;
use snapdiff_render::trend::{per_process_json, process_name, write_per_process, write_text};

/// The top-level entry point for `snapdiff trend`.
pub(crate) fn run(args: TrendArgs) -> anyhow::Result<Exit> {
    let mut options = TrendOptions::default();
    options.rules = args.report.rules()?;
    options.warmup = args.warmup;
    if let Some(n) = args.checkpoints {
        // A number the user asked for limits every way of cutting.
        options.checkpoints = n;
        options.limit_all = true;
    }
    options.cut = args.cut.map(crate::args::Cut::source);
    options.device_memory = args.device_memory;
    let files = crate::input::snapshot_files(&args.files)?;
    // Files are read a process at a time as their names tell processes
    // apart; files whose names do not are told apart after reading, by
    // manifest or recorded process id.
    let mut trends = Vec::new();
    let mut errored = false;
    for (_, files) in snapdiff_runs::by_process(files) {
        let (read, e) = read_all(&files);
        errored |= e;
        for (process, snapshots) in split_by_process(read) {
            trends.push((process, judge(snapshots, &options)?.0));
        }
    }
    match trends.len() {
        0 => Ok(Exit::Error),
        1 => print_one(&trends[0].1, errored, &args),
        _ => print_per_process(&trends, errored, &args),
    }
}

/// The report of one series of snapshots (or one trace).
fn print_one(trend: &Trend, errored: bool, args: &TrendArgs) -> anyhow::Result<Exit> {
    let over = args.max_growth.and_then(|limit| limit.over(trend));
    let exit = match over {
        _ if errored => Exit::Error,
        Some(over) => {
            eprintln!(
                "snapdiff: {} of suspected growth, over the {} limit (--max-growth)",
                over.limit.amount(over.kept),
                over.limit
            );
            Exit::OverThreshold
        }
        None => Exit::Clean,
    };
    if args.report.json {
        /// The trend, with the limit's verdict when one was given.
        #[derive(serde::Serialize)]
        struct Judged<'a> {
            #[serde(flatten)]
            trend: &'a Trend,
            #[serde(skip_serializing_if = "Option::is_none")]
            limit: Option<snapdiff_analyze::Gate>,
        }
        let limit = args.max_growth.map(|limit| limit.gate(trend));
        crate::output::print_json(&Judged { trend, limit }, args.report.top)?;
    } else {
        write_text(trend, &args.report.text(), &mut crate::output::text_out())?;
    }
    Ok(exit)
}

/// The reports of several processes (ranks), each judged on its own; a rank
/// that grows while others do not is said.
fn print_per_process(
    trends: &[(String, Trend)],
    errored: bool,
    args: &TrendArgs,
) -> anyhow::Result<Exit> {
    let over: Vec<String> = trends
        .iter()
        .filter_map(|(p, t)| {
            let over = args.max_growth?.over(t)?;
            Some(format!(
                "{}: {}",
                process_name(p),
                over.limit.amount(over.kept)
            ))
        })
        .collect();
    if let (false, Some(limit)) = (over.is_empty(), args.max_growth) {
        eprintln!(
            "snapdiff: suspected growth over the {limit} limit (--max-growth) in {}",
            over.join("; ")
        );
    }
    let exit = if errored {
        Exit::Error
    } else if !over.is_empty() {
        Exit::OverThreshold
    } else {
        Exit::Clean
    };
    if args.report.json {
        crate::output::print_json(&per_process_json(trends), args.report.top)?;
    } else {
        write_per_process(trends, &args.report.text(), &mut crate::output::text_out())?;
    }
    Ok(exit)
}

/// The trend report of `files` with default options, as `capture` and `demo`
/// show it (capture has told processes apart by their files' names already).
/// Returns the verdict, or `None` when no file could be read.
pub(crate) fn report(
    files: &[PathBuf],
    report: &ReportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<Option<Trend>> {
    let mut options = TrendOptions::default();
    options.rules = report.rules()?;
    let (read, _) = read_all(files);
    if read.is_empty() {
        return Ok(None);
    }
    let (trend, _) = judge(read.into_iter().map(|(r, _)| r).collect(), &options)?;
    if report.json {
        snapdiff_render::json::write(out, &trend, report.top)?;
    } else {
        write_text(&trend, &report.text(), out)?;
    }
    Ok(Some(trend))
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
    path: &'a PathBuf,
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
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = files.iter().map(|p| s.spawn(move || read(p))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread"))
            .collect()
    });
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
        return vec![(process, reads)];
    }
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

/// Analyses the snapshots of one process with the analyzer's judge, the
/// owners files beside them read when it asks; with its last snapshot in
/// order (exit dumps left out).
fn judge(read: Vec<Read<'_>>, options: &TrendOptions) -> anyhow::Result<(Trend, PathBuf)> {
    let names: Vec<String> = read
        .iter()
        .map(|r| {
            r.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect();
    let earlier_runs: usize = read.iter().map(|r| r.earlier_runs).sum();
    let dumps: Vec<NamedSnapshot<'_>> = names
        .iter()
        .zip(&read)
        .map(|(name, r)| NamedSnapshot {
            name,
            snapshot: &r.snapshot,
        })
        .collect();
    let judged = judge_dumps(
        &dumps,
        |i| snapdiff_format::read_owners_beside(read[i].path),
        options,
    );
    let judged = judged.map_err(|e| anyhow::anyhow!("{}: {e}", read[0].path.display()))?;
    let last = read[judged.last().unwrap_or(0)].path.clone();
    let mut trend = judged.trend;
    if earlier_runs > 0 {
        trend.notes.push(format!(
            "files of {} earlier run{} of this process (another process id or machine) left out: \
             only its latest run is judged",
            earlier_runs,
            if earlier_runs == 1 { "" } else { "s" }
        ));
    }
    crate::input::release(read.into_iter().map(|r| r.snapshot).collect::<Vec<_>>());
    Ok((trend, last))
}
