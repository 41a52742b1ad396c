//! `snapdiff capture` and `snapdiff demo`: the training workload under
//! capture, signals, crashes, intervals, output folders; plain Python scripts
//! (PyTorch programs are in torch_capture.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{root, snapdiff, tempdir};

const SNAPDIFF: &str = env!("CARGO_BIN_EXE_snapdiff");

/// The line of `file` (under the repository) carrying `marker`.
fn marked_line(file: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    text.lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker} not in {file}")) as u64
        + 1
}

/// Asserts that a report names the line `--leak keep-activations` leaks at.
fn assert_names_keep_activations_line(out: &str) {
    let line = marked_line(
        "crates/train/src/model.rs",
        "leaks with --leak keep-activations",
    );
    assert!(
        out.contains(&format!("crates/train/src/model.rs:{line}")),
        "{out}"
    );
}

fn snapshots_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "snap" || e == "pickle"))
        .collect();
    files.sort();
    files
}

fn trend_of(files: &[PathBuf]) -> Value {
    let mut args: Vec<std::ffi::OsString> = vec!["trend".into(), "--json".into()];
    args.extend(files.iter().map(|f| f.clone().into_os_string()));
    snapdiff(args).expect_code(0).one_trend()
}

/// `snapdiff capture -o DIR --every 5 --no-report -- PROGRAM --steps 40
/// [--leak KIND]`, where PROGRAM is `snapdiff train` or `snapdiff-train`.
fn capture_training(
    dir: &Path,
    program: &[&std::ffi::OsStr],
    leak: Option<&str>,
) -> crate::util::Run {
    let mut args: Vec<std::ffi::OsString> = ["capture", "-o"]
        .iter()
        .map(Into::into)
        .chain([dir.as_os_str().to_owned()])
        .collect();
    args.extend(["--every", "5", "--no-report", "--"].iter().map(Into::into));
    args.extend(program.iter().map(|p| p.to_os_string()));
    args.extend(["--steps", "40", "--log-every", "0"].iter().map(Into::into));
    if let Some(kind) = leak {
        args.extend(["--leak", kind].iter().map(Into::into));
    }
    snapdiff(args)
}

/// The training workload as `snapdiff train`.
fn snapdiff_train_subcommand() -> [&'static std::ffi::OsStr; 2] {
    [SNAPDIFF.as_ref(), "train".as_ref()]
}

#[test]
fn each_leak_of_the_training_job_is_named_at_its_line() {
    let cases = [
        ("keep-activations", "crates/train/src/model.rs"),
        ("accumulate-loss", "crates/train/src/model.rs"),
        ("hidden-state", "crates/train/src/lib.rs"),
    ];
    for (kind, file) in cases {
        let dir = tempdir();
        let run = capture_training(dir.path(), &snapdiff_train_subcommand(), Some(kind));
        run.expect_code(0);
        let files = snapshots_in(dir.path());
        assert_eq!(
            files.len(),
            8,
            "{kind}: a snapshot every 5 of 40 steps: {files:?}"
        );
        let report = trend_of(&files);
        let suspects = report["suspects"].as_array().unwrap();
        assert_eq!(
            suspects.len(),
            1,
            "{kind}: the first and only suspect: {report:#}"
        );
        let culprit = &suspects[0]["culprit"];
        assert!(
            culprit["file"].as_str().unwrap().ends_with(file),
            "{kind}: {culprit}"
        );
        assert_eq!(
            culprit["line"],
            marked_line(file, &format!("leaks with --leak {kind}")),
            "{kind}: {culprit}"
        );
        assert_eq!(culprit["kind"], "user");
    }

    // No leak, no suspect.
    let dir = tempdir();
    capture_training(dir.path(), &snapdiff_train_subcommand(), None).expect_code(0);
    let report = trend_of(&snapshots_in(dir.path()));
    assert_eq!(report["suspects"], serde_json::json!([]), "{report:#}");
}

/// The `snapdiff-train` binary, built beside `snapdiff` by `cargo test
/// --workspace`; `None` when only this package was built.
fn snapdiff_train() -> Option<PathBuf> {
    let path = Path::new(SNAPDIFF).with_file_name("snapdiff-train");
    path.is_file().then_some(path)
}

#[test]
fn the_snapdiff_train_program_is_captured_with_no_code_change() {
    let Some(train) = snapdiff_train() else {
        crate::util::skip("snapdiff-train", "cargo test --workspace builds it");
        return;
    };
    let dir = tempdir();
    capture_training(dir.path(), &[train.as_os_str()], Some("accumulate-loss")).expect_code(0);
    let report = trend_of(&snapshots_in(dir.path()));
    let suspects = report["suspects"].as_array().unwrap();
    assert_eq!(suspects.len(), 1, "{report:#}");
    let line = marked_line(
        "crates/train/src/model.rs",
        "leaks with --leak accumulate-loss",
    );
    assert_eq!(suspects[0]["culprit"]["line"], line);
}

#[test]
fn capture_lists_the_snapshots_and_reports_the_trend() {
    let dir = tempdir();
    let run = snapdiff([
        "capture",
        "-o",
        dir.path().to_str().unwrap(),
        "--every",
        "10",
        "--",
        SNAPDIFF,
        "train",
        "--steps",
        "40",
        "--leak",
        "keep-activations",
        "--log-every",
        "20",
    ]);
    let out = run.expect_code(0).stdout();
    assert!(
        out.contains("step    20/40"),
        "the command's own output comes through: {out}"
    );
    assert!(out.contains("4 snapshots in"), "{out}");
    assert!(out.contains("1 site keeps growing"), "{out}");
    assert_names_keep_activations_line(&out);
}

#[test]
fn a_job_that_runs_out_of_memory_gets_the_oom_report() {
    let dir = tempdir();
    // The leak fills the 64 MiB host device in about 500 steps.
    let run = snapdiff([
        "capture",
        "-o",
        dir.path().to_str().unwrap(),
        "--every",
        "100",
        "--",
        SNAPDIFF,
        "train",
        "--steps",
        "1000",
        "--capacity-mib",
        "64",
        "--leak",
        "keep-activations",
        "--log-every",
        "0",
    ]);
    // The job's own failure is the exit code.
    let out = run.expect_code(2).stdout();
    let oom_dump = snapshots_in(dir.path())
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with("-oom.snap"))
        .expect("the runtime dumped at the error");
    assert!(
        out.contains(&format!("out of memory: {}", oom_dump.display())),
        "{out}"
    );
    let report = &out[out.find("out of memory: ").unwrap()..];
    // The request: the step's next 128 KiB activation gradient.
    assert!(
        report.contains("out of memory asking for 128 KiB on stream 0"),
        "{report}"
    );
    assert!(report.contains("the device was full"), "{report}");
    // What grew: the leaking line, without which the request would fit.
    let grew = report
        .lines()
        .find(|l| l.contains("kept growing before the error"))
        .unwrap_or_else(|| panic!("{report}"));
    assert_names_keep_activations_line(grew);
    assert!(
        report.contains("without that growth the request would have fit"),
        "{report}"
    );
    // 128 KiB a step: the step's activations, kept.
    assert!(
        report.contains("it grew 128 KiB a step, for about"),
        "{report}"
    );

    // The same report from `snapdiff oom`, as JSON.
    let json = snapdiff(["oom".as_ref(), oom_dump.as_os_str(), "--json".as_ref()])
        .expect_code(0)
        .json();
    let o = &json["devices"][0];
    assert_eq!(o["requested_bytes"], 128 << 10);
    assert_eq!(o["fits_without_fragmentation"], false, "{o:#}");
    assert_eq!(o["device_free"], 0, "{o:#}");
}

#[test]
fn termination_is_passed_on_and_the_exit_snapshot_written() {
    let dir = tempdir();
    let child = Command::new(SNAPDIFF)
        .args([
            "capture",
            "-o",
            dir.path().to_str().unwrap(),
            "--every",
            "50",
            "--no-report",
            "--",
            SNAPDIFF,
            "train",
        ])
        .args([
            "--steps",
            "100000000",
            "--batch",
            "16",
            "--hidden",
            "32",
            "--leak",
            "keep-activations",
            "--log-every",
            "0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while snapshots_in(dir.path()).is_empty() {
        assert!(Instant::now() < deadline, "no snapshot within a minute");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: sends SIGTERM to our own child, `snapdiff capture`.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "capture returns the command's exit code"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stopped by signal 15"), "{stderr}");
    assert!(stderr.contains("exited with code 143"), "{stderr}");
    let files = snapshots_in(dir.path());
    let exit = files
        .iter()
        .find(|f| f.to_string_lossy().ends_with("-exit.snap"))
        .expect("an exit snapshot");
    let snap = snapdiff_format::read_path(exit).unwrap();
    assert!(
        snap.totals().allocated_bytes > 0,
        "dumped with the buffers still live"
    );
}

#[test]
fn a_runtime_dump_left_half_written_by_a_dead_process_of_the_job_is_removed() {
    // What the runtime leaves when its process is killed mid-dump: its
    // temporary, named with the capture's run and the dead process's id
    // (a subshell's, gone by the time the job ends). Another run's is kept.
    let dir = tempdir();
    let out = dir.path().to_str().unwrap();
    let script = r#"dead=$(sh -c 'echo $$')
touch "$0/.snapdiff-$dead-dev0-0002-exit.snap.Ab3dEf.$SNAPDIFF_RUN.$dead.tmp"
touch "$0/.snapdiff-$dead-dev0-0002-exit.snap.Ab3dEf.0a1b2c3d.$dead.tmp""#;
    let run = snapdiff(["capture", "-o", out, "--", "sh", "-c", script, out]);
    assert!(
        run.stdout()
            .contains("removed 1 half-written file (dumps, owners) of a killed process"),
        "{}",
        run.stdout()
    );
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].contains(".0a1b2c3d."), "{left:?}");
}

#[test]
fn a_crashed_command_is_reported_and_its_snapshots_kept() {
    let dir = tempdir();
    let script = format!("'{SNAPDIFF}' train --steps 20 --log-every 0 && kill -9 $$");
    let run = snapdiff([
        "capture",
        "-o",
        dir.path().to_str().unwrap(),
        "--every",
        "5",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    run.expect_code(128 + 9);
    assert!(
        run.stderr().contains("sh was killed by signal 9 (SIGKILL)"),
        "{}",
        run.stderr()
    );
    assert!(run.stdout().contains("4 snapshots in"), "{}", run.stdout());
    assert_eq!(snapshots_in(dir.path()).len(), 4);

    let run = snapdiff([
        "capture",
        "-o",
        dir.path().to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    run.expect_code(3);
    assert!(
        run.stdout().contains("no snapshot was written"),
        "{}",
        run.stdout()
    );
    assert!(
        run.stderr().contains("sh exited with code 3"),
        "{}",
        run.stderr()
    );

    let run = snapdiff([
        "capture",
        "-o",
        dir.path().to_str().unwrap(),
        "--",
        "/nonexistent/program",
    ]);
    run.expect_code(2);
    assert!(
        run.stderr()
            .starts_with("snapdiff: cannot run /nonexistent/program"),
        "{}",
        run.stderr()
    );
}

#[test]
fn scripts_that_never_import_torch_run_unchanged() {
    // A plain script, with a sitecustomize of its own that must still run.
    let dir = tempdir();
    let own = dir.path().join("own");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::write(own.join("sitecustomize.py"), "print('own sitecustomize')\n").unwrap();
    let script = dir.path().join("plain.py");
    std::fs::write(
        &script,
        "import sys\nprint('hello', sys.argv[1:])\nsys.exit(3)\n",
    )
    .unwrap();
    let direct = Command::new("python3")
        .arg(&script)
        .arg("x")
        .env("PYTHONPATH", &own)
        .output()
        .unwrap();
    let captured = Command::new(SNAPDIFF)
        .args(["capture", "-o"])
        .arg(dir.path().join("out"))
        .args(["--", "python3"])
        .arg(&script)
        .arg("x")
        .env("PYTHONPATH", &own)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&direct.stdout),
        "own sitecustomize\nhello ['x']\n"
    );
    let captured_out = String::from_utf8_lossy(&captured.stdout);
    assert!(
        captured_out.starts_with("own sitecustomize\nhello ['x']\n"),
        "{captured_out}"
    );
    assert_eq!(captured.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&captured.stderr);
    assert!(
        stderr.contains("snapdiff: python3 exited with code 3"),
        "{stderr}"
    );
    let hook_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("without capture"))
        .collect();
    let torch_installed = Command::new("python3")
        .args(["-c", "import torch"])
        .output()
        .unwrap()
        .status
        .success();
    if torch_installed {
        assert_eq!(hook_lines, Vec::<&str>::new(), "{stderr}");
    } else {
        assert_eq!(
            hook_lines,
            ["snapdiff: torch is not installed; the script runs without capture"],
            "{stderr}"
        );
    }
}

#[test]
fn intervals_reach_the_job_in_seconds() {
    for (given, seconds) in [
        ("1h30m", "5400"),
        ("2min", "120"),
        ("90s", "90"),
        ("500ms", "0.5"),
    ] {
        let dir = tempdir();
        let run = snapdiff([
            "capture",
            "-o",
            dir.path().to_str().unwrap(),
            "--no-report",
            "--interval",
            given,
            "--",
            "sh",
            "-c",
            "echo \"$SNAPDIFF_INTERVAL\"",
        ]);
        assert_eq!(
            run.expect_code(0).stdout().lines().next(),
            Some(seconds),
            "{given}"
        );
    }
    let run = snapdiff(["capture", "--interval", "soon", "--", "true"]);
    run.expect_code(2);
    assert!(
        run.stderr().contains("invalid interval 'soon'"),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_folder_that_cannot_be_written_is_refused_before_the_job_runs() {
    let dir = tempdir();
    let marker = dir.path().join("ran");
    // /proc/1 is a folder in which not even root can create a file.
    let run = snapdiff([
        "capture",
        "-o",
        "/proc/1",
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    run.expect_code(2);
    assert!(
        run.stderr()
            .starts_with("snapdiff: /proc/1: cannot write in the output folder"),
        "{}",
        run.stderr()
    );
    assert_eq!(run.stderr().lines().count(), 1, "{}", run.stderr());
    assert!(!marker.exists(), "the job must not run");
}

#[test]
fn the_demo_names_the_leaking_line() {
    let run = snapdiff(["demo", "--steps", "20"]);
    let out = run.expect_code(0).stdout();
    assert_names_keep_activations_line(&out);
    assert!(out.contains("1 site keeps growing"), "{out}");
    assert!(out.contains("is full in about"), "{out}");
}

/// The demo's own dumps, their paths moved into clones named `snapdiff`
/// and `lightning` (what `git clone` of this repository makes): the
/// leaking line of `crates/train` is still named.
#[test]
fn the_demo_names_its_line_from_a_clone_named_like_a_library() {
    let dir = tempdir();
    let out = dir.path().join("out");
    snapdiff([
        "capture",
        "-o",
        out.to_str().unwrap(),
        "--every",
        "2",
        "--no-report",
        "--",
        SNAPDIFF,
        "train",
        "--steps",
        "12",
        "--leak",
        "keep-activations",
        "--log-every",
        "0",
    ])
    .expect_code(0);
    let root = format!("{}/", crate::util::root().display());
    for clone in ["/home/ana/snapdiff/", "/home/ana/code/lightning/"] {
        let moved = dir.path().join(clone.trim_matches('/').replace('/', "-"));
        std::fs::create_dir(&moved).unwrap();
        for file in snapshots_in(&out) {
            let mut snap = snapdiff_format::read_path(&file).unwrap();
            for frame in &mut snap.frames {
                if let Some(rest) = frame.file.strip_prefix(root.as_str()) {
                    frame.file = format!("{clone}{rest}").into();
                }
            }
            let name = moved.join(file.file_name().unwrap()).with_extension("snap");
            snapdiff_format::write_path(&name, &snap, snapdiff_format::Existing::Keep).unwrap();
        }
        let report = trend_of(&snapshots_in(&moved));
        let line = marked_line(
            "crates/train/src/model.rs",
            "leaks with --leak keep-activations",
        );
        let culprit = &report["suspects"][0]["culprit"];
        assert_eq!(
            culprit["file"].as_str(),
            Some(format!("{clone}crates/train/src/model.rs").as_str()),
            "{report:#}"
        );
        assert_eq!(culprit["line"], line, "{clone}");
    }
}

#[test]
fn a_rust_jobs_lost_dumps_are_said_once_and_counted_in_the_verdict() {
    // Files may grow to 3,100 bytes, as on a disk that fills up: the dumps
    // of steps 2 to 12 fit, the 14 later ones fail with EFBIG (SIGXFSZ is
    // ignored, as Python does, so the write fails instead of killing the job).
    let dir = tempdir();
    let out = dir.path().join("out");
    const LIMITED: &str = "import os, resource, signal, sys\n\
        resource.setrlimit(resource.RLIMIT_FSIZE, (3100, 3100))\n\
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n\
        os.execv(sys.argv[1], sys.argv[1:])";
    let mut cmd = std::process::Command::new(SNAPDIFF);
    cmd.arg("capture")
        .arg("-o")
        .arg(&out)
        .args(["--every", "2", "--fail-over", "1GiB", "--"])
        .args(["python3", "-c", LIMITED, SNAPDIFF, "train"])
        .args([
            "--steps",
            "40",
            "--leak",
            "keep-activations",
            "--log-every",
            "0",
        ]);
    let output = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(2), "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("cannot write snapshot").count(),
        1,
        "said once: {stderr}"
    );
    // Dumps grow by about 180 bytes a step: the first six or seven fit.
    let kept = snapshots_in(&out).len();
    assert!((5..=8).contains(&kept), "{stdout}");
    let lost: Vec<String> = (kept + 1..=20).map(|k| (2 * k).to_string()).collect();
    assert!(
        stdout.contains(&format!(
            "{} dumps could not be written (at steps {}): ",
            lost.len(),
            lost.join(", ")
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("the report covers only the snapshots listed"),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "{} of 20 dumps failed, so the evidence is incomplete",
            lost.len()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{} snapshot writes failed; the last: ",
            lost.len()
        )),
        "counted at exit: {stderr}"
    );
}

#[test]
fn a_captures_folder_named_file_by_file_reads_as_the_folder() {
    // `snapdiff trend snapshots/*`, as a shell expands it: the manifest and
    // the owners files capture writes beside the dumps are passed over.
    let dir = tempdir();
    let out = dir.path().join("snapshots");
    let dumps = crate::util::leaking_training_job(&out, 8, 2);
    std::fs::write(
        out.join("manifest.jsonl"),
        "{\"file\": null, \"error\": \"disk full\", \"reason\": \"step\"}\n",
    )
    .unwrap();
    let first = dumps[0].file_stem().unwrap().to_string_lossy().into_owned();
    std::fs::write(out.join(format!("{first}.owners.json")), "{\"blocks\": {}}").unwrap();
    let mut every: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    every.sort();
    let as_files = snapdiff(
        ["trend".as_ref(), "--json".as_ref()]
            .into_iter()
            .chain(every.iter().map(|p| p.as_os_str())),
    );
    let as_folder = snapdiff(["trend".as_ref(), "--json".as_ref(), out.as_os_str()]);
    as_folder.expect_code(0);
    assert_eq!(as_files.expect_code(0).json(), as_folder.json());
    // So do fleet, export and report: nothing read as a broken snapshot.
    let files = || every.iter().map(|p| p.as_os_str());
    let fleet = snapdiff(
        ["fleet".as_ref(), "--json".as_ref()]
            .into_iter()
            .chain(files()),
    );
    let fleet_of_folder = snapdiff(["fleet".as_ref(), "--json".as_ref(), out.as_os_str()]);
    assert_eq!(fleet.expect_code(0).stderr(), "");
    assert_eq!(fleet.json(), fleet_of_folder.expect_code(0).json());
    let tables = dir.path().join("tables");
    let export = snapdiff(
        ["export".as_ref(), "-o".as_ref(), tables.as_os_str()]
            .into_iter()
            .chain(files()),
    );
    assert!(
        !export.expect_code(0).stderr().contains("invalid"),
        "{}",
        export.stderr()
    );
    let page = dir.path().join("report.html");
    let report = snapdiff(
        ["report".as_ref(), "-o".as_ref(), page.as_os_str()]
            .into_iter()
            .chain(files()),
    );
    assert!(
        !report.expect_code(0).stderr().contains("invalid"),
        "{}",
        report.stderr()
    );
    // Given only capture's own files, it says what they are.
    let only = snapdiff(["trend".as_ref(), out.join("manifest.jsonl").as_os_str()]);
    assert!(
        only.expect_code(2)
            .stderr()
            .contains("a file capture writes beside its dumps, not a snapshot"),
        "{}",
        only.stderr()
    );
}
