//! Leak verdicts on jobs made from the real traces: each trace replayed as
//! the iterations of a job through the runtime's allocator (so segments,
//! splitting and rounding are PyTorch's, checked in `pytorch_rules`), with
//! leaks and look-alikes added at the trace's real stacks.

use std::path::{Path, PathBuf};

use serde_json::Value;
use snapdiff_format::{Action, Existing, Snapshot, StackId};

use crate::pytorch_replay::{Extra, Job, start_state, trace_of};
use crate::util::{compare_json, shared_torch_fixtures, snapdiff, tempdir};

/// Packages whose copy inside a job's own tree is a library's code (the
/// maph job vendors transformers in its own folder).
const LIBRARIES: [&str; 6] = [
    "torch",
    "transformers",
    "accelerate",
    "deepspeed",
    "lightning",
    "peft",
];

/// The test's own rule for user code, independent of the analyzer's: a
/// Python file outside installed packages and the standard library...
fn placed_as_user(file: &str) -> bool {
    file.ends_with(".py")
        && !["/site-packages/", "/dist-packages/", "/lib/python"]
            .iter()
            .any(|p| file.contains(p))
}

/// ...with no library's folder below the folder it shares with `entry`,
/// the stack's outermost such file (the script).
fn vendored(file: &str, entry: &str) -> bool {
    let (f, e): (Vec<&str>, Vec<&str>) = (file.split('/').collect(), entry.split('/').collect());
    let shared = f.iter().zip(&e).take_while(|(a, b)| a == b).count();
    let folders = &f[shared.min(f.len() - 1)..f.len() - 1];
    folders.iter().any(|s| LIBRARIES.contains(s))
}

/// The innermost user frame of `stack`: (file, line).
fn user_line(snap: &Snapshot, stack: StackId) -> Option<(String, u64)> {
    let placed: Vec<_> = snap.stacks[stack as usize]
        .iter()
        .map(|&f| &snap.frames[f as usize])
        .filter(|f| placed_as_user(&f.file))
        .collect();
    let entry = placed.last()?.file.to_string();
    placed
        .into_iter()
        .find(|f| !vendored(&f.file, &entry))
        .map(|f| (f.file.to_string(), u64::from(f.line)))
}

/// A fixture whose busy device's trace can be replayed.
struct Source {
    name: String,
    snap: Snapshot,
    device: u32,
}

fn sources() -> Vec<Source> {
    let Some(files) = shared_torch_fixtures() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for file in files {
        let snap = snapdiff_format::read_path(&file).unwrap();
        let Some(device) = snap
            .traces
            .iter()
            .find(|t| t.events.iter().any(|e| e.action == Action::Alloc))
            .map(|t| t.device)
        else {
            continue;
        };
        // Expandable segments (snapviewer) cannot be replayed: see pytorch_rules.
        if start_state(&snap, device).is_err() {
            continue;
        }
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        out.push(Source { name, snap, device });
    }
    assert_eq!(out.len(), 5, "five replayable fixtures");
    out
}

/// An allocation of the trace at a user line that the trace frees again:
/// keeping it is a leak. The smallest such of at least `min` bytes, as
/// (event index, bytes, user line).
fn transient_alloc(src: &Source, min: u64) -> (usize, u64, (String, u64)) {
    find_transient_alloc(src, min)
        .unwrap_or_else(|| panic!("{}: no transient allocation at a user line", src.name))
}

/// [`transient_alloc`], or `None` when there is no such allocation.
fn find_transient_alloc(src: &Source, min: u64) -> Option<(usize, u64, (String, u64))> {
    let events = trace_of(&src.snap, src.device);
    let mut open = std::collections::HashMap::new();
    let mut transient = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.address, i);
            }
            Action::FreeCompleted => transient.extend(open.remove(&e.address)),
            _ => {}
        }
    }
    transient
        .into_iter()
        .map(|i| (i, &events[i]))
        .filter(|(_, e)| e.size >= min)
        .filter_map(|(i, e)| Some((i, e.size, user_line(&src.snap, e.stack?)?)))
        .min_by_key(|&(i, size, _)| (size, i))
}

fn write(dir: &Path, name: &str, snap: &Snapshot) -> PathBuf {
    let path = dir.join(name);
    snapdiff_format::write_path(&path, snap, Existing::Replace).unwrap();
    path
}

/// `trend --json` of `files`: the report, with an entry for each process.
fn trend_report(files: &[&Path]) -> Value {
    let mut args = vec!["trend".as_ref(), "--json".as_ref()];
    args.extend(files.iter().map(|f| f.as_os_str()));
    snapdiff(args).expect_code(0).json()
}

/// The trend of `files`, one process's.
fn trend(files: &[&Path]) -> Value {
    let mut args = vec!["trend".as_ref(), "--json".as_ref()];
    args.extend(files.iter().map(|f| f.as_os_str()));
    snapdiff(args).expect_code(0).one_trend()
}

fn line_of(site: &Value) -> (String, u64) {
    let c = &site["culprit"];
    (
        c["file"].as_str().unwrap().to_owned(),
        c["line"].as_u64().unwrap(),
    )
}

/// Runs `job` on `src` and writes the snapshot at its end.
fn dump(src: &Source, job: &Job, dir: &Path, name: &str) -> PathBuf {
    write(
        dir,
        &format!("{name}.snap"),
        &job.run(&src.snap, src.device),
    )
}

/// [`dump`] as if process `pid` had run the job.
fn dump_as_process(src: &Source, job: &Job, dir: &Path, name: &str, pid: u32) -> PathBuf {
    let mut snapshot = job.run(&src.snap, src.device);
    snapshot.meta.pid = Some(pid);
    write(dir, &format!("{name}.snap"), &snapshot)
}

fn suspects(report: &Value) -> &Vec<Value> {
    report["suspects"].as_array().unwrap()
}

/// Asserts that `report` names `line` first and alone, growing `bytes` a step.
fn names_alone(report: &Value, line: &(String, u64), bytes: u64, case: &str) {
    let found = suspects(report);
    assert_eq!(found.len(), 1, "{case}: only the injected site: {report:#}");
    assert_eq!(&line_of(&found[0]), line, "{case}: {report:#}");
    assert_eq!(
        found[0]["growth_per_step"].as_f64(),
        Some(bytes as f64),
        "{case}: bytes per step: {report:#}"
    );
}

fn no_suspect(report: &Value, case: &str) {
    assert_eq!(suspects(report).len(), 0, "{case}: {report:#}");
}

#[test]
fn steady_jobs_have_no_suspect_and_leak_nothing_between_iterations() {
    let dir = tempdir();
    for src in sources() {
        let case = format!("{} steady", src.name);
        let marked = dump(&src, &Job::steady(8), dir.path(), "steady");
        no_suspect(&trend(&[&marked]), &case);
        let plain = Job {
            step_marks: false,
            ..Job::steady(8)
        };
        let unmarked = dump(&src, &plain, dir.path(), "unmarked");
        let report = trend(&[&unmarked]);
        assert_eq!(report["checkpoint_source"], "iterations", "{case}");
        no_suspect(&report, &case);
        // Two dumps of the same job, iterations apart: allocator slack
        // moves, nothing leaks.
        let early = dump(&src, &Job::steady(3), dir.path(), "early");
        let report = compare_json(&early, &marked);
        assert_eq!(report["leaked_bytes"], 0, "{case}: {report:#}");
    }
}

#[test]
fn a_leak_of_whole_blocks_is_named_with_its_bytes_per_step() {
    let dir = tempdir();
    for src in sources() {
        let (alloc, size, line) = transient_alloc(&src, 64 << 10);
        let job = Job::steady(8).with(Extra::KeepBlock { alloc });
        let marked = dump(&src, &job, dir.path(), "marked");
        names_alone(
            &trend(&[&marked]),
            &line,
            size,
            &format!("{} marked", src.name),
        );

        // One dump at the end of a job that marks nothing: the iterations
        // are found from the trace.
        let plain = Job {
            step_marks: false,
            ..job.clone()
        };
        let unmarked = dump(&src, &plain, dir.path(), "unmarked");
        let report = trend(&[&unmarked]);
        assert_eq!(report["checkpoint_source"], "iterations", "{}", src.name);
        names_alone(&report, &line, size, &format!("{} unmarked", src.name));

        // Another device whose trace holds only markers changes nothing.
        let mut snap = snapdiff_format::read_path(&unmarked).unwrap();
        snap.traces.push(snapdiff_format::DeviceTrace {
            device: src.device + 1,
            events: (0..4)
                .map(|step| snapdiff_format::TraceEvent {
                    action: Action::Step,
                    size: step,
                    ..Default::default()
                })
                .collect(),
        });
        let idle = write(dir.path(), "idle.snap", &snap);
        let with_idle = trend(&[&idle]);
        assert_eq!(with_idle["suspects"], report["suspects"], "{}", src.name);

        // A ring buffer that wrapped: the recorded window is judged.
        let per_iteration = trace_of(&src.snap, src.device).len();
        let wrapped = Job {
            trace_entries: 3 * per_iteration,
            ..plain.clone()
        };
        let wrapped = dump(&src, &wrapped, dir.path(), "wrapped");
        let report = trend(&[&wrapped]);
        names_alone(&report, &line, size, &format!("{} wrapped", src.name));
        assert!(
            report["notes"].to_string().contains("never saw allocated"),
            "{}: {report:#}",
            src.name
        );
    }
}

#[test]
fn a_slow_leak_under_allocator_slack_is_named_in_trend_and_compare() {
    let dir = tempdir();
    for src in sources() {
        let (alloc, size, line) = transient_alloc(&src, 1 << 10);
        assert!(size < 64 << 10, "{}: a few KiB, not {size} B", src.name);
        let leak = Extra::KeepBlock { alloc };
        let late = dump(&src, &Job::steady(8).with(leak), dir.path(), "late");
        names_alone(&trend(&[&late]), &line, size, &src.name);
        let early = dump(&src, &Job::steady(3).with(leak), dir.path(), "early");
        let report = compare_json(&early, &late);
        assert_eq!(report["leaked_bytes"], 5 * size, "{}: {report:#}", src.name);
        assert_eq!(
            line_of(&report["groups"][0]),
            line,
            "{}: {report:#}",
            src.name
        );
    }
}

#[test]
fn one_block_that_grows_is_a_leak_and_a_periodic_site_is_not() {
    let dir = tempdir();
    for src in sources() {
        let (alloc, _, line) = transient_alloc(&src, 0);
        let stack = trace_of(&src.snap, src.device)[alloc].stack.unwrap();
        let grow = Job::steady(8).with(Extra::GrowOneBlock {
            stack,
            bytes: 48 << 10,
        });
        let report = trend(&[&dump(&src, &grow, dir.path(), "grow")]);
        names_alone(&report, &line, 48 << 10, &format!("{} grows", src.name));
        // The first checkpoint is the start of the first step, before the block.
        let blocks = &suspects(&report)[0]["blocks"].as_array().unwrap()[1..];
        assert!(
            blocks.iter().all(|b| b == 1),
            "{}: one block all along: {report:#}",
            src.name
        );

        // Filled every step, emptied every 8th, and the run ends on a
        // long rising edge (6 of 8 filled), where the floor of the last
        // checkpoints rises at every one of them.
        let periodic = Job::steady(14).with(Extra::Periodic {
            stack,
            bytes: 256 << 10,
            period: 8,
        });
        let report = trend(&[&dump(&src, &periodic, dir.path(), "periodic")]);
        no_suspect(&report, &format!("{} periodic", src.name));
    }
}

#[test]
fn a_leak_that_grows_once_an_epoch_is_named_and_three_one_time_allocations_are_not() {
    let dir = tempdir();
    for src in sources().into_iter().take(2) {
        let (alloc, _, line) = transient_alloc(&src, 0);
        let stack = trace_of(&src.snap, src.device)[alloc].stack.unwrap();
        let bytes = 40 << 10;
        for every in [2, 4, 8, 25] {
            // Five rises after the first epoch's warm-up, and a part epoch.
            let iterations = (6 * every + every / 2).max(24);
            let per_epoch = Job::steady(iterations).with(Extra::Staircase {
                stack,
                bytes,
                every,
            });
            let case = format!("{} every {every}", src.name);
            let report = trend(&[&dump(&src, &per_epoch, dir.path(), &case)]);
            let found = suspects(&report);
            assert_eq!(found.len(), 1, "{case}: {report:#}");
            assert_eq!(line_of(&found[0]), line, "{case}: {report:#}");
        }
        let three = Job::steady(48).with(Extra::OneTimeAt {
            stack,
            bytes,
            at: [10, 25, 40],
        });
        let report = trend(&[&dump(&src, &three, dir.path(), "three")]);
        no_suspect(&report, &format!("{} three one-time allocations", src.name));
    }
}

#[test]
fn a_single_pass_gets_no_verdict_and_one_leaking_rank_is_told_apart() {
    let dir = tempdir();
    for (i, src) in sources().into_iter().enumerate() {
        let (alloc, size, line) = transient_alloc(&src, 64 << 10);
        let once = Job {
            step_marks: false,
            ..Job::steady(1).with(Extra::KeepBlock { alloc })
        };
        let report = trend(&[&dump(&src, &once, dir.path(), "once")]);
        no_suspect(&report, &format!("{} single pass", src.name));
        // The one-step training and the notebook fine-tune are single
        // passes; the other traces repeat within themselves (forward
        // passes, a generation loop) and are cut there.
        let single = [
            "cs336-medium-128-training.pickle",
            "ftcourse-finetune.pickle",
        ];
        if single.contains(&src.name.as_str()) {
            assert!(
                report["notes"][0]
                    .as_str()
                    .unwrap()
                    .starts_with("no verdict"),
                "{}: {report:#}",
                src.name
            );
        } else {
            assert_ne!(report["checkpoint_source"], "evenly_spaced", "{}", src.name);
        }

        let steady = dump(&src, &Job::steady(8), dir.path(), "rank0-step8");
        let leaking = Job::steady(8).with(Extra::KeepBlock { alloc });
        let leaking = dump(&src, &leaking, dir.path(), "rank1-step8");
        let report = trend_report(&[&steady, &leaking]);
        let processes = report["processes"].as_array().unwrap();
        assert_eq!(processes.len(), 2, "{}: {report:#}", src.name);
        assert_eq!(processes[0]["process"], "rank0", "{report:#}");
        no_suspect(&processes[0]["trend"], &format!("{} rank 0", src.name));
        names_alone(
            &processes[1]["trend"],
            &line,
            size,
            &format!("{} rank 1", src.name),
        );
        assert_eq!(
            report["notes"][0]
                .as_str()
                .map(|n| n.starts_with("rank1 shows growth")),
            Some(true),
            "{report:#}"
        );
        let text = snapdiff(["trend".as_ref(), steady.as_os_str(), leaking.as_os_str()])
            .expect_code(0)
            .stdout();
        assert!(
            text.starts_with("snapshots of 2 processes (rank0, rank1): each is judged on its own"),
            "{text}"
        );
        assert!(text.contains("\nrank1:\n"), "{text}");
        assert!(
            text.contains("note: rank1 shows growth and the other processes do not"),
            "{text}"
        );

        // Files whose names say nothing of their process are told apart by
        // the process id they record.
        if i == 0 {
            let a = dump_as_process(&src, &Job::steady(8), dir.path(), "a", 100);
            let leaking = Job::steady(8).with(Extra::KeepBlock { alloc });
            let b = dump_as_process(&src, &leaking, dir.path(), "b", 200);
            let report = trend_report(&[&a, &b]);
            let processes = report["processes"].as_array().unwrap();
            let names: Vec<&Value> = processes.iter().map(|p| &p["process"]).collect();
            assert_eq!(names, ["pid100", "pid200"], "{report:#}");
            no_suspect(&processes[0]["trend"], "pid 100");
            names_alone(&processes[1]["trend"], &line, size, "pid 200");
            // compare does not judge them as one job either: two runs,
            // site by site.
            let runs = compare_json(&a, &b)["runs"].clone();
            assert_eq!(runs["count"], 2, "{runs}");
            assert_eq!(runs["told_by"], "different processes: pid100 and pid200");
        }
    }
}

#[test]
fn a_leak_that_ends_out_of_memory_is_named_with_the_request_that_failed() {
    let dir = tempdir();
    for src in sources() {
        // A leak of a real transient block each step (of 16 MiB or more
        // where the trace has one, else 1 MiB or more), on
        // a device with room for 8 steps of it beyond the most the job's
        // first step reserved (the allocator's cache absorbs some more).
        let (alloc, size, line) =
            find_transient_alloc(&src, 16 << 20).unwrap_or_else(|| transient_alloc(&src, 1 << 20));
        let job = Job {
            headroom: Some(8 * size),
            ..Job::steady(300).with(Extra::KeepBlock { alloc })
        };
        let (snapshot, failed) = job.run_to_oom(&src.snap, src.device);
        let failed = failed
            .unwrap_or_else(|| panic!("{}: no out-of-memory error, leaking {size} B", src.name));
        let file = write(dir.path(), &format!("{}-oom.snap", src.name), &snapshot);
        let report = snapdiff(["oom".as_ref(), file.as_os_str(), "--json".as_ref()])
            .expect_code(0)
            .json();
        let case = &src.name;
        let devices = report["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1, "{case}: {report:#}");
        let o = &devices[0];
        // The request that failed, as the allocator's error gave it.
        assert_eq!(o["requested_bytes"], failed.requested, "{case}");
        if let Some(expected) = failed.stack.and_then(|s| user_line(&src.snap, s)) {
            assert_eq!(line_of(&o["request"]), expected, "{case}: {o:#}");
        }
        // What grew: the leaking line, and the request fits without it.
        let grew = o["grew"].as_array().unwrap();
        assert!(!grew.is_empty(), "{case}: {o:#}");
        assert_eq!(line_of(&grew[0]), line, "{case}: {o:#}");
        assert_eq!(o["fits_without_growth"], true, "{case}: {o:#}");
        // The dump is the error's: its free pieces are known, so whether
        // the request would have fit in one piece is too (the kept blocks
        // pin segments, so the free memory is often in pieces).
        assert!(o["cache"].is_object(), "{case}: {o:#}");
        assert!(
            o["fits_without_fragmentation"].is_boolean(),
            "{case}: {o:#}"
        );
        // What held the memory: the leaking line, with at least what grew.
        let held = o["sites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| line_of(s) == line)
            .unwrap_or_else(|| panic!("{case}: the leaking line holds memory: {o:#}"));
        assert!(
            held["bytes"].as_u64() >= grew[0]["growth_bytes"].as_u64(),
            "{case}: {o:#}"
        );
    }
}

#[test]
fn each_step_of_a_leaking_job_retains_the_leak_at_its_line() {
    let dir = tempdir();
    for src in sources() {
        let (alloc, size, line) = transient_alloc(&src, 64 << 10);
        let job = Job::steady(6).with(Extra::KeepBlock { alloc });
        let file = dump(&src, &job, dir.path(), "steps");
        let report = snapdiff(["steps".as_ref(), file.as_os_str(), "--json".as_ref()])
            .expect_code(0)
            .json();
        let case = &src.name;
        let device = &report["devices"][0];
        assert_eq!(device["source"], "step_marks", "{case}: {report:#}");
        let steps = device["steps"].as_array().unwrap();
        let numbers: Vec<u64> = steps.iter().map(|s| s["step"].as_u64().unwrap()).collect();
        assert_eq!(numbers, [0, 1, 2, 3, 4, 5], "{case}");
        // After the first step (which also frees what was live before the
        // trace), every step keeps exactly the leaked block, at its line.
        for s in &steps[1..] {
            assert_eq!(s["retained_bytes"], size, "{case}: {s:#}");
            assert_eq!(line_of(&s["retained_by"][0]), line, "{case}: {s:#}");
            assert_eq!(s["retained_by"][0]["bytes"], size, "{case}: {s:#}");
        }
        // The peak rises by the leak, and the growing site explains it.
        assert_eq!(device["peak_growth"], 4 * size, "{case}: {device:#}");
        assert_eq!(
            device["explained_by_growth"],
            4 * size,
            "{case}: {device:#}"
        );
        // `peak` says how much of its peak the growing site holds.
        let peak = snapdiff(["peak".as_ref(), file.as_os_str(), "--json".as_ref()])
            .expect_code(0)
            .json();
        let growth = &peak["devices"][0]["growth"];
        let grew = growth["growth_bytes"].as_u64().unwrap();
        assert!(grew > 0 && grew % size == 0, "{case}: {growth:#}");
        // The peak may come early (the first step also frees what was
        // live before the trace), holding fewer of the kept blocks.
        let held = growth["held_bytes"].as_u64().unwrap();
        assert!(
            held > 0 && held % size == 0 && held <= grew + size,
            "{case}: {growth:#}"
        );
    }
}
