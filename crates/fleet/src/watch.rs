//! A job followed while it runs: each process's site tables grow one dump
//! at a time, and each dump re-judges its own process only, so the verdict
//! is current after every dump without reading a file twice.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use snapdiff_analyze::{HeldBy, Suspect, TrendOptions};
use snapdiff_format::Snapshot;

use crate::stacks::StackStore;
use crate::tally::fleet_verdict;
use crate::verdict::{Fleet, FleetOptions, ProcessVerdict, judge};
use snapdiff_analyze::rows::ProcessRows;
use snapdiff_runs::Unreadable;
use snapdiff_runs::{Run, names_apart, rank_of};

/// The most checkpoints a device keeps by default: past it, every other of
/// its older checkpoints is dropped (see [`ProcessRows::thin`]), so that a
/// week-long job is followed in the memory of its first hours.
pub const DEFAULT_KEEP_CHECKPOINTS: usize = 512;

/// A line of code that started or stopped leaking on one device of one
/// process, at the dump just added.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// `leaks` when the site became a suspect, `stopped` when it no longer is.
    pub event: ChangeKind,
    /// The process as the verdict names it (`rank13`).
    pub process: String,
    /// Its rank, when it is one.
    pub rank: Option<u32>,
    /// The process id and machine of its run, where known.
    pub pid: Option<u32>,
    /// The machine it runs on, where known.
    pub host: Option<String>,
    /// The device ordinal.
    pub device: u32,
    /// The step of the dump that changed the verdict, when known.
    pub step: Option<u64>,
    /// The culprit line: `function  file:line`.
    pub line: String,
    /// The suspect as `trend` reports it (for `leaks`; the last one seen,
    /// for `stopped`).
    pub suspect: Suspect,
    /// Seconds until the device is full at its suspects' rate, when known.
    pub seconds_to_full: Option<f64>,
}

/// What happened to a suspect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// The site's memory keeps growing now.
    Leaks,
    /// It no longer does.
    Stopped,
}

impl Change {
    /// The first owner "held by" names, when the job said.
    pub fn held_by(&self) -> Option<&HeldBy> {
        self.suspect.held_by.first()
    }
}

/// One process followed: its rows so far and its last verdict.
struct Followed {
    run: Run,
    rows: ProcessRows,
    verdict: ProcessVerdict,
}

/// Every process of a job followed so far, judged as `fleet` judges them.
pub struct Watch {
    stacks: StackStore,
    /// By the name judged: the process's, or one that tells a run apart.
    processes: BTreeMap<String, Followed>,
    /// Runs followed apart (another run of their name ran at the same
    /// time): (process name, run) -> the name they are judged under.
    apart: HashMap<(String, Run), String>,
    /// Runs known to have ended: (process id, machine).
    ended: HashSet<(Option<u32>, Option<String>)>,
    /// Runs left behind for a newer run of their name: their late dumps
    /// are passed over.
    left: HashSet<(String, Run)>,
    /// Processes whose runs are told by folders, each dump in a folder of
    /// its own: the folders are its steps, and its dumps one run.
    folder_steps: HashSet<String>,
    options: FleetOptions,
    keep: usize,
    /// Sites known after the stacks were last trimmed to those in use.
    stacks_trimmed_to: usize,
    notes: Vec<String>,
    dumps: usize,
    bytes: u64,
}

/// Sites known before the first trim of the stacks (see
/// [`Watch::trim_stacks`]): below it, nothing is dropped.
const STACKS_BEFORE_TRIM: usize = 4096;

impl Watch {
    /// Nothing followed yet; each device keeps at most `keep` checkpoints
    /// (at least 16).
    pub fn new(options: TrendOptions, keep: usize) -> Watch {
        Watch {
            stacks: StackStore::new(),
            processes: BTreeMap::new(),
            apart: HashMap::new(),
            ended: HashSet::new(),
            left: HashSet::new(),
            folder_steps: HashSet::new(),
            options: FleetOptions { trend: options },
            keep: keep.max(16),
            stacks_trimmed_to: 0,
            notes: Vec::new(),
            dumps: 0,
            bytes: 0,
        }
    }

    /// The stacks sites are named from: [`ProcessRows::add_snapshot`] adds
    /// a dump's to them.
    pub fn stacks(&self) -> &StackStore {
        &self.stacks
    }

    /// Notes that the run of process `pid` on `host` ended (its exit dump
    /// was written, or it no longer runs): a later run under its name
    /// replaces it instead of being followed beside it.
    pub fn run_ended(&mut self, pid: Option<u32>, host: Option<String>) {
        self.ended.insert((pid, host));
    }

    /// Adds `dump`, the rows of one dump of one process (`bytes` long on
    /// disk), from `run`, re-judges that process, and says which of its
    /// lines started or stopped leaking. Of runs under one name, one that
    /// began after the followed one ended replaces it, with a note (a late
    /// dump of the run left behind is passed over); two that run at once
    /// are followed apart, each under a name that tells it.
    pub fn add(&mut self, mut dump: ProcessRows, mut run: Run, bytes: u64) -> Vec<Change> {
        self.dumps += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        let process = dump.process.clone();
        if let Some(followed) = self.processes.get(&process) {
            // Told by folders, a second folder whose first holds one dump:
            // folders of steps (see `snapdiff_runs::folder_steps_are_one_run`).
            let folders = |a: &Run, b: &Run| a.folder.is_some() && b.folder.is_some() && a != b;
            if folders(&followed.run, &run)
                && (self.folder_steps.contains(&process)
                    || followed
                        .rows
                        .devices
                        .iter()
                        .all(|d| d.checkpoints.len() == 1))
            {
                self.folder_steps.insert(process.clone());
                run = followed.run.clone();
            }
            run.since_us = since_pause(followed, &run, &dump);
        }
        let key = (process, run);
        if self.left.contains(&key) {
            return Vec::new(); // a late file of a run already left behind
        }
        if let Some(name) = self.apart.get(&key) {
            dump.process.clone_from(name);
            let name = name.clone();
            return match self.processes.remove(&name) {
                Some(followed) => self.append(name, followed, dump),
                None => self.start(name, dump, key.1),
            };
        }
        let (process, run) = key;
        match self.processes.remove(&process) {
            None => self.start(process, dump, run),
            Some(f) if f.run == run => self.append(process, f, dump),
            Some(f)
                if self.ended.contains(&(f.run.pid, f.run.host.clone()))
                    || run.since_us > f.run.since_us =>
            {
                self.notes.push(format!(
                    "{process}: a new run began ({}); the earlier one is left out",
                    run.describe()
                ));
                let mut stopped = Vec::new();
                changes(&f.verdict, &empty_verdict(&process), &f.run, &mut stopped);
                self.left.insert((process.clone(), f.run));
                let mut fresh = self.start(process, dump, run);
                stopped.append(&mut fresh);
                stopped
            }
            Some(f) => {
                // Both run: each is followed apart from now on.
                let names = names_apart(&process, &[&f.run, &run]);
                self.notes.push(format!(
                    "{process} ran twice at once ({} and {}): each is judged on its own \
                     dumps, as {} and {}",
                    f.run.describe(),
                    run.describe(),
                    names[0],
                    names[1]
                ));
                let mut said = Vec::new();
                changes(&f.verdict, &empty_verdict(&process), &f.run, &mut said);
                let Followed {
                    run: first,
                    mut rows,
                    ..
                } = f;
                rows.process.clone_from(&names[0]);
                said.extend(self.start(names[0].clone(), rows, first.clone()));
                dump.process.clone_from(&names[1]);
                said.extend(self.start(names[1].clone(), dump, run.clone()));
                let [one, two] = [names[0].clone(), names[1].clone()];
                self.apart.insert((process.clone(), first), one);
                self.apart.insert((process, run), two);
                said
            }
        }
    }

    /// Adds `dump` to `followed`, known as `name`, and re-judges it.
    fn append(&mut self, name: String, mut followed: Followed, dump: ProcessRows) -> Vec<Change> {
        followed.rows.append(dump);
        followed.rows.put_in_order();
        followed.rows.thin(self.keep);
        let verdict = judge(
            followed.rows.clone(),
            &self.stacks.read(),
            &self.options.trend,
        );
        let mut found = Vec::new();
        changes(&followed.verdict, &verdict, &followed.run, &mut found);
        followed.verdict = verdict;
        self.processes.insert(name, followed);
        found
    }

    /// Drops the stacks of sites no process's rows or verdict names any
    /// more, once the sites known have doubled since the last trim: memory
    /// stays flat in the number of stacks a long job ever had, at a cost
    /// spread over its dumps. Called between polls, never while dumps read
    /// but not yet added hold keys in the stacks.
    pub fn trim_stacks(&mut self) {
        let known = self.stacks.read().len();
        if known < STACKS_BEFORE_TRIM.max(2 * self.stacks_trimmed_to) {
            return;
        }
        let mut used = HashSet::new();
        for f in self.processes.values() {
            for d in &f.rows.devices {
                used.extend(d.sites.iter().flatten().map(|s| s.key));
                used.extend(d.owners.iter().flatten().flat_map(|o| o.keys().copied()));
            }
            for d in &f.verdict.devices {
                used.extend(d.last.iter().map(|s| s.key));
            }
        }
        let mut stacks = self.stacks.write();
        stacks.retain(|key| used.contains(&key));
        self.stacks_trimmed_to = stacks.len();
    }

    fn start(&mut self, name: String, mut rows: ProcessRows, run: Run) -> Vec<Change> {
        rows.put_in_order();
        let verdict = judge(rows.clone(), &self.stacks.read(), &self.options.trend);
        let mut found = Vec::new();
        changes(&empty_verdict(&name), &verdict, &run, &mut found);
        self.processes.insert(name, Followed { run, rows, verdict });
        found
    }

    /// Judges each process followed that left one dump by that dump's
    /// trace, cut into checkpoints as `trend` and `fleet` judge a process's
    /// one file, where `read(source)` gives the whole file and its trace
    /// records allocations; says what changed. For the end of a job: a
    /// process that may dump again is judged by its dumps.
    pub fn judge_one_dumps_by_trace(
        &mut self,
        read: impl Fn(&str) -> Option<Snapshot>,
    ) -> Vec<Change> {
        let mut found = Vec::new();
        for (name, followed) in &mut self.processes {
            let Some(source) = followed.rows.one_dump() else {
                continue;
            };
            let Some(snap) = read(source) else {
                continue;
            };
            let mut rows = ProcessRows::new(name.clone());
            let cut = (self.stacks).add_trace(&mut rows, source, &snap, &self.options.trend);
            if cut.is_err() {
                continue;
            }
            let verdict = judge(rows.clone(), &self.stacks.read(), &self.options.trend);
            changes(&followed.verdict, &verdict, &followed.run, &mut found);
            followed.rows = rows;
            followed.verdict = verdict;
        }
        found
    }

    /// Each process's latest verdict, by name.
    pub fn verdicts(&self) -> impl Iterator<Item = &ProcessVerdict> {
        self.processes.values().map(|f| &f.verdict)
    }

    /// The run each process is followed in, by name.
    pub fn runs(&self) -> impl Iterator<Item = (&str, &Run)> {
        self.processes.iter().map(|(n, f)| (n.as_str(), &f.run))
    }

    /// Dumps added so far, and their bytes.
    pub fn read(&self) -> (usize, u64) {
        (self.dumps, self.bytes)
    }

    /// The job's verdict now, as `fleet` would give it from the same dumps
    /// (`unreadable`: the files that could not be read).
    pub fn fleet(&self, unreadable: Vec<Unreadable>) -> Fleet {
        let verdicts = self.verdicts().cloned().collect();
        let mut fleet = fleet_verdict(
            verdicts,
            &self.stacks.read(),
            &self.options,
            unreadable,
            self.dumps,
            self.bytes,
        );
        fleet.notes.extend(self.notes.iter().cloned());
        fleet
    }
}

/// Where `run` is a folder's run as far as its dumps say and `followed`
/// is of the same folder: the time from which `dump` is of a later run,
/// when it comes after a pause far longer than the followed dumps' spacing
/// (see `snapdiff_runs::time_jumps`), or is a later dump of such a run;
/// else the run's own.
fn since_pause(followed: &Followed, run: &Run, dump: &ProcessRows) -> Option<i64> {
    let times = |rows: &ProcessRows| -> Vec<i64> {
        let all = rows.devices.iter().flat_map(|d| &d.checkpoints);
        all.filter_map(|c| c.time_us).collect()
    };
    let same_folder = run.pid.is_none() && followed.run.pid.is_none();
    let (Some(t), true) = (
        times(dump).into_iter().max(),
        same_folder && run.folder == followed.run.folder,
    ) else {
        return run.since_us;
    };
    let mut all = times(&followed.rows);
    all.sort_unstable();
    all.dedup();
    if followed.run.since_us.is_some_and(|since| t < since) {
        return run.since_us; // a late dump of the run left behind
    }
    all.push(t);
    let n = all.len();
    if snapdiff_runs::time_jumps(&all).last() == Some(&(n - 1)) {
        return Some(t);
    }
    followed.run.since_us
}

fn empty_verdict(name: &str) -> ProcessVerdict {
    ProcessVerdict {
        process: name.to_owned(),
        devices: Vec::new(),
    }
}

/// A process's suspects by device and line, each with its device's time
/// to full and last step.
type SuspectsByLine = BTreeMap<(u32, String), (Suspect, Option<f64>, Option<u64>)>;

/// The lines that leak in `now` and not in `before` (`Leaks`), and the
/// other way round (`Stopped`), device by device.
fn changes(before: &ProcessVerdict, now: &ProcessVerdict, run: &Run, out: &mut Vec<Change>) {
    let suspects = |v: &ProcessVerdict| -> SuspectsByLine {
        v.devices
            .iter()
            .flat_map(|d| {
                let step = d.trend.points.last().and_then(|p| p.step);
                d.trend.suspects.iter().map(move |s| {
                    (
                        (d.device, s.site.culprit.display()),
                        (s.clone(), d.trend.seconds_to_full, step),
                    )
                })
            })
            .collect()
    };
    let (was, is) = (suspects(before), suspects(now));
    let step_now = now
        .devices
        .iter()
        .filter_map(|d| d.trend.points.last().and_then(|p| p.step))
        .max();
    let change = |event, (device, line): &(u32, String), suspect: &Suspect, full, step| Change {
        event,
        process: now.process.clone(),
        rank: rank_of(&now.process),
        pid: run.pid,
        host: run.host.clone(),
        device: *device,
        step,
        line: line.clone(),
        suspect: suspect.clone(),
        seconds_to_full: full,
    };
    for (id, (suspect, full, step)) in &is {
        if !was.contains_key(id) {
            out.push(change(ChangeKind::Leaks, id, suspect, *full, *step));
        }
    }
    for (id, (suspect, _, _)) in &was {
        if !is.contains_key(id) {
            out.push(change(ChangeKind::Stopped, id, suspect, None, step_now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapdiff_analyze::rows::{CheckpointRow, DeviceRows, SiteRow};
    use snapdiff_analyze::{SiteTotals, StackKey};

    /// A run told by its process id and machine.
    fn run(pid: Option<u32>, host: Option<&str>) -> Run {
        Run {
            pid,
            host: host.map(str::to_owned),
            ..Run::default()
        }
    }

    const SITE: StackKey = StackKey(7);

    /// One dump of `process`'s device 0 at `step`, holding `bytes` at SITE.
    fn dump(process: &str, step: u64, bytes: u64) -> ProcessRows {
        let mut rows = ProcessRows::new(process);
        rows.devices.push(DeviceRows {
            device: 0,
            checkpoints: vec![CheckpointRow {
                step: Some(step),
                time_us: Some(step as i64 * 1_000_000),
                source: format!("{process}-step{step}.pickle"),
                reserved_bytes: bytes,
                allocated_bytes: bytes,
                active_bytes: bytes,
                device_memory: None,
                rss_bytes: None,
                device_used_bytes: None,
                recorded_on_cpu: false,
                ..CheckpointRow::default()
            }],
            sites: vec![vec![SiteRow {
                key: SITE,
                totals: SiteTotals {
                    blocks: bytes >> 20,
                    bytes,
                    allocated: bytes,
                },
            }]],
            owners: Vec::new(),
            cut: None,
        });
        rows
    }

    #[test]
    fn a_line_is_said_once_when_it_starts_leaking_and_once_when_it_stops() {
        let mut watch = Watch::new(TrendOptions::default(), DEFAULT_KEEP_CHECKPOINTS);
        let run = run(Some(1), Some("node"));
        let mut said = Vec::new();
        for step in 1..=10 {
            for change in watch.add(dump("rank3", step, step << 20), run.clone(), 0) {
                said.push((step, change.event, change.process, change.rank));
            }
        }
        let first = said.first().expect("the growing site is said").clone();
        assert_eq!(said.len(), 1, "{said:?}");
        assert_eq!(first.1, ChangeKind::Leaks);
        assert_eq!((first.2.as_str(), first.3), ("rank3", Some(3)));
        assert!(first.0 <= 5, "said only at step {}", first.0);
        // It falls back to where it began and stays there: no longer a suspect.
        let mut stopped = Vec::new();
        for step in 11..=40 {
            stopped.extend(watch.add(dump("rank3", step, 1 << 20), run.clone(), 0));
        }
        assert_eq!(stopped.len(), 1, "{stopped:?}");
        assert_eq!(stopped[0].event, ChangeKind::Stopped);
        assert_eq!(watch.fleet(Vec::new()).leaking, 0);
    }

    #[test]
    fn a_new_run_after_the_old_one_ended_starts_afresh_and_a_late_file_of_the_old_one_is_passed_over()
     {
        let mut watch = Watch::new(TrendOptions::default(), DEFAULT_KEEP_CHECKPOINTS);
        let (old, new) = (run(Some(1), None), run(Some(2), None));
        for step in 1..=8 {
            watch.add(dump("rank0", step, step << 20), old.clone(), 0);
        }
        assert_eq!(watch.fleet(Vec::new()).leaking, 1);
        watch.run_ended(Some(1), None);
        // The restarted rank: its first dump ends the old run's suspect.
        let changes = watch.add(dump("rank0", 100, 1 << 20), new.clone(), 0);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].event, ChangeKind::Stopped);
        assert!(watch.add(dump("rank0", 9, 9 << 20), old, 0).is_empty());
        let fleet = watch.fleet(Vec::new());
        assert_eq!(fleet.members[0].checkpoints.len(), 1);
        assert!(
            fleet.notes[0].contains("a new run began"),
            "{:?}",
            fleet.notes
        );
    }

    #[test]
    fn a_folders_dumps_after_a_long_pause_are_a_new_run() {
        // No process id: runs told by their folder, and by their times.
        let mut watch = Watch::new(TrendOptions::default(), DEFAULT_KEEP_CHECKPOINTS);
        let folder = Run {
            folder: Some("job".into()),
            ..Run::default()
        };
        for step in 1..=8 {
            watch.add(dump("rank0", step, step << 20), folder.clone(), 0);
        }
        assert_eq!(watch.fleet(Vec::new()).leaking, 1);
        // 1157 days later, in the same folder: a steady run.
        let later = |step: u64| {
            let mut rows = dump("rank0", step, 1 << 20);
            rows.devices[0].checkpoints[0].time_us = Some(100_000_000_000_000 + step as i64);
            rows
        };
        let changes = watch.add(later(1), folder.clone(), 0);
        assert_eq!(changes[0].event, ChangeKind::Stopped);
        for step in 2..=8 {
            watch.add(later(step), folder.clone(), 0);
        }
        let fleet = watch.fleet(Vec::new());
        assert_eq!((fleet.processes, fleet.leaking), (1, 0));
        assert_eq!(fleet.members[0].checkpoints.len(), 8);
        assert!(
            fleet.notes[0].contains("a new run began"),
            "{:?}",
            fleet.notes
        );
    }

    #[test]
    fn two_runs_of_one_name_at_once_are_each_judged_alone() {
        // Two jobs write one folder as rank0: one leaks, one is steady,
        // their dumps interleaved.
        let mut watch = Watch::new(TrendOptions::default(), DEFAULT_KEEP_CHECKPOINTS);
        let (leaking, steady) = (run(Some(10), Some("n")), run(Some(20), Some("n")));
        let mut said = Vec::new();
        for step in 1..=12 {
            said.extend(watch.add(dump("rank0", step, step << 20), leaking.clone(), 0));
            said.extend(watch.add(dump("rank0", step, 4 << 20), steady.clone(), 0));
        }
        let fleet = watch.fleet(Vec::new());
        let names: Vec<&str> = fleet
            .members
            .iter()
            .map(|m| m.member.process.as_str())
            .collect();
        assert_eq!(names, ["rank0@pid10", "rank0@pid20"]);
        assert_eq!(fleet.leaking, 1);
        assert_eq!(fleet.members[0].suspects.len(), 1);
        assert!(fleet.members[1].suspects.is_empty());
        assert_eq!(fleet.members[0].checkpoints.len(), 12);
        assert!(
            fleet
                .notes
                .iter()
                .any(|n| n.contains("rank0 ran twice at once")),
            "{:?}",
            fleet.notes
        );
        let leaks: Vec<_> = said
            .iter()
            .filter(|c| c.event == ChangeKind::Leaks)
            .collect();
        assert!(
            leaks
                .iter()
                .all(|c| c.process == "rank0@pid10" && c.rank == Some(0)),
            "{leaks:?}"
        );
        assert!(!leaks.is_empty());
    }

    #[test]
    fn six_thousand_new_stacks_leave_the_stacks_of_the_sites_in_use() {
        // Each dump holds a site never seen before (a new stack each time:
        // generated code, a changing call path) beside the steady one.
        let mut watch = Watch::new(TrendOptions::default(), 64);
        let frame = |line| snapdiff_format::Frame {
            name: "step".into(),
            file: "train.py".into(),
            line,
            extra: Vec::new(),
        };
        let mut most = 0;
        for step in 1..=6_000u64 {
            let key = StackKey(1_000 + step);
            let frames = [frame(step as u32), frame(1)];
            watch
                .stacks()
                .write()
                .insert(key, Some(frames.iter()), None);
            watch
                .stacks()
                .write()
                .insert(SITE, Some([frame(7)].iter()), None);
            let mut rows = dump("rank0", step, 1 << 20);
            rows.devices[0].sites[0].push(SiteRow {
                key,
                totals: SiteTotals {
                    blocks: 1,
                    bytes: 512,
                    allocated: 512,
                },
            });
            watch.add(rows, Run::default(), 0);
            watch.trim_stacks();
            most = most.max(watch.stacks().read().len());
        }
        assert!(most <= STACKS_BEFORE_TRIM, "{most} stacks held at once");
        let stacks = watch.stacks().read();
        // The sites still in the kept checkpoints keep their frames.
        assert!(stacks.stack(SITE).is_some());
        let last = stacks.stack(StackKey(7_000)).expect("the newest site");
        let frames: Vec<u32> = stacks
            .snapshot()
            .stack_frames(Some(last))
            .map(|f| f.line)
            .collect();
        assert_eq!(frames, [6_000, 1]);
    }

    #[test]
    fn a_long_run_keeps_at_most_its_bound_of_checkpoints_and_still_finds_its_leak() {
        let keep = 64;
        let mut watch = Watch::new(TrendOptions::default(), keep);
        for step in 1..=5_000 {
            watch.add(dump("rank0", step, step << 10), Run::default(), 0);
        }
        let fleet = watch.fleet(Vec::new());
        let kept = &fleet.members[0].checkpoints;
        assert!(kept.len() <= keep, "{} checkpoints kept", kept.len());
        assert_eq!(kept.first().and_then(|c| c.step), Some(1));
        assert_eq!(kept.last().and_then(|c| c.step), Some(5_000));
        assert_eq!(fleet.leaking, 1);
        let growth = fleet.members[0].suspects[0].growth_per_step.unwrap();
        assert!((growth - 1024.0).abs() < 1.0, "{growth}");
        assert_eq!(watch.read().0, 5_000);
    }
}
