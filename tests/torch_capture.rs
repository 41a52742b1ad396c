//! `snapdiff capture` of real PyTorch programs: `tests/support/torch_train.py`
//! trained on the CPU with the real `torch` from PyPI, recorded by the CPU
//! recorder, with DataLoader workers, ranks, signals and crashes; the CUDA
//! path of the hook through `tests/support/cuda_standin`, which stands in for
//! the CUDA calls only.
//!
//! Without torch these tests skip with one line, unless
//! `SNAPDIFF_REQUIRE_TORCH=1` (set by `.ci/run`) makes them fail.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{
    Run, leaking_training_job, python_script, root, shared_torch, snapdiff, snapdiff_with_env,
    tempdir,
};

const SNAPDIFF: &str = env!("CARGO_BIN_EXE_snapdiff");

/// Whether `python3` imports the real torch; asked once.
pub(crate) fn torch_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    let ready = *READY.get_or_init(|| {
        Command::new("python3")
            .args(["-c", "import torch, numpy"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !ready {
        assert!(
            std::env::var_os("SNAPDIFF_REQUIRE_TORCH").is_none(),
            "python3 cannot import torch and numpy, and SNAPDIFF_REQUIRE_TORCH says it must"
        );
        crate::util::skip("torch", "pip install torch numpy");
    }
    ready
}

/// A snapshot PyTorch wrote on a GPU, when torch and `../shared` are both there.
fn torch_and_a_real_snapshot() -> Option<PathBuf> {
    torch_ready()
        .then(|| shared_torch("snapviewer-memory.pickle"))
        .flatten()
}

/// Asserts that, for each of `ends`, some dump's name ends with it.
fn assert_dumped(files: &[String], ends: &[&str]) {
    for end in ends {
        assert!(files.iter().any(|n| n.ends_with(end)), "{end}: {files:?}");
    }
}

pub(crate) fn script() -> PathBuf {
    root().join("tests/support/torch_train.py")
}

/// The line of the training script marked `leaks with --leak KIND`.
pub(crate) fn leak_line(kind: &str) -> u64 {
    let marker = format!("leaks with --leak {kind}");
    let text = std::fs::read_to_string(script()).unwrap();
    text.lines().position(|l| l.ends_with(&marker)).unwrap() as u64 + 1
}

/// The `snapdiff capture` command line for the training script.
pub(crate) fn capture_args(out: &Path, flags: &[&str], script_args: &[&str]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["capture".into(), "-o".into(), out.into()];
    args.extend(flags.iter().map(Into::into));
    args.extend(["--".into(), "python3".into(), script().into()]);
    args.extend(script_args.iter().map(Into::into));
    args
}

/// Captures the training script to completion.
pub(crate) fn capture(out: &Path, flags: &[&str], script_args: &[&str]) -> Run {
    snapdiff(capture_args(out, flags, script_args))
}

/// Starts the capture of the training script without waiting for it.
fn start_capture(out: &Path, flags: &[&str], script_args: &[&str]) -> Child {
    Command::new(SNAPDIFF)
        .args(capture_args(out, flags, script_args))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Snapshot pickles in `dir`, by name.
pub(crate) fn pickles(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "pickle"));
    files.sort();
    files
}

fn names(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

fn manifest(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("manifest.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn trend_json(files: &[PathBuf]) -> Value {
    let mut args: Vec<OsString> = vec!["trend".into(), "--json".into()];
    args.extend(files.iter().map(|f| f.clone().into_os_string()));
    snapdiff(args).expect_code(0).one_trend()
}

/// The pid of the job that wrote the first dump in `dir`, once its line is
/// in the manifest (written just after the dump).
fn first_pid(dir: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap_or_default();
        let pid = text
            .lines()
            .next()
            .and_then(|l| serde_json::from_str::<Value>(l).ok())
            .and_then(|entry| entry["pid"].as_i64());
        if let Some(pid) = pid {
            return pid as i32;
        }
        assert!(
            Instant::now() < deadline,
            "no manifest line within a minute"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Fails if `dir` holds a hidden file: a temporary a killed job left.
fn assert_no_temporary_files(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.iter().all(|n| !n.starts_with('.')),
        "temporary files left: {left:?}"
    );
}

/// Waits until `dir` holds a pickle (the job is past its first dump).
fn wait_for_first_dump(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while pickles(dir).is_empty() {
        assert!(Instant::now() < deadline, "no snapshot within a minute");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `child`, failing (and killing it) if it takes over two minutes:
/// a hung job is what some of these tests are about.
pub(crate) fn wait_bounded(mut child: Child) -> std::process::Output {
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the captured job hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn growth_outside_the_recorded_memory_is_said_and_a_steady_job_is_not_flagged() {
    if !torch_ready() {
        return;
    }
    // A CPU job whose tensors hold still while it keeps a 16 MiB numpy array
    // each step: no recorded site grows, the process does.
    let dir = tempdir();
    let out = dir.path().join("out");
    let run = capture(
        &out,
        &["--every", "1"],
        &["--steps", "12", "--leak", "numpy-list"],
    );
    run.expect_code(0);
    let report = run.stdout();
    assert!(
        report.contains("no site's memory keeps growing, but memory outside the sites does:"),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("the process's resident memory grew ")
                && l.contains("the growth is outside what snapdiff records (numpy arrays")),
        "{report}"
    );
    let trend = trend_json(std::slice::from_ref(&out));
    assert_eq!(trend["suspects"], serde_json::json!([]), "{trend:#}");
    let process = &trend["outside"]["process"];
    assert_eq!(process["grows"], true, "{trend:#}");
    assert_eq!(trend["outside"]["recorded_on_cpu"], true);
    // Ten steps after the warm-up dump, 16 MiB each; the process's own
    // heap moves around that by a few MiB.
    let growth = process["growth_bytes"].as_i64().unwrap();
    let expected = 10 * (16 << 20);
    assert!(
        (growth - expected).abs() < 16 << 20,
        "{growth} outside, {expected} kept: {trend:#}"
    );
    let per_step = process["growth_per_step"].as_f64().unwrap();
    assert!(
        (per_step - f64::from(16 << 20)).abs() < f64::from(2 << 20),
        "{per_step}"
    );
    // Every line of the manifest says what it measured.
    for entry in manifest(&out) {
        assert!(entry["rss_bytes"].as_u64().unwrap() > 50 << 20, "{entry}");
    }
    // The page carries the same line (tests/report.rs opens pages in a browser).
    let page = dir.path().join("page.html");
    snapdiff([
        "report".as_ref(),
        out.as_os_str(),
        "-o".as_ref(),
        page.as_os_str(),
    ])
    .expect_code(0);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("the growth is outside what snapdiff records"));
    // fleet says it of the rank, from the snapshots and from its tables.
    let tables = dir.path().join("tables");
    snapdiff([
        "export".as_ref(),
        out.as_os_str(),
        "-o".as_ref(),
        tables.as_os_str(),
    ])
    .expect_code(0);
    for input in [&out, &tables] {
        let fleet = snapdiff(["fleet".as_ref(), input.as_os_str()])
            .expect_code(0)
            .stdout();
        assert!(
            fleet.contains("memory outside the recorded sites keeps growing on pid")
                && fleet.contains("the growth is outside what snapdiff records"),
            "{fleet}"
        );
    }

    // The same job without the arrays: nothing outside grows, nothing said.
    let dir = tempdir();
    let out = dir.path().join("out");
    let run = capture(&out, &["--every", "1"], &["--steps", "12"]);
    run.expect_code(0);
    let report = run.stdout();
    assert!(
        report.contains("no site's memory keeps growing: nothing here looks like a leak"),
        "{report}"
    );
    assert!(!report.contains("resident memory"), "{report}");
    let trend = trend_json(&[out]);
    assert_eq!(trend["outside"]["process"]["grows"], false, "{trend:#}");
}

#[test]
fn each_leak_in_real_torch_is_named_at_its_line_with_its_growth_per_step() {
    if !torch_ready() {
        return;
    }
    // Growth per step, from the tensors each leak keeps: two 64-float
    // tensors of the running state's graph, one float loss, a 32x64 copy.
    let cases = [
        ("hidden-state", 512.0),
        ("loss-list", 4.0),
        ("cache-dict", 8192.0),
    ];
    for (kind, per_step) in cases {
        let dir = tempdir();
        let out = dir.path().join("out");
        let run = capture(&out, &["--every", "5", "--no-report"], &["--leak", kind]);
        run.expect_code(0);
        assert!(
            run.stderr()
                .contains("torch sees no CUDA device; recording CPU tensors"),
            "{}",
            run.stderr()
        );
        let files = pickles(&out);
        let step_dumps: Vec<String> = (1..=6).map(|i| format!("step{}.pickle", i * 5)).collect();
        for name in &step_dumps {
            assert!(
                names(&files)
                    .iter()
                    .any(|n| n.ends_with(&format!("-{name}"))),
                "{kind}: {name} in {files:?}"
            );
        }
        let report = trend_json(&files);
        let suspects = report["suspects"].as_array().unwrap();
        assert_eq!(suspects.len(), 1, "{kind}: {report:#}");
        let culprit = &suspects[0]["culprit"];
        assert!(
            culprit["file"]
                .as_str()
                .unwrap()
                .ends_with("torch_train.py"),
            "{kind}: {culprit}"
        );
        assert_eq!(culprit["line"], leak_line(kind), "{kind}: {culprit}");
        assert_eq!(suspects[0]["growth_per_step"], per_step, "{kind}");
        let first = &report["points"][0];
        assert_eq!(first["step"], 5, "ordered by the manifest's steps");
    }

    // The same job without a leak, with SGD this time: nothing reported.
    let dir = tempdir();
    let out = dir.path().join("out");
    let run = capture(&out, &["--every", "5"], &["--optimizer", "sgd"]);
    let stdout = run.expect_code(0).stdout();
    assert!(
        stdout.contains("no site's memory keeps growing"),
        "{stdout}"
    );
    // Each dump says how long it held the job, and capture adds them up.
    let dumps = manifest(&out);
    assert!(
        dumps
            .iter()
            .all(|e| e["seconds"].as_f64().is_some_and(|s| s >= 0.0)),
        "{dumps:?}"
    );
    let held = format!("({} dumps, the longest ", dumps.len());
    assert!(
        stdout.contains("dumping held the job for ") && stdout.contains(&held),
        "{stdout}"
    );
    assert_eq!(
        trend_json(&pickles(&out))["suspects"],
        serde_json::json!([])
    );
}

/// A project cloned into a folder named like a library (`git clone` of
/// this repository makes `snapdiff/`; people train from `lightning/`,
/// `torch/` and `transformers/` checkouts) keeps its own lines.
#[test]
fn a_job_in_a_folder_named_like_a_library_is_named_at_its_own_line() {
    if !torch_ready() {
        return;
    }
    for checkout in ["snapdiff", "lightning", "torch"] {
        let dir = tempdir();
        let project = dir.path().join(checkout);
        std::fs::create_dir(&project).unwrap();
        let job = project.join("torch_train.py");
        std::fs::copy(script(), &job).unwrap();
        let out = dir.path().join("out");
        let mut args: Vec<OsString> = vec!["capture".into(), "-o".into(), out.clone().into()];
        args.extend(["--every", "5", "--no-report", "--", "python3"].map(OsString::from));
        args.push(job.clone().into());
        args.extend(["--leak", "cache-dict"].map(OsString::from));
        // Run from inside the checkout, as people do.
        let run = Command::new(SNAPDIFF)
            .args(&args)
            .current_dir(&project)
            .output()
            .unwrap();
        assert!(run.status.success(), "{checkout}: {run:?}");
        let report = trend_json(&pickles(&out));
        let culprit = &report["suspects"][0]["culprit"];
        assert_eq!(
            culprit["file"].as_str(),
            job.to_str(),
            "{checkout}: {report:#}"
        );
        assert_eq!(culprit["line"], leak_line("cache-dict"), "{checkout}");
    }
}

/// Captures `script` (a copy of the training script) with `args`; the
/// dump of step 30.
fn step30_of(script: &Path, out: &Path, args: &[&str]) -> PathBuf {
    let mut command: Vec<OsString> = vec!["capture".into(), "-o".into(), out.into()];
    command.extend(["--every", "5", "--no-report", "--", "python3"].map(OsString::from));
    command.push(script.into());
    command.extend(args.iter().map(OsString::from));
    snapdiff(command).expect_code(0);
    let dump = pickles(out)
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with("-step30.pickle"));
    dump.unwrap_or_else(|| panic!("no step 30 in {:?}", pickles(out)))
}

/// Two runs of two versions of a real torch job: code that only moved is
/// the same sites, net 0; one real change is named at its line with its
/// bytes, with where it was. Copied away from their manifest and renamed,
/// the files are still two runs: almost no block is where the other has it.
#[test]
fn compare_of_two_runs_matches_moved_code_and_names_the_one_real_change() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let original = std::fs::read_to_string(script()).unwrap();
    let moved_dir = d.join("moved");
    std::fs::create_dir(&moved_dir).unwrap();
    // Two lines above every allocation, and another file name in another folder.
    let moved = moved_dir.join("fit.py");
    std::fs::write(
        &moved,
        format!("# a copy\nimport os  # moved down\n{original}"),
    )
    .unwrap();
    let larger = moved_dir.join("fit_larger.py");
    let state = "    state = torch.ones(64, device=on)";
    assert!(original.contains(state));
    let changed = original.replace(state, "    state = torch.ones(4096, device=on)");
    std::fs::write(
        &larger,
        format!("# a copy\nimport os  # moved down\n{changed}"),
    )
    .unwrap();

    let base = step30_of(&script(), &d.join("base"), &[]);
    let same = step30_of(&moved, &d.join("same"), &[]);
    let big = step30_of(&larger, &d.join("big"), &[]);

    let cmp = |a: &Path, b: &Path| {
        snapdiff([
            "compare".as_ref(),
            "--json".as_ref(),
            a.as_os_str(),
            b.as_os_str(),
        ])
        .expect_code(0)
        .json()
    };
    let moved_only = cmp(&base, &same);
    assert_eq!(moved_only["runs"]["count"], 2, "{moved_only:#}");
    assert_eq!(
        moved_only["groups"],
        serde_json::json!([]),
        "{moved_only:#}"
    );
    assert_eq!(moved_only["grown"]["bytes"], 0);
    assert_eq!(moved_only["shrunk"]["bytes"], 0);
    let text = snapdiff(["compare".as_ref(), base.as_os_str(), same.as_os_str()])
        .expect_code(0)
        .stdout();
    assert!(text.contains("moved in the code"), "{text}");
    assert!(!text.contains("different programs"), "{text}");

    let one_change = cmp(&base, &big);
    let groups = one_change["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{one_change:#}");
    let line = changed
        .lines()
        .position(|l| l.contains("torch.ones(4096"))
        .unwrap()
        + 3;
    assert_eq!(groups[0]["culprit"]["line"], line, "{one_change:#}");
    assert!(
        groups[0]["culprit"]["file"]
            .as_str()
            .unwrap()
            .ends_with("fit_larger.py")
    );
    assert_eq!(groups[0]["delta_bytes"], (4096 - 64) * 4);
    assert_eq!(groups[0]["moved_from"]["culprit"]["line"], line - 2);
    // The peaks inside the two traces, as `peak` finds each.
    let peak_of = |f: &Path| {
        snapdiff(["peak".as_ref(), f.as_os_str(), "--json".as_ref()]).json()["devices"][0]
            ["allocated_bytes"]
            .clone()
    };
    assert_eq!(one_change["peak_before"], peak_of(&base), "{one_change:#}");
    assert_eq!(one_change["peak_after"], peak_of(&big), "{one_change:#}");
    assert!(
        one_change["peak_after"].as_u64() > one_change["peak_before"].as_u64(),
        "{one_change:#}"
    );
    let text = snapdiff(["compare".as_ref(), base.as_os_str(), big.as_os_str()])
        .expect_code(0)
        .stdout();
    assert!(
        text.lines().nth(1).unwrap_or("").contains(", peak "),
        "{text}"
    );
    assert_eq!(
        one_change["allocated_after"].as_i64().unwrap()
            - one_change["allocated_before"].as_i64().unwrap(),
        one_change["grown"]["bytes"].as_i64().unwrap()
            - one_change["shrunk"]["bytes"].as_i64().unwrap(),
        "the net change is the split's: {one_change:#}"
    );

    // Away from their manifests, under names that say nothing.
    let plain = d.join("plain");
    std::fs::create_dir(&plain).unwrap();
    let (a, b) = (plain.join("a.pickle"), plain.join("b.pickle"));
    std::fs::copy(&base, &a).unwrap();
    std::fs::copy(&big, &b).unwrap();
    let renamed = cmp(&a, &b);
    assert_eq!(renamed["runs"]["count"], 2, "{renamed:#}");
    assert!(
        renamed["runs"]["told_by"]
            .as_str()
            .unwrap()
            .contains("live blocks of the second"),
        "{renamed:#}"
    );
    // The same rows, less what the owners files beside the dumps (not
    // copied) said.
    let without_owners = |report: &Value| {
        let mut groups = report["groups"].clone();
        for g in groups.as_array_mut().unwrap() {
            g.as_object_mut().unwrap().remove("held_by");
        }
        groups
    };
    assert_eq!(without_owners(&renamed), without_owners(&one_change));
    // Two configurations (another batch size): the net headline is the
    // files' own totals, as CPython computes them, and the split adds up
    // to the net change of the requested bytes: every site is in it.
    let batch = "batch_size=32";
    assert!(original.contains(batch));
    let wider = moved_dir.join("wider.py");
    std::fs::write(&wider, original.replace(batch, "batch_size=64")).unwrap();
    let wide = step30_of(&wider, &d.join("wide"), &[]);
    let configs = cmp(&base, &wide);
    assert_eq!(configs["runs"]["count"], 2, "{configs:#}");
    let totals = |f: &Path| crate::util::python_json("torch_totals.py", &[f]);
    let (ta, tb) = (totals(&base), totals(&wide));
    let net = |field: &str| tb[field].as_i64().unwrap() - ta[field].as_i64().unwrap();
    assert_eq!(
        configs["allocated_after"].as_i64().unwrap()
            - configs["allocated_before"].as_i64().unwrap(),
        net("allocated_bytes"),
        "{configs:#}"
    );
    let split =
        configs["grown"]["bytes"].as_i64().unwrap() - configs["shrunk"]["bytes"].as_i64().unwrap();
    assert_eq!(split, net("requested_bytes"), "{configs:#}");
    assert_ne!(split, 0, "a wider batch holds more: {configs:#}");
    // Two moments of one run stay one run, matched block by block.
    let step10 = pickles(&d.join("base"))
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with("-step10.pickle"))
        .unwrap();
    let one_run = cmp(&step10, &base);
    assert_eq!(one_run["runs"]["count"], 1, "{one_run:#}");
}

/// The memory gate between runs on a real torch job: a baseline of one
/// run; the same code run again gives the same file; a copy whose lines
/// moved, whose file moved and one of whose functions was renamed passes,
/// as does another seed and data order; a copy with one buffer 4 MiB
/// larger fails, naming that line, its bytes and where it was.
#[test]
fn check_against_a_baseline_passes_moved_code_and_names_the_one_real_change() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let original = std::fs::read_to_string(script()).unwrap();
    let copies = d.join("copies");
    std::fs::create_dir(&copies).unwrap();
    let write = |name: &str, text: String| {
        let path = copies.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let moved_text = format!("# a copy\nimport os  # moved down\n{original}")
        .replace("def batches(", "def make_batches(")
        .replace("= batches(", "= make_batches(");
    assert_ne!(moved_text.matches("make_batches(").count(), 0);
    let moved = write("fit.py", moved_text.clone());
    let state = "    state = torch.ones(64, device=on)";
    let larger = write(
        "fit_larger.py",
        moved_text.replace(state, "    state = torch.ones(1 << 20, device=on)"),
    );
    let reseeded = write(
        "reseeded.py",
        original.replace("torch.manual_seed(0)", "torch.manual_seed(1)"),
    );
    let capture = |script: &Path, name: &str| {
        let out = d.join(name);
        step30_of(script, &out, &[]);
        out
    };
    let baseline_of = |run: &Path, name: &str| {
        let file = d.join(name);
        snapdiff([
            "baseline".as_ref(),
            run.as_os_str(),
            "-o".as_ref(),
            file.as_os_str(),
        ])
        .expect_code(0);
        file
    };
    let base = baseline_of(&capture(&script(), "base"), "base.json");
    let again = baseline_of(&capture(&script(), "again"), "again.json");
    let kept = std::fs::read_to_string(&base).unwrap();
    assert_eq!(
        kept,
        std::fs::read_to_string(&again).unwrap(),
        "the same code, the same file"
    );
    assert!(
        !kept.contains(d.to_str().unwrap()) && !kept.contains("/"),
        "{kept}"
    );
    assert!(kept.len() < 50_000, "{} bytes", kept.len());

    let check = |run: &Path| snapdiff(["check".as_ref(), base.as_os_str(), run.as_os_str()]);
    for (script, name) in [(&moved, "moved"), (&reseeded, "reseeded")] {
        let run = check(&capture(script, name));
        let out = run.expect_code(0).stdout();
        assert!(out.starts_with("within "), "{name}: {out}");
    }
    let run = check(&capture(&larger, "larger"));
    let out = run.expect_code(1).stdout();
    let line = moved_text
        .lines()
        .position(|l| l.starts_with(state))
        .unwrap()
        + 1;
    let named = format!("train  fit_larger.py:{line}  at the peak: 256 B -> 4.00 MiB");
    assert!(out.contains(&named), "{out}");
    let was = format!("(was train  torch_train.py:{})", line - 2);
    assert!(out.contains(&was), "{out}");
    assert!(out.contains("device 0 peak allocated"), "{out}");
    // As a CI summary's table; then updated: refused while over, written
    // when an increase is allowed, and the run is within it after.
    let grown = d.join("larger");
    let md = snapdiff([
        "check".as_ref(),
        base.as_os_str(),
        grown.as_os_str(),
        "--format".as_ref(),
        "markdown".as_ref(),
    ]);
    let md = md.expect_code(1).stdout();
    assert!(
        md.contains(&format!(
            "| over | `train  fit_larger.py:{line}` at the peak | 256 B | 4.00 MiB |"
        )),
        "{md}"
    );
    // The page: the run beside its baseline, the changed line over, the
    // lines that only moved marked with where they were.
    let page = d.join("against.html");
    snapdiff([
        "report".as_ref(),
        "--baseline".as_ref(),
        base.as_os_str(),
        grown.as_os_str(),
        "-o".as_ref(),
        page.as_os_str(),
    ])
    .expect_code(0);
    if let Some(browser) = crate::report::chromium() {
        let (dom, console) = crate::report::open(browser, &page, "baseline.png");
        assert!(console.is_empty(), "console: {console:?}");
        assert!(
            dom.contains("figures over the baseline by more than 5% and 1.00 MiB"),
            "{dom}"
        );
        let over = dom
            .split("class=\"baseline-site over moved\"")
            .nth(1)
            .unwrap_or_else(|| panic!("no site over: {dom}"));
        let over = &over[..over.find("</tr>").unwrap()];
        assert!(
            over.contains(&format!("train  fit_larger.py:{line}"))
                && over.contains(&format!("moved from train  torch_train.py:{}", line - 2)),
            "{over}"
        );
        assert!(dom.contains("class=\"baseline-category\""), "{dom}");
    }
    let update = |more: &[&str]| {
        let mut args = vec![
            "check".as_ref(),
            base.as_os_str(),
            grown.as_os_str(),
            "--update".as_ref(),
        ];
        args.extend(more.iter().map(std::ffi::OsStr::new));
        snapdiff(args)
    };
    update(&[]).expect_code(1);
    assert_eq!(
        std::fs::read_to_string(&base).unwrap(),
        kept,
        "refused: unchanged"
    );
    update(&["--allow-increase"]).expect_code(0);
    check(&grown).expect_code(0);
    // A file that is no baseline: one line, exit 2.
    let bad = d.join("bad.json");
    std::fs::write(&bad, "{\"sites\": 3}").unwrap();
    let run = snapdiff([
        "check".as_ref(),
        bad.as_os_str(),
        d.join("base").as_os_str(),
    ]);
    run.expect_code(2);
    assert!(
        run.stderr()
            .contains("bad.json: not a snapdiff baseline file"),
        "{}",
        run.stderr()
    );
}

/// A training step called CALLS times from one loop line: each call keeps
/// 40 MiB at the `# LEAK` line, and the first makes a 180 MiB state that
/// stays flat.
const LEAKING_STEP: &str = "import torch\n\
    kept = []\n\
    state = {}\n\
    def train_step(i):\n\
    \x20   x = torch.ones(10 << 20)\n\
    \x20   y = (x * 2).sum()\n\
    \x20   kept.append(torch.ones(10 << 20))  # LEAK\n\
    \x20   if 'adam' not in state:\n\
    \x20       state['adam'] = torch.zeros(45 << 20)\n\
    \x20   return y\n\
    for i in range(CALLS):\n\
    \x20   train_step(i)\n";

/// The one dump (its exit dump) of `text`, written to `d/NAME.py` and run
/// under `capture -o d/NAME`.
fn exit_dump_of(d: &Path, name: &str, text: &str) -> PathBuf {
    let script = d.join(format!("{name}.py"));
    std::fs::write(&script, text).unwrap();
    let out = d.join(name);
    let mut args: Vec<OsString> = vec!["capture".into(), "-o".into(), out.clone().into()];
    args.extend(["--no-report", "--", "python3"].map(OsString::from));
    args.push(script.into());
    snapdiff(args).expect_code(0);
    let dumps = pickles(&out);
    assert_eq!(dumps.len(), 1, "{dumps:?}");
    dumps[0].clone()
}

/// A copy of the pickle `file` beside it, rewritten by CPython: `change`
/// runs with the snapshot loaded as `s`.
fn rewritten(file: &Path, change: &str) -> PathBuf {
    static COPIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = file.with_extension(format!("rewritten{n}.pickle"));
    let script = format!(
        "import pickle, sys\n\
         s = pickle.load(open(sys.argv[1], 'rb'))\n\
         {change}\
         pickle.dump(s, open(sys.argv[2], 'wb'), protocol=4)\n"
    );
    let done = Command::new("python3")
        .args(["-c", &script])
        .arg(file)
        .arg(&out)
        .status()
        .unwrap();
    assert!(done.success());
    out
}

/// A [`rewritten`] change that gives every event's and block's frames to
/// `stack(frames)`, which `defining` defines.
fn each_stack(defining: &str) -> String {
    format!(
        "{defining}\
         for t in s['device_traces']:\n\
         \x20   for e in t:\n\
         \x20       e['frames'] = stack(e.get('frames') or [])\n\
         for seg in s['segments']:\n\
         \x20   for b in seg['blocks']:\n\
         \x20       b['frames'] = stack(b.get('frames') or [])\n"
    )
}

/// A job's one exit dump, without markers: the trace's own calls are its
/// iterations. A step called three times from one loop line, keeping
/// 40 MiB a call beside a flat 180 MiB site, is named at its line as a
/// suspect of three (and four) iterations, never the large steady site;
/// ten calls are a verdict. The same trace without times and keys beyond
/// `segments` and `device_traces`, with C++-heavy and C++-only stacks, is
/// named alike.
#[test]
fn iterations_are_found_from_the_traces_own_calls() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let step = LEAKING_STEP;
    let leak_line = step.lines().position(|l| l.ends_with("# LEAK")).unwrap() + 1;
    let run =
        |calls: u32, name: &str| exit_dump_of(d, name, &step.replace("CALLS", &calls.to_string()));
    let three = run(3, "three");
    let report = trend_json(std::slice::from_ref(&three));
    assert_eq!(report["checkpoint_source"], "calls", "{report:#}");
    let suspects = report["suspects"].as_array().unwrap();
    assert_eq!(
        suspects.len(),
        1,
        "the 180 MiB steady site is no suspect: {report:#}"
    );
    assert_eq!(suspects[0]["culprit"]["line"], leak_line);
    assert_eq!(suspects[0]["growth_per_step"], 40.0 * 1024.0 * 1024.0);
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("only 3 iterations found in the trace: a suspect, not a verdict"),
        "{notes}"
    );
    // --max-growth follows the suspect.
    snapdiff([
        "trend".as_ref(),
        three.as_os_str(),
        "--max-growth".as_ref(),
        "1MiB".as_ref(),
    ])
    .expect_code(1);

    // The same trace without times (as torch_npu writes them): the same
    // line and bytes a step, and no figure per second, said so.
    // Only `segments` and `device_traces`, as a non-CUDA backend writes them.
    let timeless = rewritten(
        &three,
        "s = {k: s[k] for k in ('segments', 'device_traces')}\n\
         [e.pop('time_us', None) for t in s['device_traces'] for e in t]\n",
    );
    let mut args: Vec<OsString> = vec!["trend".into(), timeless.into()];
    args.extend(["--json", "--device-memory", "8GiB"].map(OsString::from));
    let report = snapdiff(args).expect_code(0).one_trend();
    assert_eq!(
        report["suspects"][0]["culprit"]["line"], leak_line,
        "{report:#}"
    );
    assert_eq!(
        report["suspects"][0]["growth_per_step"],
        40.0 * 1024.0 * 1024.0
    );
    assert_eq!(report["growth_per_second"], Value::Null, "{report:#}");
    assert_eq!(report["seconds_to_full"], Value::Null, "{report:#}");
    assert!(
        report["notes"]
            .to_string()
            .contains("the trace records no times"),
        "{report:#}"
    );

    // The same trace with C++-heavy stacks, as PyTorch records them with
    // `stacks="all"`: the allocator's and ATen's frames innermost, and the
    // interpreter's between each two Python frames. The same line and bytes.
    let native = rewritten(
        &three,
        &each_stack(
            "def cxx(name, lib):\n\
             \x20   return {'name': name, 'filename': '/opt/venv/lib/python3.11/site-packages/torch/lib/' + lib, 'line': 0}\n\
             inner = [cxx('c10::alloc_cpu(unsigned long)', 'libc10.so'),\n\
             \x20        cxx('at::native::empty_cpu(c10::ArrayRef<long>)', 'libtorch_cpu.so'),\n\
             \x20        cxx('at::_ops::ones::call(c10::ArrayRef<c10::SymInt>)', 'libtorch_cpu.so')]\n\
             interp = {'name': '_PyEval_EvalFrameDefault', 'filename': '/usr/bin/python3.11', 'line': 0}\n\
             outer = [{'name': 'Py_RunMain', 'filename': '/usr/bin/python3.11', 'line': 0},\n\
             \x20        {'name': '__libc_start_main', 'filename': '/usr/lib/x86_64-linux-gnu/libc.so.6', 'line': 0}]\n\
             def stack(frames):\n\
             \x20   out = list(inner)\n\
             \x20   for f in frames:\n\
             \x20       out += [f, dict(interp)]\n\
             \x20   return out + outer\n",
        ),
    );
    let report = trend_json(std::slice::from_ref(&native));
    assert_eq!(report["checkpoint_source"], "calls", "{report:#}");
    let suspects = report["suspects"].as_array().unwrap();
    assert_eq!(suspects.len(), 1, "{report:#}");
    assert_eq!(suspects[0]["culprit"]["line"], leak_line, "{report:#}");
    assert_eq!(suspects[0]["growth_per_step"], 40.0 * 1024.0 * 1024.0);

    // And with C++ frames only (a libtorch program: its own functions in
    // .cpp files, no Python): cut at the same calls, the same line.
    let cpp = rewritten(
        &three,
        &each_stack(
            "import os\n\
             def stack(frames):\n\
             \x20   out = [{'name': 'c10::alloc_cpu(unsigned long)', 'filename': '/opt/libtorch/lib/libc10.so', 'line': 0}]\n\
             \x20   for f in frames:\n\
             \x20       name = 'main' if f['name'] == '<module>' else f['name'] + '(int)'\n\
             \x20       base = os.path.basename(f['filename']).replace('.py', '.cpp')\n\
             \x20       out.append({'name': name, 'filename': '/home/ana/trainer/' + base, 'line': f['line']})\n\
             \x20   return out\n",
        ),
    );
    let report = trend_json(std::slice::from_ref(&cpp));
    assert_eq!(report["checkpoint_source"], "calls", "{report:#}");
    let suspects = report["suspects"].as_array().unwrap();
    assert_eq!(suspects.len(), 1, "{report:#}");
    assert_eq!(suspects[0]["culprit"]["line"], leak_line, "{report:#}");
    assert_eq!(suspects[0]["growth_per_step"], 40.0 * 1024.0 * 1024.0);

    // Four calls: still a suspect, said as such.
    let four = run(4, "four");
    let report = trend_json(std::slice::from_ref(&four));
    assert_eq!(report["checkpoint_source"], "calls", "{report:#}");
    assert_eq!(
        report["suspects"].as_array().unwrap().len(),
        1,
        "{report:#}"
    );
    assert_eq!(report["suspects"][0]["culprit"]["line"], leak_line);
    assert!(
        report["notes"]
            .to_string()
            .contains("only 4 iterations found in the trace: a suspect, not a verdict"),
        "{report:#}"
    );

    // Ten calls: a verdict.
    let ten = run(10, "ten");
    let report = trend_json(std::slice::from_ref(&ten));
    assert_eq!(report["checkpoint_source"], "calls", "{report:#}");
    assert_eq!(
        report["suspects"][0]["culprit"]["line"], leak_line,
        "{report:#}"
    );
    assert!(
        !report["notes"]
            .to_string()
            .contains("a suspect, not a verdict"),
        "{report:#}"
    );
}

/// Two devices in one file (the leaking job's trace on device 0, a steady
/// copy's on device 1, put together by CPython): each is cut at its own
/// calls, and the verdict names the device that leaks.
#[test]
fn two_devices_in_one_file_are_cut_apart_and_the_verdict_names_the_device() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let step = &LEAKING_STEP.replace("CALLS", "6");
    let leak_line = step.lines().position(|l| l.ends_with("# LEAK")).unwrap() + 1;
    let run = |name: &str, text: &str| exit_dump_of(d, name, text);
    let leaking = run("leaking", step);
    let steady = run(
        "steady",
        &step.replace(
            "kept.append(torch.ones(10 << 20))  # LEAK",
            "kept[:] = [torch.ones(10 << 20)]",
        ),
    );
    let both = d.join("both.pickle");
    let join = "import pickle, sys\n\
        a = pickle.load(open(sys.argv[1], 'rb'))\n\
        b = pickle.load(open(sys.argv[2], 'rb'))\n\
        moved = 1 << 44\n\
        for seg in b['segments']:\n\
        \x20   seg['device'] = 1\n\
        \x20   seg['address'] += moved\n\
        \x20   for block in seg['blocks']:\n\
        \x20       block['address'] += moved\n\
        for e in b['device_traces'][0]:\n\
        \x20   e['addr'] += moved\n\
        a['segments'] += b['segments']\n\
        a['device_traces'] = [a['device_traces'][0], b['device_traces'][0]]\n\
        pickle.dump(a, open(sys.argv[3], 'wb'), protocol=4)\n";
    let done = Command::new("python3")
        .args(["-c", join])
        .arg(&leaking)
        .arg(&steady)
        .arg(&both)
        .status()
        .unwrap();
    assert!(done.success());
    let report = trend_json(std::slice::from_ref(&both));
    assert_eq!(report["checkpoint_source"], "calls", "{report:#}");
    let suspects = report["suspects"].as_array().unwrap();
    assert_eq!(suspects.len(), 1, "{report:#}");
    assert_eq!(suspects[0]["device"], 0, "{report:#}");
    assert_eq!(suspects[0]["culprit"]["line"], leak_line);
    assert_eq!(suspects[0]["growth_per_step"], 40.0 * 1024.0 * 1024.0);
    let notes = report["notes"].to_string();
    assert!(notes.contains("devices 0, 1 were each cut"), "{notes}");
    let text = snapdiff(["trend".as_ref(), both.as_os_str()])
        .expect_code(0)
        .stdout();
    assert!(text.contains("(on device 0)"), "{text}");
}

/// A step is the job's step: one exit dump of a job that evaluates every
/// 10th step is cut at its optimizer's 100 steps (not at the 10-step
/// pattern the evaluation makes), and a wrapped trace ring keeps the
/// steps' real numbers and says once what the window means.
#[test]
fn a_single_dump_is_cut_at_the_jobs_own_optimizer_steps() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let job = "import torch\n\
        torch.manual_seed(0)\n\
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))\n\
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n\
        kept = []\n\
        def evaluate():\n\
        \x20   with torch.no_grad():\n\
        \x20       outs = [model(torch.randn(512, 64)) for _ in range(4)]\n\
        \x20       return sum(o.sum() for o in outs)\n\
        for step in range(STEPS):\n\
        \x20   loss = model(torch.randn(32, 64)).square().mean()\n\
        \x20   optimizer.zero_grad()\n\
        \x20   loss.backward()\n\
        \x20   optimizer.step()\n\
        \x20   kept.append(torch.ones(13 * 256))  # LEAK: 13 KiB a step\n\
        \x20   if step % 10 == 9:\n\
        \x20       evaluate()\n";
    let leak_line = job.lines().position(|l| l.contains("# LEAK")).unwrap() + 1;
    let run = |steps: u32, flags: &[&str]| {
        let name = format!("job{steps}");
        let script = d.join(format!("{name}.py"));
        std::fs::write(&script, job.replace("STEPS", &steps.to_string())).unwrap();
        let out = d.join(&name);
        let mut args: Vec<OsString> = vec!["capture".into(), "-o".into(), out.clone().into()];
        args.extend(flags.iter().map(OsString::from));
        args.extend(["--no-report", "--", "python3"].map(OsString::from));
        args.push(script.into());
        snapdiff(args).expect_code(0);
        let dumps = pickles(&out);
        assert_eq!(dumps.len(), 1, "{dumps:?}");
        dumps[0].clone()
    };
    let dump = run(100, &[]);
    let report = trend_json(std::slice::from_ref(&dump));
    assert_eq!(report["checkpoint_source"], "step_marks", "{report:#}");
    let steps: Vec<u64> = report["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["step"].as_u64().unwrap())
        .collect();
    assert_eq!((steps[0], *steps.last().unwrap()), (0, 100), "{steps:?}");
    assert_eq!(report["suspects"][0]["culprit"]["line"], leak_line);
    assert_eq!(report["suspects"][0]["growth_per_step"], 13.0 * 1024.0);
    let text = snapdiff(["trend".as_ref(), dump.as_os_str()])
        .expect_code(0)
        .stdout();
    assert!(text.contains("; steps 0 to 100;"), "{text}");

    // A ring of 2,000 events over 400 steps keeps the last few dozen.
    let dump = run(400, &["--max-entries", "2000"]);
    let report = trend_json(std::slice::from_ref(&dump));
    assert_eq!(report["checkpoint_source"], "step_marks", "{report:#}");
    let points = report["points"].as_array().unwrap();
    let first = points[0]["step"].as_u64().unwrap();
    assert!(first > 300, "{report:#}");
    assert_eq!(points.last().unwrap()["step"], 400);
    assert_eq!(report["suspects"][0]["growth_per_step"], 13.0 * 1024.0);
    let text = snapdiff(["trend".as_ref(), dump.as_os_str()])
        .expect_code(0)
        .stdout();
    assert_eq!(
        text.matches("ring buffer (max_entries) wrapped").count(),
        1,
        "{text}"
    );
    assert!(!text.contains("before recording began"), "{text}");
}

#[test]
fn cpu_recorder_files_agree_with_pytorchs_reader_and_accounting() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    let accounting = dir.path().join("accounting.json");
    capture(
        &out,
        &["--every", "10", "--no-report"],
        &[
            "--steps",
            "20",
            "--accounting",
            accounting.to_str().unwrap(),
        ],
    )
    .expect_code(0);
    // PyTorch's own reader of snapshots accepts every file, and the last
    // step's snapshot holds each parameter, gradient and optimizer state
    // storage at its address with PyTorch's own size for it.
    let check = r#"
import json, pickle, sys
from torch.cuda import _memory_viz as viz
files, accounting = sys.argv[1:-1], json.load(open(sys.argv[-1]))
for f in files:
    d = pickle.load(open(f, "rb"))
    viz.segsum(d); viz.trace(d); viz.trace_plot(d)
last = pickle.load(open([f for f in files if f.endswith("-step20.pickle")][0], "rb"))
blocks = {b["address"]: b["size"] for s in last["segments"] for b in s["blocks"]}
wrong = {a: (n, blocks.get(int(a))) for a, n in accounting.items() if blocks.get(int(a)) != n}
print(json.dumps({"storages": len(accounting), "wrong": wrong}))
"#;
    let output = Command::new("python3")
        .args(["-c", check])
        .args(pickles(&out))
        .arg(&accounting)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    // 4 parameters, 4 gradients, AdamW's step, exp_avg and exp_avg_sq of each.
    assert_eq!(result["storages"], 20, "{result}");
    assert_eq!(result["wrong"], serde_json::json!({}), "{result}");
}

#[test]
fn cpu_recorder_follows_frees_moves_and_sparse_tensors_as_torch_accounts_them() {
    if !torch_ready() {
        return;
    }
    let run = cpu_recorder_follows_moves(&[], "live_bytes");
    // Inside the allocator, a sparse tensor's parts are storages like any.
    assert!(
        !run.stderr().contains("skips tensors") && !run.stderr().contains("dispatch mode"),
        "{}",
        run.stderr()
    );
}

#[test]
fn dispatch_recorder_follows_frees_moves_and_sparse_tensors_where_no_compiler_is() {
    if !torch_ready() {
        return;
    }
    // No compiler and nothing built before: the recorder falls back to a
    // dispatch mode, saying so, and sees every storage but sparse parts.
    let cache = tempdir();
    let run = cpu_recorder_follows_moves(
        &[
            ("CXX", "/nonexistent/c++".as_ref()),
            ("XDG_CACHE_HOME", cache.path().as_os_str()),
        ],
        "strided_bytes",
    );
    for said in [
        "cannot build the CPU allocator hook",
        "skips tensors without a plain storage",
    ] {
        assert!(run.stderr().contains(said), "{}", run.stderr());
    }
}

/// Captures `torch_moves.py` under `env` and checks its dumps against
/// PyTorch's own accounting (`live` names which of its figures the last
/// dump's live bytes must equal): temporaries freed at once, a tensor
/// grown by `resize_` (the leak), a storage swapped by `set_`, and a sparse
/// embedding's backward, which once crashed the job.
fn cpu_recorder_follows_moves(env: &[(&str, &std::ffi::OsStr)], live: &str) -> Run {
    let dir = tempdir();
    let out = dir.path().join("out");
    let accounting = dir.path().join("accounting.json");
    let script = root().join("tests/support/torch_moves.py");
    let mut args: Vec<OsString> = vec!["capture".into(), "-o".into(), out.clone().into()];
    args.extend([
        "--every".into(),
        "2".into(),
        "--no-report".into(),
        "--".into(),
    ]);
    args.extend([
        "python3".into(),
        script.clone().into(),
        accounting.clone().into(),
    ]);
    let run = snapdiff_with_env(&args, env);
    run.expect_code(0);
    let torch: Value =
        serde_json::from_str(&std::fs::read_to_string(&accounting).unwrap()).unwrap();
    let last = out.join(
        names(&pickles(&out))
            .into_iter()
            .find(|n| n.ends_with("-step10.pickle"))
            .unwrap(),
    );
    // The last step's live bytes are PyTorch's own, to the byte: no block
    // left behind at a storage's old place.
    let summary = snapdiff([
        OsString::from("summary"),
        last.clone().into(),
        "--json".into(),
    ])
    .json();
    assert_eq!(summary["allocated_bytes"], torch[live], "{summary} {torch}");
    // The peak is what was live at once, not frees noticed late.
    let peak = snapdiff([OsString::from("peak"), last.clone().into(), "--json".into()]).json();
    let highest = peak["devices"][0]["allocated_bytes"].as_u64().unwrap();
    let bound = torch["peak_bound"].as_u64().unwrap();
    assert!(
        (11 << 20..=bound).contains(&highest),
        "peak {highest} bytes, PyTorch's bound {bound}"
    );
    // Each step (the trace is cut at the job's optimizer steps, not at its
    // dumps every two) keeps the 1 MiB `resize_` adds, named at its line.
    let line = std::fs::read_to_string(&script)
        .unwrap()
        .lines()
        .position(|l| l.contains("# leaks: grows"))
        .unwrap() as u64
        + 1;
    let steps = snapdiff([
        OsString::from("steps"),
        last.clone().into(),
        "--json".into(),
    ])
    .json();
    for step in steps["devices"][0]["steps"].as_array().unwrap() {
        assert_eq!(step["retained_bytes"], 1 << 20, "{step}");
        assert_eq!(step["retained_by"][0]["culprit"]["line"], line, "{step}");
    }
    let report = dir.path().join("report.html");
    let mut report_args: Vec<OsString> = vec!["report".into()];
    report_args.extend(pickles(&out).into_iter().map(PathBuf::into_os_string));
    report_args.extend(["-o".into(), report.clone().into()]);
    snapdiff(&report_args).expect_code(0);
    let trend = trend_json(&pickles(&out));
    let suspect = &trend["suspects"][0];
    assert_eq!(suspect["culprit"]["line"], line, "{trend}");
    assert_eq!(suspect["growth_per_step"], f64::from(1 << 20), "{trend}");
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(
        page.contains(&format!("torch_moves.py\",\"line\":{line}")),
        "the report names the line"
    );
    run
}

/// Runs `capture` (a `snapdiff capture` command) with SIGUSR1 sent to it
/// every 50 ms from 10 ms after it starts until it has exited.
fn under_sigusr1_storm(mut capture: Command) -> std::process::Output {
    let child = capture
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let storm = std::thread::spawn(move || {
        // From the moment capture catches SIGUSR1, the first thing its
        // `main` does: before that, the signal's default action would end
        // any process (on a loaded machine, loading the binary alone can
        // take longer than any fixed wait).
        let catches = || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
            let caught = status.ok().and_then(|s| {
                let mask = s.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
                u64::from_str_radix(mask.trim(), 16).ok()
            });
            caught.map(|mask| mask & (1 << (libc::SIGUSR1 - 1)) != 0)
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while catches() == Some(false) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: signals our own child while it exists.
        while unsafe { libc::kill(pid, libc::SIGUSR1) } == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let output = wait_bounded(child);
    storm.join().unwrap();
    output
}

#[test]
fn sigusr1_to_capture_never_kills_the_job() {
    if !torch_ready() {
        return;
    }
    // A signal every 50 ms from capture's first moment to its end: through
    // `import torch`, the training and interpreter shutdown. The job
    // imports torch 2.5 s after it starts, past capture's 2 s wait for an
    // answer, however fast the machine imports it.
    let dir = tempdir();
    let out = dir.path().join("out");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut job = Command::new(SNAPDIFF);
    job.args(["capture", "-o"])
        .arg(&out)
        .args(["--no-report", "--", "python3", "-c"])
        .arg(
            "import runpy, sys, time\n\
             time.sleep(2.5)\n\
             sys.argv = sys.argv[1:]\n\
             runpy.run_path(sys.argv[0], run_name='__main__')",
        )
        .arg(script())
        .args(["--steps", "20", "--step-seconds", "0.05"])
        .env("TMPDIR", &tmp);
    let output = under_sigusr1_storm(job);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("trained"), "the job finished: {stderr}");
    let files = names(&pickles(&out));
    assert!(files.iter().any(|n| n.contains("-signal")), "{files:?}");
    assert_dumped(&files, &["-step20-exit.pickle"]);
    // Dumps taken off the job's main thread search no owners (the search
    // would race the job's own operators); the exit dump, on it, does.
    for entry in manifest(&out) {
        let file = entry["file"].as_str().unwrap_or_default();
        if file.contains("-signal") {
            assert!(entry.get("owners").is_none(), "{entry}");
        } else if file.ends_with("-exit.pickle") {
            assert!(entry["owners"].is_string(), "{entry}");
        }
    }
    // Requests that came before torch was imported are answered in a line.
    assert!(
        stderr.contains("SIGUSR1: no process of python3 can take a snapshot yet"),
        "{stderr}"
    );
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snapdiff-"))
        .collect();
    assert!(
        left.is_empty(),
        "capture left {left:?} in its temporary folder"
    );

    // A program that never imports torch, signalled throughout.
    let plain = dir.path().join("plain.py");
    std::fs::write(
        &plain,
        "import time\nfor _ in range(30):\n    time.sleep(0.05)\nprint('done')\n",
    )
    .unwrap();
    let mut job = Command::new(SNAPDIFF);
    job.args(["capture", "-o"])
        .arg(&out)
        .args(["--no-report", "--", "python3"])
        .arg(&plain);
    let output = under_sigusr1_storm(job);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).lines().next(),
        Some("done")
    );
}

#[test]
fn gloo_ranks_keep_their_names_after_the_process_group_is_destroyed() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    let rendezvous = format!("file://{}", dir.path().join("rendezvous").display());
    capture(
        &out,
        &["--every", "5", "--no-report"],
        &["--ranks", "2", "--steps", "10", "--gloo", &rendezvous],
    )
    .expect_code(0);
    let files = names(&pickles(&out));
    assert!(files.iter().all(|n| n.starts_with("rank")), "{files:?}");
    assert_dumped(
        &files,
        &["rank0-step10-exit.pickle", "rank1-step10-exit.pickle"],
    );
}

#[test]
fn the_programs_own_sitecustomize_is_still_its_own() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let site = dir.path().join("site");
    std::fs::create_dir(&site).unwrap();
    std::fs::write(site.join("sitecustomize.py"), "MARK = \"the user's\"\n").unwrap();
    let program = dir.path().join("program.py");
    std::fs::write(
        &program,
        "import sitecustomize, torch\nprint(sitecustomize.MARK)\n",
    )
    .unwrap();
    let output = Command::new(SNAPDIFF)
        .args(["capture", "--no-report", "-o"])
        .arg(dir.path().join("out"))
        .args(["--", "python3"])
        .arg(&program)
        .env("PYTHONPATH", &site)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("the user's"), "{stdout}");
}

#[test]
fn dataloader_workers_record_nothing_under_fork_and_spawn() {
    if !torch_ready() {
        return;
    }
    for start_method in ["fork", "spawn"] {
        let dir = tempdir();
        let out = dir.path().join("out");
        let run = capture(
            &out,
            &["--every", "5"],
            &[
                "--workers",
                "2",
                "--start-method",
                start_method,
                "--leak",
                "cache-dict",
            ],
        );
        run.expect_code(0);
        let pids: std::collections::BTreeSet<u64> = manifest(&out)
            .iter()
            .map(|e| e["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(
            pids.len(),
            1,
            "{start_method}: only the job dumps: {pids:?}"
        );
        assert_eq!(pickles(&out).len(), 7, "{start_method}: 6 steps and exit");
        let line = format!("torch_train.py:{}", leak_line("cache-dict"));
        assert!(run.stdout().contains(&line), "{}", run.stdout());
    }
}

#[test]
fn ranks_dump_under_their_own_names_and_are_reported_apart() {
    if !torch_ready() {
        return;
    }
    // Ranks of torch.multiprocessing.spawn, and of start_processes with
    // the fork start method (children that step an optimizer: ranks, not
    // DataLoader workers).
    for start_method in ["spawn", "fork"] {
        ranks_dump_apart(start_method);
    }
}

#[test]
fn two_runs_under_one_folder_are_never_one_series_and_no_file_counts_twice() {
    if !torch_ready() {
        return;
    }
    // A job run twice into one folder: the first run steady, the second
    // leaking on rank 1. Its ranks have the same names in both runs.
    let dir = tempdir();
    let out = dir.path().join("out");
    let ranks = ["--ranks", "2", "--steps", "30"];
    capture(&out, &["--every", "5", "--no-report"], &ranks).expect_code(0);
    let mut leaking = ranks.to_vec();
    leaking.extend(["--leak", "cache-dict", "--leak-rank", "1"]);
    capture(&out, &["--every", "5", "--no-report"], &leaking).expect_code(0);
    let pids: std::collections::BTreeSet<u64> = manifest(&out)
        .iter()
        .map(|e| e["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 4, "two runs of two ranks");
    let o = out.to_str().unwrap();

    let fleet = snapdiff(["fleet", "--json", o]).expect_code(0).json();
    assert_eq!(fleet["processes"], 2, "{fleet:#}");
    assert_eq!(fleet["leaking"], 1, "{fleet:#}");
    let leak = &fleet["leaks"][0];
    assert_eq!(leak["site"]["culprit"]["line"], leak_line("cache-dict"));
    assert_eq!(leak["members"][0]["rank"], 1);
    assert_eq!(leak["members"][0]["growth_per_step"], 8192.0, "{leak:#}");
    // The second run's checkpoints only (its files took names ending in
    // -2: the first run's were there), the six step dumps; the exit dump
    // holds no live block and makes no checkpoint.
    for m in fleet["members"].as_array().unwrap() {
        let sources: Vec<&str> = m["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["source"].as_str().unwrap())
            .collect();
        assert_eq!(sources.len(), 6, "{m:#}");
        assert!(sources.iter().all(|s| s.ends_with("-2.pickle")), "{m:#}");
    }
    let notes = fleet["notes"].to_string();
    assert!(
        notes.contains("had files from more than one run"),
        "{notes}"
    );

    // trend says the same of each rank.
    let trend = snapdiff(["trend", o]).expect_code(0).stdout();
    assert!(
        trend.contains("rank1 shows growth and the other processes do not"),
        "{trend}"
    );
    assert!(trend.contains("earlier run of this process"), "{trend}");

    // The same files reached twice (the folder twice, the folder and its
    // files, a link back into it) are read once.
    std::os::unix::fs::symlink(&out, out.join("again")).unwrap();
    let files: Vec<String> = pickles(&out)
        .iter()
        .map(|p| p.to_str().unwrap().to_owned())
        .collect();
    let mut overlapping = vec![
        "fleet".to_owned(),
        "--json".to_owned(),
        o.to_owned(),
        o.to_owned(),
    ];
    overlapping.extend(files.iter().cloned());
    let again = snapdiff(&overlapping).expect_code(0).json();
    assert_eq!(again["files"], files.len(), "{again:#}");
    assert_eq!(again["leaks"], fleet["leaks"]);
}

fn ranks_dump_apart(start_method: &str) {
    let dir = tempdir();
    let out = dir.path().join("out");
    let run = capture(
        &out,
        &["--every", "5"],
        &[
            "--ranks",
            "2",
            "--rank-start-method",
            start_method,
            "--leak",
            "hidden-state",
            "--leak-rank",
            "1",
        ],
    );
    let stdout = run.expect_code(0).stdout();
    let files = names(&pickles(&out));
    for rank in ["rank0", "rank1"] {
        assert_eq!(
            files.iter().filter(|n| n.starts_with(rank)).count(),
            7,
            "{start_method}, {rank}: {files:?}"
        );
    }
    assert_eq!(files.len(), 14, "the launcher made no tensor: {files:?}");
    assert!(
        stdout.contains("snapshots of 2 processes (rank0, rank1)"),
        "{stdout}"
    );
    // Only rank 1 leaks: named once, and the disagreement said.
    let line = format!("torch_train.py:{}", leak_line("hidden-state"));
    assert_eq!(stdout.matches(&line).count(), 1, "{stdout}");
    assert!(
        stdout.contains("rank1 shows growth and the other processes do not"),
        "{stdout}"
    );

    // `trend` by hand on the same files judges each rank on its own too.
    let mut args: Vec<OsString> = vec!["trend".into()];
    args.extend(pickles(&out).into_iter().map(PathBuf::into_os_string));
    let by_hand = snapdiff(&args).expect_code(0).stdout();
    assert!(
        by_hand.contains("snapshots of 2 processes (rank0, rank1)"),
        "{by_hand}"
    );
    assert_eq!(by_hand.matches(&line).count(), 1, "{by_hand}");
    assert!(by_hand.contains("rank1 shows growth"), "{by_hand}");
    args.push("--json".into());
    let json = snapdiff(&args).expect_code(0).json();
    let processes = json["processes"].as_array().unwrap();
    assert_eq!(processes[0]["process"], "rank0");
    assert_eq!(
        processes[0]["trend"]["suspects"].as_array().unwrap().len(),
        0
    );
    assert_eq!(
        processes[1]["trend"]["suspects"].as_array().unwrap().len(),
        1
    );
}

#[test]
fn torchrun_ranks_dump_apart_and_its_launcher_dumps_nothing() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    // torchrun itself (`python -m torch.distributed.run`): its agent imports
    // torch and starts the ranks as new processes with RANK set.
    let mut args: Vec<OsString> = vec!["capture".into(), "-o".into(), out.clone().into()];
    args.extend(
        [
            "--every",
            "5",
            "--",
            "python3",
            "-m",
            "torch.distributed.run",
        ]
        .map(OsString::from),
    );
    args.extend(["--standalone", "--nproc-per-node", "2"].map(OsString::from));
    args.push(script().into());
    args.extend(["--leak", "loss-list"].map(OsString::from));
    let stdout = snapdiff(&args).expect_code(0).stdout();
    let files = names(&pickles(&out));
    for rank in ["rank0", "rank1"] {
        assert_eq!(
            files.iter().filter(|n| n.starts_with(rank)).count(),
            7,
            "{rank}: {files:?}"
        );
    }
    assert_eq!(files.len(), 14, "the agent made no tensor: {files:?}");
    assert!(
        stdout.contains("snapshots of 2 processes (rank0, rank1)"),
        "{stdout}"
    );
    let line = format!("torch_train.py:{}", leak_line("loss-list"));
    assert_eq!(
        stdout.matches(&line).count(),
        2,
        "both ranks leak: {stdout}"
    );
}

#[test]
fn sigusr1_during_dumps_neither_hangs_nor_breaks_a_file() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    let child = start_capture(
        &out,
        &["--every", "5", "--no-report"],
        &[
            "--steps",
            "40",
            "--step-seconds",
            "0.1",
            "--leak",
            "cache-dict",
        ],
    );
    wait_for_first_dump(&out);
    for _ in 0..20 {
        // SAFETY: signals our own child, which asks the job for a dump.
        unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(130));
    }
    let output = wait_bounded(child);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let files = pickles(&out);
    let signalled = names(&files)
        .iter()
        .filter(|n| n.contains("-signal"))
        .count();
    // Requests that come while one is served are served together.
    assert!(signalled >= 4, "{files:?}");
    for f in &files {
        snapdiff([OsString::from("summary"), f.into()]).expect_code(0);
    }
    let leftovers: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert_eq!(leftovers, Vec::<String>::new());
}

#[test]
fn sigterm_and_a_killed_monitor_end_the_job_with_an_exit_dump() {
    if !torch_ready() {
        return;
    }
    let long_job = ["--steps", "100000", "--step-seconds", "0.05"];
    // SIGTERM to capture: passed on, the job dumps and ends as SIGTERM would.
    let dir = tempdir();
    let out = dir.path().join("out");
    let child = start_capture(&out, &["--every", "5", "--no-report"], &long_job);
    wait_for_first_dump(&out);
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = wait_bounded(child);
    assert_eq!(output.status.code(), Some(128 + 15));
    assert!(
        names(&pickles(&out))
            .iter()
            .any(|n| n.ends_with("-exit.pickle"))
    );

    // SIGKILL to capture: the job is not left running unwatched. Dumps 2.5 s
    // apart, so that the kill lands between two (one it interrupts may
    // leave no time for the exit dump, by design: see the backlog test).
    let dir = tempdir();
    let out = dir.path().join("out");
    let mut child = start_capture(&out, &["--every", "50", "--no-report"], &long_job);
    wait_for_first_dump(&out);
    // The hook notes a dump in the manifest just after the file lands.
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(out.join("manifest.jsonl")).map_or(true, |m| !m.contains('\n')) {
        assert!(
            Instant::now() < deadline,
            "no manifest line within a minute"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let job = manifest(&out)[0]["pid"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Path::new(&format!("/proc/{job}/cmdline")).exists()
        && std::fs::read(format!("/proc/{job}/cmdline")).is_ok_and(|c| !c.is_empty())
    {
        assert!(Instant::now() < deadline, "the job outlived its monitor");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The job wrote to capture's stderr, which only the test now holds.
    let mut job_stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut job_stderr)
        .unwrap();
    assert!(
        names(&pickles(&out))
            .iter()
            .any(|n| n.ends_with("-exit.pickle")),
        "{job_stderr}\n{:?}",
        std::fs::read_to_string(out.join("manifest.jsonl"))
    );
}

#[test]
fn a_job_killed_mid_dump_leaves_only_whole_files() {
    if !torch_ready() {
        return;
    }
    // A dump every step, and the job killed with SIGKILL at two moments
    // after its first: each time, every file left reads, and a half-written
    // dump (if the kill landed in one) is removed.
    for delay_ms in [0, 170] {
        let dir = tempdir();
        let out = dir.path().join("out");
        let child = start_capture(
            &out,
            &["--every", "1", "--no-report"],
            &["--steps", "100000", "--leak", "cache-dict"],
        );
        wait_for_first_dump(&out);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let job = first_pid(&out);
        // SAFETY: signals the job capture started, which is still running.
        unsafe { libc::kill(job, libc::SIGKILL) };
        let output = wait_bounded(child);
        assert_eq!(output.status.code(), Some(128 + 9));
        assert_no_temporary_files(&out);
        let kept = pickles(&out);
        assert!(!kept.is_empty());
        for file in &kept {
            snapdiff(["summary".as_ref(), file.as_os_str()]).expect_code(0);
        }
    }
}

/// A job whose hook kills it (SIGKILL) when an owners file is written
/// whole but not yet in place: the moment of the kill that the test above
/// can only land on by chance.
const KILLED_PUBLISHING_OWNERS: &str = r#"
import os, signal, torch
import snapdiff_dumping  # the hook's own module, as capture loaded it

placed = snapdiff_dumping.publish

def publish(temporary, final):
    if final.endswith(".owners.json"):
        os.kill(os.getpid(), signal.SIGKILL)
    placed(temporary, final)

snapdiff_dumping.publish = publish
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
"#;

#[test]
fn a_job_killed_writing_an_owners_file_leaves_no_temporary_file() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    let job = dir.path().join("job.py");
    std::fs::write(&job, KILLED_PUBLISHING_OWNERS).unwrap();
    let args: [&std::ffi::OsStr; 9] = [
        "capture".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--every".as_ref(),
        "1".as_ref(),
        "--no-report".as_ref(),
        "--".as_ref(),
        "python3".as_ref(),
        job.as_os_str(),
    ];
    snapdiff(args).expect_code(128 + 9);
    assert_no_temporary_files(&out);
    let kept = pickles(&out);
    assert_eq!(kept.len(), 1, "{kept:?}");
    snapdiff(["summary".as_ref(), kept[0].as_os_str()]).expect_code(0);
}

#[test]
fn a_job_that_raises_keeps_its_exit_code_and_its_dumps() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    let run = capture(&out, &["--every", "5"], &["--raise-at", "12"]);
    run.expect_code(1);
    assert!(run.stderr().contains("failing on purpose at step 12"));
    assert!(run.stderr().contains("python3 exited with code 1"));
    let files = names(&pickles(&out));
    assert_dumped(
        &files,
        &["-step5.pickle", "-step10.pickle", "-step12-exit.pickle"],
    );
}

#[test]
fn dumps_that_cannot_be_written_are_counted_and_fail_over_withholds_a_verdict() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    // Files may grow to 244 kB, as on a disk that fills up: the first five
    // dumps (50 to 222 kB) fit, the later ones (266 kB on) fail with EFBIG
    // (Python ignores SIGXFSZ, so the write fails instead of killing the job).
    let limited = |flags: &[&str]| {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(SNAPDIFF);
        cmd.args(capture_args(
            &out,
            flags,
            &["--steps", "30", "--leak", "cache-dict"],
        ));
        // SAFETY: setrlimit is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 244_000,
                    rlim_max: 244_000,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.output().unwrap()
    };
    let output = limited(&["--every", "3", "--fail-over", "1GiB"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("6 dumps could not be written (at steps 18, 21, 24, 27, 30, 30 (exit))")
            && stdout.contains("File too large")
            && stdout.contains("the report covers only the snapshots listed"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("File too large").count(), 1, "{stdout}");
    assert!(stdout.contains("steps 3 to 15"), "{stdout}");
    assert!(
        stderr.contains("6 of 11 dumps failed, so the evidence is incomplete"),
        "{stderr}"
    );
    // What was kept is whole, and no temporary file is left.
    let kept = pickles(&out);
    assert_eq!(kept.len(), 5, "{:?}", names(&kept));
    trend_json(&kept);
    let stray: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn the_cuda_path_records_and_dumps_when_torch_was_imported_first() {
    let Some(real) = torch_and_a_real_snapshot() else {
        return;
    };
    let dir = tempdir();
    let out = dir.path().join("out");
    let log = dir.path().join("cuda-calls.jsonl");
    let args = capture_args(
        &out,
        &["--every", "5", "--max-entries", "1234", "--no-report"],
        // SGD: AdamW's step asks the (absent) device about graph capture
        // once torch.cuda.is_available() says yes. The tensors stay on the
        // CPU: the stand-in fakes only the memory history's calls.
        &["--steps", "10", "--optimizer", "sgd", "--device", "cpu"],
    );
    let output = Command::new(SNAPDIFF)
        .args(&args)
        .env("PYTHONPATH", root().join("tests/support/cuda_standin"))
        .env("CUDA_STANDIN_LOG", &log)
        .env("CUDA_STANDIN_SNAPSHOT", &real)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("Error in sitecustomize"), "{stderr}");
    let calls: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let record = calls
        .iter()
        .find(|c| c["call"] == "_record_memory_history")
        .expect("recording started");
    assert_eq!(record["max_entries"], 1234);
    assert_eq!(record["stacks"], "python");
    assert!(
        calls
            .iter()
            .any(|c| c["call"] == "_cuda_attach_out_of_memory_observer")
    );
    let files = names(&pickles(&out));
    assert_dumped(
        &files,
        &["-step5.pickle", "-step10.pickle", "-step10-exit.pickle"],
    );
    assert!(
        manifest(&out).iter().all(|e| e["device"] == "cuda:0"),
        "{:?}",
        manifest(&out)
    );
    // The dumps are PyTorch's own file, read as such.
    let summary = snapdiff([OsString::from("summary"), out.join(&files[0]).into()]);
    summary.expect_code(0);
}

#[test]
fn legacy_torch_save_files_read_like_the_pickle_inside() {
    let Some(real) = torch_and_a_real_snapshot() else {
        return;
    };
    let dir = tempdir();
    let legacy = dir.path().join("legacy.pt");
    let save = "import pickle, sys, torch\n\
                d = pickle.load(open(sys.argv[1], 'rb'))\n\
                torch.save(d, sys.argv[2], _use_new_zipfile_serialization=False)\n";
    let status = Command::new("python3")
        .args(["-c", save])
        .arg(&real)
        .arg(&legacy)
        .status()
        .unwrap();
    assert!(status.success());
    let totals = |path: &Path| {
        let v = snapdiff([OsString::from("summary"), "--json".into(), path.into()])
            .expect_code(0)
            .json();
        [
            "segments",
            "blocks",
            "allocated_bytes",
            "trace_events",
            "actions",
        ]
        .map(|k| v[k].clone())
    };
    assert_eq!(totals(&legacy), totals(&real));
    assert!(totals(&legacy)[2].as_u64().unwrap() > 0);
}

#[test]
fn a_rust_jobs_dump_converted_to_a_pickle_opens_in_pytorchs_viewer() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    // A Rust training job under capture: the runtime's own .snap dumps.
    let snaps = leaking_training_job(&dir.path().join("out"), 20, 10);
    let snap = snaps.last().unwrap();
    let pickle = dir.path().join("last.pickle");
    snapdiff(["convert".as_ref(), snap.as_os_str(), pickle.as_os_str()]).expect_code(0);
    // snapdiff reads it back as it read the .snap.
    let summary = |f: &Path| -> Value {
        let mut s = snapdiff(["summary".as_ref(), f.as_os_str(), "--json".as_ref()]).json();
        s.as_object_mut().unwrap().remove("frames");
        s
    };
    assert_eq!(summary(&pickle), summary(snap));
    // PyTorch's own reader draws it, and its totals are the .snap's.
    let check = r#"
import json, pickle, sys
from torch.cuda import _memory_viz as viz
d = pickle.load(open(sys.argv[1], "rb"))
viz.segsum(d); viz.trace(d); viz.trace_plot(d)
blocks = [b for s in d["segments"] for b in s["blocks"]]
print(json.dumps({
    "reserved": sum(s["total_size"] for s in d["segments"]),
    "allocated": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
    "events": len(d["device_traces"][0]),
    "frames": sum(1 for b in blocks if b["frames"]),
}))
"#;
    let torch: Value = serde_json::from_str(&python_script(check, &[&pickle])).unwrap();
    let ours = summary(snap);
    assert_eq!(torch["reserved"], ours["reserved_bytes"], "{torch}");
    assert_eq!(torch["allocated"], ours["allocated_bytes"], "{torch}");
    assert_eq!(torch["events"], ours["trace_events"], "{torch}");
    assert!(
        torch["frames"].as_u64() > Some(0),
        "blocks carry their stacks: {torch}"
    );
}

#[test]
fn a_run_that_dumped_nothing_is_told_why() {
    let dir = tempdir();
    let said = |name: &str, command: &[&str]| {
        let out = dir.path().join(name);
        let mut args = vec!["capture", "-o", out.to_str().unwrap(), "--"];
        args.extend(command);
        let run = snapdiff(&args);
        let text = run.stdout() + &run.stderr();
        text.lines()
            .find(|l| l.starts_with("no snapshot was written"))
            .unwrap_or_else(|| panic!("{text}"))
            .to_owned()
    };
    assert!(said("none", &["true"]).ends_with(
        "no Python process imported torch under capture, and no Rust program allocated \
         through snapdiff-runtime's Allocator::new (which dumps at exit)"
    ));
    assert!(
        said("python", &["python3", "-c", "print(1)"])
            .ends_with("never imported torch (capture records PyTorch's memory)")
    );
    if torch_ready() {
        assert!(
            said("torch", &["python3", "-c", "import torch"])
                .ends_with("torch was imported but made no tensor")
        );
    }
}

#[test]
fn sigterm_is_served_before_a_backlog_of_slow_dumps() {
    if !torch_ready() {
        return;
    }
    // A large process (300,000 tensors: each dump takes a good part of a
    // second) dumped every 0.1 s: the ticks come faster than the dumps.
    // SIGTERM must not wait behind them: after it, at most the dump under
    // way and one exit dump, then SIGTERM's own end. (Counted, not timed:
    // a busy machine slows each dump, not how many are written.)
    let dir = tempdir();
    let out = dir.path().join("out");
    let child = start_capture(
        &out,
        &["--interval", "100ms", "--no-report"],
        &[
            "--steps",
            "100000",
            "--step-seconds",
            "0.01",
            "--keep-tensors",
            "300000",
        ],
    );
    // Two dumps once training runs (its tensors all made).
    let training_dumps = || {
        std::fs::read_to_string(out.join("manifest.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["step"].as_u64().unwrap_or(0) > 0)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while training_dumps() < 2 {
        assert!(
            Instant::now() < deadline,
            "no dumps of training within two minutes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = manifest(&out).len();
    // SAFETY: signals our own child, which passes SIGTERM on to the job.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = wait_bounded(child);
    assert_eq!(
        output.status.code(),
        Some(128 + 15),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines = manifest(&out);
    let after: Vec<&Value> = lines[before..].iter().collect();
    assert!(
        after.iter().filter(|l| l["reason"] != "exit").count() <= 1,
        "dumps written after SIGTERM: {after:?}"
    );
    // Dumps took more than a tenth of the job's time: the interval widened
    // (ticks that came during a dump were skipped, not queued: see
    // python/tests/test_capture_hook.py, where when they come is known).
    assert!(
        lines
            .iter()
            .any(|l| l["interval"].as_f64().is_some_and(|s| s > 0.1))
    );
    assert!(lines.iter().filter(|l| l["reason"] == "exit").count() <= 1);
}

#[test]
fn a_dropped_optimizer_is_freed_and_the_next_one_paces_the_dumps() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    let run = capture(
        &out,
        &["--every", "5", "--no-report"],
        &["--steps", "20", "--new-optimizer-at", "8"],
    );
    run.expect_code(0);
    assert!(
        run.stderr().contains("old optimizer freed: True"),
        "{}",
        run.stderr()
    );
    assert_dumped(
        &names(&pickles(&out)),
        &[
            "-step5.pickle",
            "-step10.pickle",
            "-step15.pickle",
            "-step20.pickle",
        ],
    );
}

#[test]
fn a_manifest_link_planted_by_another_user_is_refused_not_followed() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "a user's own file").unwrap();
    let out = crate::util::shared_folder(dir.path(), "shared");
    crate::util::plant_link(&victim, &out.join("manifest.jsonl"));
    let run = capture(&out, &["--every", "5", "--no-report"], &["--steps", "10"]);
    run.expect_code(0);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "a user's own file"
    );
    let stderr = run.stderr();
    let refusals: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("manifest.jsonl"))
        .collect();
    assert_eq!(refusals.len(), 1, "{stderr}");
    assert!(refusals[0].contains("a symbolic link is there; not followed"));
    assert_dumped(&names(&pickles(&out)), &["-step5.pickle", "-step10.pickle"]);
}

#[test]
fn no_stacks_is_honoured_and_stacks_start_at_the_programs_frames() {
    if !torch_ready() {
        return;
    }
    let frames_in = |flags: &[&str]| {
        let dir = tempdir();
        let out = dir.path().join("out");
        let mut all = flags.to_vec();
        all.extend(["--every", "5", "--no-report"]);
        capture(&out, &all, &["--steps", "5"]).expect_code(0);
        // The step's dump (at exit, the job's tensors are gone).
        let file = out.join(
            names(&pickles(&out))
                .into_iter()
                .find(|n| n.ends_with("-step5.pickle"))
                .unwrap(),
        );
        python_script(
            "import pickle, sys, json\n\
             s = pickle.load(open(sys.argv[1], 'rb'))\n\
             tops = [b['frames'][0]['filename'] if b['frames'] else None\n\
                     for seg in s['segments'] for b in seg['blocks']]\n\
             print(json.dumps(tops))",
            &[file],
        )
    };
    let tops: Vec<Option<String>> = serde_json::from_str(&frames_in(&[])).unwrap();
    assert!(!tops.is_empty());
    // The innermost frame is the caller of torch's operator, never torch's
    // wrapper of the recorder (torch/_compile.py) or the recorder itself.
    for top in &tops {
        let top = top.as_deref().unwrap();
        assert!(
            !top.ends_with("torch/_compile.py") && !top.ends_with("snapdiff_cpu_recorder.py"),
            "{top}"
        );
    }
    let tops: Vec<Option<String>> = serde_json::from_str(&frames_in(&["--no-stacks"])).unwrap();
    assert!(
        !tops.is_empty() && tops.iter().all(Option::is_none),
        "{tops:?}"
    );
}

#[test]
fn the_librarys_trend_files_judges_as_the_command_does() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    capture(
        &out,
        &["--every", "2", "--no-report", "--owners"],
        &["--steps", "16", "--leak", "cache-dict", "--device", "cpu"],
    )
    .expect_code(0);
    let files = pickles(&out);
    assert!(
        names(&files).iter().any(|n| n.ends_with("-exit.pickle")),
        "{files:?}"
    );
    let trend = snapdiff::trend_files(&files, &snapdiff::TrendOptions::default()).unwrap();
    let command = trend_json(&files);
    assert_eq!(
        trend.checkpoints,
        files.len() - 1,
        "the exit dump is left out"
    );
    assert_eq!(
        trend.checkpoints as u64,
        command["checkpoints"].as_u64().unwrap()
    );
    assert!(
        trend
            .notes
            .iter()
            .any(|n| n.contains("exit snapshot left out")),
        "{:?}",
        trend.notes
    );
    assert_eq!(trend.suspects.len(), 1, "{:?}", trend.suspects);
    assert_eq!(
        trend.suspects[0].growth_bytes,
        command["suspects"][0]["growth_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        u64::from(trend.suspects[0].site.culprit.line),
        leak_line("cache-dict")
    );
    // The same judge: the suspect's owners, from the owners files beside.
    let owners: Vec<&str> = trend.suspects[0]
        .held_by
        .iter()
        .map(|h| h.owner.as_str())
        .collect();
    let command_owners: Vec<&str> = command["suspects"][0]["held_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["owner"].as_str().unwrap())
        .collect();
    assert!(!owners.is_empty(), "{:?}", trend.suspects[0]);
    assert_eq!(owners, command_owners);
    // One file: judged by its trace, as the command judges it.
    let last = files
        .iter()
        .rfind(|f| !f.to_string_lossy().ends_with("-exit.pickle"))
        .unwrap();
    let alone = snapdiff::trend_files(&[last], &snapdiff::TrendOptions::default()).unwrap();
    let command = trend_json(std::slice::from_ref(last));
    assert_eq!(
        alone.checkpoints as u64,
        command["checkpoints"].as_u64().unwrap()
    );
    assert!(alone.checkpoints > 1, "{alone:?}");
    // `summary` of the last dump (what Python's `Recording.owners()` asks)
    // names the leaking line's owner as the trend does.
    let summary = crate::util::snapdiff([
        "summary".as_ref(),
        "--json".as_ref(),
        "--top".as_ref(),
        "0".as_ref(),
        last.as_os_str(),
    ])
    .expect_code(0)
    .json();
    let leaking = summary["top_sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["culprit"]["line"].as_u64() == Some(leak_line("cache-dict")))
        .expect("the leaking line holds live memory");
    assert_eq!(
        leaking["held_by"][0]["owner"].as_str(),
        Some(owners[0]),
        "{leaking}"
    );
    // And its text says so under the sites.
    let run = crate::util::snapdiff(["summary".as_ref(), last.as_os_str()]);
    let text = run.expect_code(0);
    let held = text
        .stdout()
        .split_once("held by (what kept them alive when the snapshot was taken):")
        .map(|(_, after)| after.to_owned())
        .unwrap_or_default();
    assert!(held.contains(owners[0]), "{}", text.stdout());
    // Snapshots without their names: every one is judged.
    let snapshots: Vec<_> = files.iter().map(|f| snapdiff::read(f).unwrap()).collect();
    let all = snapdiff::trend(&snapshots, &snapdiff::TrendOptions::default());
    assert_eq!(all.checkpoints, files.len());
}

#[test]
fn two_jobs_writing_one_folder_under_one_name_at_once_are_each_judged_alone() {
    if !torch_ready() {
        return;
    }
    // Both as RANK=0 into one folder at the same time, their dumps
    // interleaved: one leaks, one is steady. Before, the leaking job's own
    // capture said nothing grew and `--max-growth` passed.
    let dir = tempdir();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // A dump another machine's capture is writing into the shared folder
    // (its process id is none here): never removed by this one.
    let mut exited = Command::new("true").spawn().unwrap();
    exited.wait().unwrap();
    let theirs = out.join(format!(
        ".rank0-step4.0a1b2c3d.feedbeef.{}.tmp",
        exited.id()
    ));
    std::fs::write(&theirs, b"half a dump").unwrap();
    // Each waits at step 10 until both are there: their dumps overlap in
    // time however busy the machine.
    let go = dir.path().join("go").display().to_string();
    let progress = |leak: bool| dir.path().join(format!("progress-{leak}"));
    let job = |leak: bool| {
        let progress = progress(leak).display().to_string();
        let mut script = vec!["--steps", "40", "--step-seconds", "0.02", "--wait-at", "10"];
        script.extend(["--wait-for", &go, "--progress", &progress]);
        if leak {
            script.extend(["--leak", "cache-dict"]);
        }
        Command::new(SNAPDIFF)
            .args(capture_args(
                &out,
                &["--every", "2", "--max-growth", "64KiB"],
                &script,
            ))
            .env("RANK", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (leaking, steady) = (job(true), job(false));
    let deadline = Instant::now() + Duration::from_secs(120);
    while ![true, false]
        .iter()
        .all(|&l| std::fs::read_to_string(progress(l)).is_ok_and(|s| s.trim() == "10"))
    {
        assert!(
            Instant::now() < deadline,
            "the two jobs did not reach step 10"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&go, "").unwrap();
    let (leaking, steady) = (wait_bounded(leaking), wait_bounded(steady));
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let line = format!("torch_train.py:{}", leak_line("cache-dict"));
    assert_eq!(leaking.status.code(), Some(1), "{}", text(&leaking));
    assert!(text(&leaking).contains(&line), "{}", text(&leaking));
    assert_eq!(steady.status.code(), Some(0), "{}", text(&steady));
    assert!(!text(&steady).contains(&line), "{}", text(&steady));
    assert!(theirs.exists(), "another machine's dump was removed");

    // fleet judges them apart, each under a name that tells it.
    let o = out.to_str().unwrap();
    let run = snapdiff(["fleet", "--json", "--max-growth", "64KiB", o]);
    run.expect_code(1);
    let fleet = run.json();
    assert_eq!(fleet["processes"], 2, "{fleet:#}");
    assert_eq!(fleet["leaking"], 1, "{fleet:#}");
    let leak = &fleet["leaks"][0];
    assert_eq!(leak["site"]["culprit"]["line"], leak_line("cache-dict"));
    let name = leak["members"][0]["process"].as_str().unwrap();
    assert!(name.starts_with("rank0@pid"), "{leak:#}");
    assert_eq!(leak["members"][0]["rank"], 0);
    let notes = fleet["notes"].to_string();
    assert!(
        notes.contains("are runs under one name that ran at the same time"),
        "{notes}"
    );
}

#[test]
fn a_job_that_imports_torch_off_the_main_thread_still_names_its_leaking_line() {
    if !torch_ready() {
        return;
    }
    // torch imported by a helper thread, the training on the main one:
    // the recorder's stacks were the helper's (gone), so no line was named.
    let dir = tempdir();
    let script = dir.path().join("off_main.py");
    std::fs::write(
        &script,
        "import threading, time\n\
         loaded = {}\n\
         thread = threading.Thread(target=lambda: loaded.update(torch=__import__('torch')))\n\
         thread.start(); thread.join()\n\
         torch = loaded['torch']\n\
         kept = []\n\
         for step in range(60):\n\
         \x20   scratch = torch.ones(1024)\n\
         \x20   kept.append(torch.ones(2048))  # the leak\n\
         \x20   time.sleep(0.03)\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let run = snapdiff([
        "capture".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--interval".as_ref(),
        "0.2s".as_ref(),
        "--".as_ref(),
        "python3".as_ref(),
        script.as_os_str(),
    ] as [&std::ffi::OsStr; 8]);
    run.expect_code(0);
    assert!(
        run.stdout().contains("off_main.py:9"),
        "{}\n{}",
        run.stdout(),
        run.stderr()
    );
    assert!(
        run.stderr()
            .contains("torch was first imported off the main thread"),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_job_that_replaces_the_cpu_allocator_gets_no_all_clear() {
    if !torch_ready() {
        return;
    }
    // At step 10 the job makes PyTorch's default allocator the CPU one
    // again, as a job installing an allocator of its own does: the
    // recorder sees nothing more, and the 1 MiB a step after it is in no
    // dump. Before, capture said nothing grew and --max-growth passed.
    let dir = tempdir();
    let script = dir.path().join("own_allocator.py");
    std::fs::write(
        &script,
        "import ctypes, os, time, torch\n\
         c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libc10.so'))\n\
         default = ctypes.CFUNCTYPE(ctypes.c_void_p)(('_ZN3c1022GetDefaultCPUAllocatorEv', c10))\n\
         set_allocator = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint8)(\n\
         \x20   ('_ZN3c1015SetCPUAllocatorEPNS_9AllocatorEh', c10))\n\
         kept = []\n\
         for step in range(60):\n\
         \x20   if step == 10:\n\
         \x20       set_allocator(default(), 0)\n\
         \x20   kept.append(torch.ones(1 << 18))\n\
         \x20   time.sleep(0.03)\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let run = snapdiff([
        "capture".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--interval".as_ref(),
        "0.2s".as_ref(),
        "--max-growth".as_ref(),
        "1MiB".as_ref(),
        "--".as_ref(),
        "python3".as_ref(),
        script.as_os_str(),
    ] as [&std::ffi::OsStr; 10]);
    run.expect_code(2);
    assert!(
        run.stdout().contains("recording stopped") && run.stdout().contains("c10::SetCPUAllocator"),
        "{}",
        run.stdout()
    );
    assert!(
        run.stderr().contains("no verdict (--max-growth)"),
        "{}",
        run.stderr()
    );
}
