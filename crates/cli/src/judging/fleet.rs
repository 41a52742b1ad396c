//! The verdict on a job of many ranks, as `fleet`, `report --fleet`,
//! `watch` and `export` read it: the files walked (see
//! `snapdiff_runs::census`), each rank read into rows as soon as its files
//! are found ([`ranks`](super::ranks)), judged, and brought into one
//! verdict; and the exit code it gives.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use snapdiff_analyze::{Limit, Over, TrendOptions};
use snapdiff_fleet::{
    Fleet, FleetOptions, FleetTally, Member, ProcessRows, ProcessVerdict, Rows, StackStore, Stacks,
    Unreadable, judge, read_tables,
};
use snapdiff_format::DeviceName;
use snapdiff_runs::census;

use crate::args::ThreadArgs;
use crate::exit::Exit;
use crate::judging::ranks::read_processes;

/// What reading a job came to, besides its ranks' verdicts.
pub(crate) struct Read {
    /// Files and folders that could not be read, in path order.
    pub(crate) unreadable: Vec<Unreadable>,
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    pub(crate) run_notes: Vec<String>,
    pub(crate) stacks: StackStore,
}

/// Reads the snapshots and site tables `paths` name (`only`: one rank's)
/// on the pool `threads` asks for, judges each rank as it is read and
/// hands its verdict to `judged` with the stacks its sites are named
/// from. Unreadable files are said on stderr here, and kept.
pub(crate) fn read_judging(
    paths: &[std::path::PathBuf],
    only: Option<&str>,
    trend: &TrendOptions,
    threads: &ThreadArgs,
    judged: impl Fn(ProcessVerdict, &Stacks) + Sync,
) -> anyhow::Result<Read> {
    let mut census = census(paths, only, None)?;
    let table_folders = std::mem::take(&mut census.table_folders);
    let found_unreadable = std::mem::take(&mut census.unreadable);
    let stacks = StackStore::new();
    let ranks = AtomicUsize::new(0);
    let keep = |rows| {
        let stacks = stacks.read();
        judged(judge(rows, &stacks, trend), &stacks);
        ranks.fetch_add(1, Ordering::Relaxed);
    };
    let (mut unreadable, files, bytes, run_notes) = in_pool(threads, || {
        let unreadable = read_table_folders(&table_folders, only, &stacks, keep);
        let outcome = read_processes(census, &stacks, Some(trend), keep);
        let notes = outcome.run_notes();
        let mut all = unreadable;
        all.extend(outcome.unreadable);
        all.extend(found_unreadable);
        (all, outcome.files, outcome.bytes, notes)
    })?;
    unreadable.sort_by(|a, b| a.source.cmp(&b.source));
    for u in &unreadable {
        eprintln!("snapdiff: {}", u.error);
    }
    if ranks.into_inner() == 0 {
        anyhow::bail!(match only {
            Some(r) => format!("no snapshot of rank {r} could be read"),
            None => "no snapshot could be read".to_owned(),
        });
    }
    Ok(Read {
        unreadable,
        files,
        bytes,
        run_notes,
        stacks,
    })
}

/// Every rank of the job `paths` name judged, and brought into the job's
/// verdict as it is (keeping `rows`), with what the exit code rests on
/// (`max_growth`: `--max-growth`).
pub(crate) fn judge_fleet(
    paths: &[std::path::PathBuf],
    trend: TrendOptions,
    threads: &ThreadArgs,
    rows: Rows,
    max_growth: Option<Limit>,
) -> anyhow::Result<(Fleet, ExitFacts)> {
    let mut options = FleetOptions::default();
    options.trend = trend;
    let facts = ExitFacts::new(max_growth);
    let tally = Mutex::new((FleetTally::new(options.clone(), rows), facts));
    let read = read_judging(paths, None, &options.trend, threads, |verdict, stacks| {
        let mut tally = tally.lock().unwrap_or_else(|e| e.into_inner());
        tally.1.add(&verdict);
        tally.0.add(verdict, stacks);
    })?;
    let (tally, facts) = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    let stacks = read.stacks.into_inner();
    let mut fleet = tally.finish(&stacks, read.unreadable, read.files, read.bytes);
    fleet.notes.extend(read.run_notes);
    Ok((fleet, facts))
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
    // The Parquet reader's buffers, freed a batch at a time, would
    // otherwise linger for mimalloc's purge delay, more of them the busier
    // the machine: 100,000 ranks' tables peaked at 29 MiB or 49 MiB.
    let _at_once = crate::input::ReturnAtOnce::new();
    for folder in folders {
        let read = read_tables(folder, stacks, |rows| {
            if snapdiff_runs::wanted(&rows.process, only) {
                done(rows);
            }
        });
        if let Err(e) = read {
            unreadable.push(Unreadable {
                source: folder.to_string_lossy().into_owned(),
                error: snapdiff_format::visible::escaped(&e.to_string()).into_owned(),
            });
        }
    }
    unreadable
}

/// What the exit code rests on, gathered as each rank is judged.
pub(crate) struct ExitFacts {
    max_growth: Option<Limit>,
    /// Whether any rank's device had checkpoints enough to judge.
    judged: bool,
    /// Devices whose suspected growth exceeds `max_growth`: how many, and
    /// the first few in rank order.
    over: usize,
    first_over: Vec<(Member, Over)>,
}

/// Devices over `--max-growth` named in its line; the rest are counted.
const OVER_NAMED: usize = 5;

impl ExitFacts {
    /// No rank yet, judged against `max_growth` (`--max-growth`).
    pub(crate) fn new(max_growth: Option<Limit>) -> ExitFacts {
        ExitFacts {
            max_growth,
            judged: false,
            over: 0,
            first_over: Vec::new(),
        }
    }

    /// Adds one rank's verdict.
    pub(crate) fn add(&mut self, verdict: &ProcessVerdict) {
        for d in &verdict.devices {
            self.judged |= d.trend.no_verdict.is_none();
            if let Some(over) = self.max_growth.and_then(|limit| limit.over(&d.trend)) {
                self.over += 1;
                let member = Member {
                    rank: snapdiff_runs::rank_of(&verdict.process),
                    process: verdict.process.clone(),
                    device: d.device,
                };
                self.first_over.push((member, over));
                self.first_over.sort_by(|a, b| a.0.cmp(&b.0));
                self.first_over.truncate(OVER_NAMED);
            }
        }
    }

    /// 2 when files could not be read (`unreadable`: the verdict rests on
    /// part of the job), else 3 when no rank had checkpoints enough to
    /// judge, else 1 when a rank's suspected growth exceeds `max_growth`
    /// (said on stderr), else 0.
    pub(crate) fn exit(&self, unreadable: &[Unreadable]) -> Exit {
        if !unreadable.is_empty() {
            return Exit::Error;
        }
        if !self.judged {
            return Exit::NoVerdict;
        }
        let (Some(limit), true) = (self.max_growth, self.over > 0) else {
            return Exit::Clean;
        };
        let shown: Vec<String> = (self.first_over.iter())
            .map(|(m, o)| {
                format!(
                    "{} {}: {}",
                    m.process,
                    DeviceName(m.device),
                    limit.amount(o.kept)
                )
            })
            .collect();
        eprintln!(
            "snapdiff: suspected growth over the {limit} limit (--max-growth) in {} rank{}: {}{}",
            self.over,
            if self.over == 1 { "" } else { "s" },
            shown.join("; "),
            if self.over > OVER_NAMED { "; ..." } else { "" }
        );
        Exit::OverThreshold
    }
}

/// The exit code of a job judged into `verdicts` (see [`ExitFacts::exit`]).
pub(crate) fn exit_code(
    verdicts: &[ProcessVerdict],
    unreadable: &[Unreadable],
    max_growth: Option<Limit>,
) -> Exit {
    let mut facts = ExitFacts::new(max_growth);
    verdicts.iter().for_each(|v| facts.add(v));
    facts.exit(unreadable)
}
