//! `snapdiff fleet PATH...`: one verdict for a whole job of many ranks.

mod inputs;
mod read;

use snapdiff_format::DeviceName;
use std::io::Write;
use std::sync::Mutex;

use snapdiff_analyze::TrendOptions;
use snapdiff_fleet::{
    Fleet, FleetOptions, ProcessRows, ProcessVerdict, StackStore, Unreadable, fleet_verdict, judge,
    read_tables,
};
use snapdiff_render::text::size;

use crate::args::{FleetArgs, ThreadArgs};
use crate::exit::Exit;
pub(crate) use inputs::{census, with_paths_from};
pub(crate) use read::read_processes;

/// The top-level entry point for `snapdiff fleet`.
pub(crate) fn run(args: FleetArgs) -> anyhow::Result<Exit> {
    let trend = args.judge.trend(&args.report)?;
    let paths = inputs::with_paths_from(&args.paths, args.paths_from.as_deref())?;
    // The text verdict of the job needs less of each rank than its JSON
    // row or its own report: what it does not need is dropped as each rank
    // is judged, so that memory barely grows with the number of ranks.
    let slim = !args.report.json && args.rank.is_none();
    let judged = judge_paths(&paths, args.rank.as_deref(), trend, &args.threads, slim)?;
    let exit = exit_code(&judged.verdicts, &judged.unreadable, args.judge.max_growth);
    if args.rank.is_some() {
        if let Some(note) = &judged.runs_note {
            eprintln!("snapdiff: note: {note}");
        }
        print_rank(&judged.verdicts, &args)?;
        return Ok(exit);
    }
    let mut fleet = judged.into_fleet();
    if args.report.json {
        // A row a rank: written one at a time (10,000 ranks' rows as one
        // tree took 200 MB).
        let members = std::mem::take(&mut fleet.members);
        crate::output::print_json_with_list(&fleet, "members", members, args.report.top)?;
    } else {
        snapdiff_render::fleet::write_text(
            &fleet,
            &args.report.text(),
            &mut crate::output::text_out(),
        )?;
    }
    Ok(exit)
}

/// Every rank of a job judged, and what reading it came to.
pub(crate) struct Judged {
    /// Each rank's verdict.
    pub(crate) verdicts: Vec<ProcessVerdict>,
    /// Files and folders that could not be read, in path order.
    pub(crate) unreadable: Vec<Unreadable>,
    files: usize,
    bytes: u64,
    runs_note: Option<String>,
    stacks: StackStore,
    options: FleetOptions,
}

impl Judged {
    /// The job's verdict (see `fleet_verdict`).
    pub(crate) fn into_fleet(self) -> Fleet {
        let stacks = self.stacks.into_inner();
        let mut fleet = fleet_verdict(
            self.verdicts,
            &stacks,
            &self.options,
            self.unreadable,
            self.files,
            self.bytes,
        );
        fleet.notes.extend(self.runs_note);
        fleet
    }
}

/// Reads the snapshots and site tables `paths` name (`only`: one rank's)
/// on the pool `threads` asks for, and judges each rank as it is read;
/// `slim` keeps of each only what the text verdict needs. Unreadable
/// files are said on stderr here, and kept.
pub(crate) fn judge_paths(
    paths: &[std::path::PathBuf],
    only: Option<&str>,
    trend: TrendOptions,
    threads: &ThreadArgs,
    slim: bool,
) -> anyhow::Result<Judged> {
    let mut options = FleetOptions::default();
    options.trend = trend;
    let mut census = census(paths, only, None)?;
    let table_folders = std::mem::take(&mut census.table_folders);
    let found_unreadable = std::mem::take(&mut census.unreadable);
    let stacks = StackStore::new();
    let verdicts = Mutex::new(Vec::with_capacity(census.named_processes()));
    let keep = |rows| {
        let mut verdict = judge(rows, &stacks.read(), &options.trend);
        if slim {
            verdict.keep_for_verdict();
        }
        verdicts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(verdict);
    };
    let (mut unreadable, files, bytes, runs_note) = in_pool(threads, || {
        let unreadable = read_table_folders(&table_folders, only, &stacks, keep);
        let outcome = read_processes(census, &stacks, keep);
        let note = outcome.earlier_runs_note();
        let mut all = unreadable;
        all.extend(outcome.unreadable);
        all.extend(found_unreadable);
        (all, outcome.files, outcome.bytes, note)
    })?;
    unreadable.sort_by(|a, b| a.source.cmp(&b.source));
    let verdicts = verdicts.into_inner().unwrap_or_else(|e| e.into_inner());
    for u in &unreadable {
        eprintln!("snapdiff: {}", u.error);
    }
    if verdicts.is_empty() {
        anyhow::bail!(match only {
            Some(r) => format!("no snapshot of rank {r} could be read"),
            None => "no snapshot could be read".to_owned(),
        });
    }
    Ok(Judged {
        verdicts,
        unreadable,
        files,
        bytes,
        runs_note,
        stacks,
        options,
    })
}

/// Runs `work` on a rayon pool of `threads` threads (all cores by default).
pub(crate) fn in_pool<T: Send>(
    threads: &ThreadArgs,
    work: impl FnOnce() -> T + Send,
) -> anyhow::Result<T> {
    let mut pool = rayon::ThreadPoolBuilder::new();
    if let Some(n) = threads.threads {
        pool = pool.num_threads(usize::from(n));
    }
    Ok(pool.build()?.install(work))
}

/// Reads each site-table folder and hands each process's rows to `done`;
/// a folder that cannot be read is returned, named, and the rest go on.
pub(crate) fn read_table_folders(
    folders: &[std::path::PathBuf],
    only: Option<&str>,
    stacks: &StackStore,
    done: impl Fn(ProcessRows),
) -> Vec<Unreadable> {
    let mut unreadable = Vec::new();
    for folder in folders {
        let read = read_tables(folder, &mut stacks.write());
        match read {
            Ok(processes) => {
                for rows in processes {
                    if read::wanted(&rows.process, only) {
                        done(rows);
                    }
                }
            }
            Err(e) => unreadable.push(Unreadable {
                source: folder.to_string_lossy().into_owned(),
                error: snapdiff_format::visible::escaped(&e.to_string()).into_owned(),
            }),
        }
    }
    unreadable
}

/// 2 when files could not be read (the verdict rests on part of the job),
/// else 3 when no rank had checkpoints enough to judge, else 1 when a
/// rank's suspected growth exceeds `max_growth`, else 0.
pub(crate) fn exit_code(
    verdicts: &[ProcessVerdict],
    unreadable: &[Unreadable],
    max_growth: Option<u64>,
) -> Exit {
    if !unreadable.is_empty() {
        return Exit::Error;
    }
    let judged = |v: &ProcessVerdict| v.devices.iter().any(|d| d.trend.no_verdict.is_none());
    if !verdicts.iter().any(judged) {
        return Exit::NoVerdict;
    }
    let Some(limit) = max_growth else {
        return Exit::Clean;
    };
    let over: Vec<String> = verdicts
        .iter()
        .flat_map(|v| v.devices.iter().map(move |d| (v, d)))
        .filter(|(_, d)| d.trend.suspected_bytes > limit)
        .map(|(v, d)| {
            format!(
                "{} {}: {}",
                v.process,
                DeviceName(d.device),
                size(d.trend.suspected_bytes)
            )
        })
        .collect();
    if over.is_empty() {
        return Exit::Clean;
    }
    let shown: Vec<&str> = over.iter().take(5).map(String::as_str).collect();
    eprintln!(
        "snapdiff: suspected growth over the {} limit (--max-growth) in {} rank{}: {}{}",
        size(limit),
        over.len(),
        if over.len() == 1 { "" } else { "s" },
        shown.join("; "),
        if over.len() > 5 { "; ..." } else { "" }
    );
    Exit::OverThreshold
}

/// `--rank R`: that rank's full trend report, device by device.
fn print_rank(verdicts: &[ProcessVerdict], args: &FleetArgs) -> anyhow::Result<()> {
    if args.report.json {
        let rows: Vec<serde_json::Value> = verdicts
            .iter()
            .flat_map(|v| {
                v.devices.iter().map(|d| {
                    serde_json::json!({ "process": v.process, "device": d.device, "trend": d.trend })
                })
            })
            .collect();
        crate::output::print_json(&serde_json::json!({ "devices": rows }), args.report.top)?;
        return Ok(());
    }
    let mut out = crate::output::text_out();
    for v in verdicts {
        for d in &v.devices {
            if v.devices.len() > 1 || verdicts.len() > 1 {
                writeln!(out, "{} {}:", v.process, DeviceName(d.device))?;
            }
            snapdiff_render::trend::write_text(&d.trend, &args.report.text(), &mut out)?;
        }
    }
    Ok(())
}
