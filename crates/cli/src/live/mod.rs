//! A job's verdict kept current while it runs, a dump at a time: what
//! `snapdiff watch PATH...` and `capture --watch` share.
//!
//! `follow.rs` finds each dump once, when whole; `snapdiff_fleet::Watch`
//! keeps each process's site tables and re-judges the process a dump
//! changed, as `fleet` judges it; this module says what changed (a line,
//! `--exec`, the status, `--metrics`) and, at the end, the verdict.

mod alerts;
mod follow;
mod metrics;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use snapdiff_analyze::{Culprit, CulpritRules, TrendOptions};
use snapdiff_fleet::{Change, ChangeKind, Fleet, ProcessRows, ProcessVerdict, Unreadable, Watch};
use snapdiff_format::visible::escaped;

use crate::args::{LiveArgs, ReportArgs};
use alerts::Alerts;
use follow::{Follower, Ready};
use metrics::MetricsServer;

/// Largest sites of each device in the metrics, besides the suspects.
const METRICS_SITES: usize = 5;
/// How long a watch that ends waits for `--exec` commands still running.
const ALERTS_GRACE: Duration = Duration::from_secs(10);

/// `capture --watch`: follows `dir` on a thread of its own while the job
/// (process `job`, started at `started`) runs, until `ended` is set; with
/// `--fail-fast`, the first suspect ends the job (SIGTERM) and the thread
/// returns true.
pub(crate) fn beside_capture(
    dir: PathBuf,
    live: &LiveArgs,
    report: &ReportArgs,
    (job, started): (u32, std::time::SystemTime),
    ended: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<bool>> {
    let mut trend = TrendOptions::default();
    trend.rules = report.rules()?;
    let mut watcher = Watcher::new(std::slice::from_ref(&dir), live, report, trend, Say::Stderr)?;
    // Dumps of earlier runs in the folder are not this job's.
    watcher.follower.poll(false);
    watcher.follower.pass_over_older_than(started);
    let poll = live.poll;
    let fail_fast = live.fail_fast;
    Ok(std::thread::spawn(move || {
        let options = LiveOptions { poll, fail_fast };
        let failed_fast = watcher
            .follow_with(options, &ended, || ended.load(Ordering::Relaxed))
            .unwrap_or(false);
        if failed_fast {
            end_job(job);
        }
        watcher.finish();
        failed_fast
    }))
}

/// Ends the job as a scheduler would: SIGTERM, which the capture hook
/// turns into an exit dump.
fn end_job(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: sending a signal has no memory effects.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}

/// Where changes are said: on stdout, with the status on stderr
/// (`watch`); or on stderr, as lines only (`capture --watch`: the job's
/// own output shares the terminal, and a redrawn status would break it).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Say {
    Stdout,
    Stderr,
}

/// What following needs of the flags, for a thread of its own.
#[derive(Clone, Copy)]
struct LiveOptions {
    poll: Duration,
    fail_fast: bool,
}

/// A job followed: where its dumps are, what they came to, and where
/// changes are said.
pub(crate) struct Watcher {
    follower: Follower,
    watch: Watch,
    unreadable: Vec<Unreadable>,
    alerts: Option<Alerts>,
    metrics: Option<MetricsServer>,
    status: Option<indicatif::ProgressBar>,
    rules: CulpritRules,
    say: Say,
    json: bool,
    full_paths: bool,
}

impl Watcher {
    pub(crate) fn new(
        paths: &[PathBuf],
        live: &LiveArgs,
        report: &ReportArgs,
        trend: TrendOptions,
        say: Say,
    ) -> anyhow::Result<Watcher> {
        use std::io::IsTerminal;
        let metrics = live
            .metrics
            .as_deref()
            .map(MetricsServer::start)
            .transpose()?;
        let terminal = std::io::stderr().is_terminal();
        let status = (say == Say::Stdout && !live.no_status && terminal).then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg}")
                    .expect("a valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(250));
            bar.set_message("waiting for the first dump");
            bar
        });
        Ok(Watcher {
            follower: Follower::new(paths),
            rules: trend.rules.clone(),
            watch: Watch::new(trend, live.keep_checkpoints),
            unreadable: Vec::new(),
            alerts: live.exec.clone().map(Alerts::new),
            metrics,
            status,
            say,
            json: report.json,
            full_paths: report.full_paths,
        })
    }

    /// Passes over the dumps of runs that had ended before the watch
    /// began (a folder used again: they are not the run to follow);
    /// returns how many dumps, of how many processes.
    pub(crate) fn pass_over_ended_runs(&mut self) -> (usize, usize) {
        let (ready, unreadable) = self.follower.poll(false);
        self.unreadable.extend(unreadable);
        self.follower.pass_over_ended_runs(ready)
    }

    /// Polls until the job ends, `stop` is set or `done()` says so;
    /// true when `--fail-fast` ended it at a suspect.
    pub(crate) fn follow(
        &mut self,
        live: &LiveArgs,
        stop: &AtomicBool,
        done: impl Fn() -> bool,
    ) -> anyhow::Result<bool> {
        let options = LiveOptions {
            poll: live.poll,
            fail_fast: live.fail_fast,
        };
        self.follow_with(options, stop, done)
    }

    fn follow_with(
        &mut self,
        options: LiveOptions,
        stop: &AtomicBool,
        done: impl Fn() -> bool,
    ) -> anyhow::Result<bool> {
        loop {
            // Whether the job had ended before this poll: then the poll
            // reads its last dumps, and the watch ends.
            let ended = done() || stop.load(Ordering::Relaxed);
            let leaks = self.poll(ended)?;
            if options.fail_fast && leaks {
                return Ok(true);
            }
            if ended || self.follower.job_ended() {
                return Ok(false);
            }
            let until = Instant::now() + options.poll;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) && !done() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Reads the dumps that are whole (all of them, when `last`), says
    /// what changed; true when a line started leaking.
    fn poll(&mut self, last: bool) -> anyhow::Result<bool> {
        let (ready, unreadable) = self.follower.poll(last);
        self.unreadable.extend(unreadable);
        // Before the dumps: a run that ended is replaced by a later one of
        // its name, not followed beside it.
        for (pid, host) in self.follower.ended_runs() {
            self.watch.run_ended(Some(pid), host);
        }
        let stacks = self.watch.stacks();
        let read: Vec<(Ready, DumpRead)> = ready
            .into_par_iter()
            .map(|r| {
                let rows = read_dump(&r, stacks);
                (r, rows)
            })
            .collect();
        let mut changes = Vec::new();
        let any = !read.is_empty();
        for (ready, rows) in read {
            match rows {
                Ok((rows, run)) => {
                    self.follower.read(&ready.path);
                    changes.extend(self.watch.add(rows, run, ready.bytes));
                }
                Err(error) => {
                    self.follower.failed(&ready.path);
                    if last {
                        self.follower.read(&ready.path);
                        eprintln!("snapdiff: {error}");
                        self.unreadable.push(Unreadable {
                            source: ready.path.to_string_lossy().into_owned(),
                            error,
                        });
                    }
                }
            }
        }
        // Every dump of this poll is added: stacks no row names can go.
        self.watch.trim_stacks();
        let mut leaks = false;
        for change in &changes {
            leaks |= change.event == ChangeKind::Leaks;
            self.say(change)?;
        }
        if let Some(alerts) = &mut self.alerts {
            alerts.reap();
        }
        if any || self.status.is_some() {
            self.show();
        }
        Ok(leaks)
    }

    /// A change on stdout (a JSON line with `--json`), and to `--exec`.
    fn say(&mut self, change: &Change) -> anyhow::Result<()> {
        let line = snapdiff_render::watch::change_line(change, self.full_paths);
        let text = if self.json && self.say == Say::Stdout {
            serde_json::to_string(change)?
        } else {
            line.clone()
        };
        let say = self.say;
        let print = || match say {
            Say::Stdout => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{text}").and_then(|()| out.flush())
            }
            Say::Stderr => writeln!(std::io::stderr().lock(), "snapdiff: {text}"),
        };
        match &self.status {
            Some(bar) => bar.suspend(print)?,
            None => print()?,
        }
        if change.event == ChangeKind::Leaks
            && let Some(alerts) = &mut self.alerts
        {
            alerts.run(change, &line);
        }
        Ok(())
    }

    /// The status and the metrics, as the verdict stands now.
    fn show(&mut self) {
        if let Some(bar) = &self.status {
            let fleet = self.watch.fleet(self.unreadable.clone());
            bar.set_message(snapdiff_render::watch::status_text(
                &fleet,
                self.follower.waiting(),
                self.full_paths,
            ));
        }
        if let Some(metrics) = &self.metrics {
            let stacks = self.watch.stacks().read();
            let rules = &self.rules;
            let top_sites =
                |verdict: &ProcessVerdict, device: u32| top_lines(verdict, device, &stacks, rules);
            let (dumps, _) = self.watch.read();
            let input = snapdiff_render::watch::MetricsInput {
                processes: self
                    .watch
                    .verdicts()
                    .zip(self.watch.runs().map(|(_, run)| run))
                    .collect(),
                top_sites: &top_sites,
                dumps,
                unreadable: self.unreadable.len(),
            };
            metrics.set(snapdiff_render::watch::metrics_text(&input));
        }
    }

    /// The verdict now, as `fleet` gives it, and each process's verdict;
    /// the status is cleared and `--exec` commands still running are
    /// waited for a while.
    pub(crate) fn finish(mut self) -> (Fleet, Vec<ProcessVerdict>) {
        if let Some(bar) = self.status.take() {
            bar.finish_and_clear();
        }
        // A process that left one dump is judged by its trace, as `fleet`
        // and `trend` judge it.
        let read = |source: &str| crate::input::read_quietly(Path::new(source), true).ok();
        for change in self.watch.judge_one_dumps_by_trace(read) {
            // Said as any change; a closed stdout is the reader's choice.
            let _ = self.say(&change);
        }
        if let Some(alerts) = &mut self.alerts {
            alerts.wait(ALERTS_GRACE);
        }
        let verdicts = self.watch.verdicts().cloned().collect();
        (
            self.watch.fleet(std::mem::take(&mut self.unreadable)),
            verdicts,
        )
    }
}

/// One dump read: its process's rows and run, or why it could not be.
type DumpRead = Result<(ProcessRows, snapdiff_runs::Run), String>;

/// Reads one dump into its process's rows, with what its manifest line
/// says; an error is one line naming the file.
fn read_dump(ready: &Ready, stacks: &snapdiff_fleet::StackStore) -> DumpRead {
    let mut snap = crate::input::read_quietly(&ready.path, false)
        .map_err(|e| escaped(&e.to_string()).into_owned())?;
    let writer = ready
        .entry
        .as_ref()
        .and_then(|e| snapdiff_runs::manifest::apply(e, &mut snap));
    let process = snapdiff_runs::process_of(&ready.path, &snap, writer.as_deref());
    let mut rows = ProcessRows::new(process);
    let owners = crate::owners::by_site(&ready.path, &snap);
    stacks.add_snapshot(
        &mut rows,
        &ready.path.to_string_lossy(),
        &snap,
        owners.as_ref(),
    );
    Ok((rows, snapdiff_runs::Run::of(&snap.meta, &ready.path)))
}

/// The lines holding most at a device's last dump: (culprit, live bytes),
/// largest first, sites with the same culprit line added up.
fn top_lines(
    verdict: &ProcessVerdict,
    device: u32,
    stacks: &snapdiff_fleet::Stacks,
    rules: &CulpritRules,
) -> Vec<(Culprit, u64)> {
    let Some(d) = verdict.devices.iter().find(|d| d.device == device) else {
        return Vec::new();
    };
    let mut sites: Vec<_> = d.last.iter().collect();
    sites.sort_unstable_by_key(|s| std::cmp::Reverse(s.totals.bytes));
    let mut lines: Vec<(Culprit, u64)> = Vec::new();
    for s in sites.into_iter().take(4 * METRICS_SITES) {
        let site =
            snapdiff_analyze::describe_site(stacks.snapshot(), s.key, stacks.stack(s.key), rules);
        let line = site.culprit;
        let same = |c: &Culprit| (&c.file, c.line, &c.name) == (&line.file, line.line, &line.name);
        match lines.iter_mut().find(|(c, _)| same(c)) {
            Some((_, bytes)) => *bytes = bytes.saturating_add(s.totals.bytes),
            None => lines.push((line, s.totals.bytes)),
        }
    }
    lines.sort_by_key(|l| std::cmp::Reverse(l.1));
    lines.truncate(METRICS_SITES);
    lines
}
