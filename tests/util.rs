//! Test helpers: running the built `snapdiff`, temp folders, fixture paths.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The project's own fixtures (`fixtures/`).
pub fn fixture(name: &str) -> PathBuf {
    root().join("fixtures").join(name)
}

/// The real PyTorch snapshots in `../shared/fixtures/torch/` and
/// `../shared/fixtures/torch-incoming/`, one set, or `None` when the first
/// folder is absent. Under CI (`SNAPDIFF_REQUIRE_SHARED=1`, set by
/// `.ci/run`) a missing folder fails the test instead of skipping it.
pub fn shared_torch_fixtures() -> Option<Vec<PathBuf>> {
    let shared = root().join("../shared/fixtures");
    let dir = shared.join("torch");
    if !dir.is_dir() {
        assert!(
            std::env::var_os("SNAPDIFF_REQUIRE_SHARED").is_none(),
            "{} is missing, and SNAPDIFF_REQUIRE_SHARED says it must be there",
            dir.display()
        );
        skip(
            "../shared/fixtures",
            "the shared folder beside the repository",
        );
        return None;
    }
    let mut files: Vec<PathBuf> = ["torch", "torch-incoming"]
        .iter()
        .filter_map(|folder| std::fs::read_dir(shared.join(folder)).ok())
        .flatten()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    files.sort_by_key(|p| p.file_name().map(std::ffi::OsStr::to_owned));
    assert!(!files.is_empty(), "no pickles in {}", dir.display());
    Some(files)
}

/// Whether `file` holds the allocator's state only: its trace is empty, or
/// one entry (memory history off when it was dumped), so analyses of a
/// trace have nothing to read.
pub fn state_only(file: &Path) -> bool {
    let summary = snapdiff(["summary".as_ref(), file.as_os_str(), "--json".as_ref()]).json();
    summary["trace_events"].as_u64().unwrap_or(0) <= 1
}

/// One real PyTorch snapshot by file name, if `../shared` is present.
pub fn shared_torch(name: &str) -> Option<PathBuf> {
    shared_torch_fixtures()?
        .into_iter()
        .find(|p| p.file_name().unwrap() == name)
}

#[path = "support/skip.rs"]
mod skipped;
pub use skipped::skip;

/// A fresh temporary folder, removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("snapdiff-test-")
        .tempdir()
        .unwrap()
}

/// The result of running `snapdiff`.
pub struct Run {
    pub args: Vec<String>,
    pub output: Output,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    /// Asserts the exit code, printing everything on failure.
    pub fn expect_code(&self, code: i32) -> &Run {
        assert_eq!(
            self.code(),
            code,
            "\ncommand: snapdiff {}\nstdout:\n{}\nstderr:\n{}",
            self.args.join(" "),
            self.stdout(),
            self.stderr()
        );
        self
    }
    /// The trend of `trend --json` on one process's files: the one entry
    /// of its `processes`, with the report's `frames` and `stacks` tables.
    pub fn one_trend(&self) -> serde_json::Value {
        let mut report = self.json();
        let processes = report["processes"].as_array().cloned().unwrap_or_default();
        assert_eq!(processes.len(), 1, "one process: {report:#}");
        let mut trend = processes[0]["trend"].clone();
        for table in ["frames", "stacks"] {
            trend[table] = report[table].take();
        }
        trend
    }
    /// Parses stdout as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout()).unwrap_or_else(|e| {
            panic!(
                "stdout of snapdiff {} is not JSON ({e}):\n{}",
                self.args.join(" "),
                self.stdout()
            )
        })
    }
}

/// Runs the built `snapdiff` with `args`.
pub fn snapdiff<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    snapdiff_with_env(args, &[])
}

/// Runs the built `snapdiff` with `args` and the variables `env` set.
pub fn snapdiff_with_env<I, S>(args: I, env: &[(&str, &std::ffi::OsStr)]) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let output = Command::new(env!("CARGO_BIN_EXE_snapdiff"))
        .args(&args)
        .envs(env.iter().copied())
        .env_remove("NO_COLOR")
        // Piped output is never coloured, whatever the environment forces.
        .env_remove("CLICOLOR_FORCE")
        .output()
        .expect("run snapdiff");
    Run {
        args: args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        output,
    }
}

/// Runs `snapdiff compare A B --json`, expecting exit code 0.
pub fn compare_json(a: &Path, b: &Path) -> serde_json::Value {
    snapdiff([
        "compare".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--json".as_ref(),
    ])
    .expect_code(0)
    .json()
}

/// Runs `python3 tests/support/<script> args...` and parses its JSON output.
pub fn python_json<S: AsRef<std::ffi::OsStr>>(script: &str, args: &[S]) -> serde_json::Value {
    let out = python_file(&root().join("tests/support").join(script), args);
    serde_json::from_str(&out).unwrap()
}

/// Runs `python3 FILE args...` (a script of the repository) and returns its
/// standard output; fails the test with Python's error if it fails.
pub fn python_file<S: AsRef<std::ffi::OsStr>>(file: &Path, args: &[S]) -> String {
    let out = Command::new("python3")
        .arg(file)
        .args(args)
        .output()
        .expect("python3 must be installed to run the test's scripts");
    assert!(
        out.status.success(),
        "python3 {} failed:\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether python3 imports `module`, which a test's script needs; when it
/// cannot, the test says it skips (see [`skip`]; `install` says how to get
/// it), or fails under CI (`SNAPDIFF_REQUIRE_PYTHON_PACKAGES=1`, set by
/// `.ci/run`, which installs them).
pub fn python_imports(module: &str, install: &str) -> bool {
    let found = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        assert!(
            std::env::var_os("SNAPDIFF_REQUIRE_PYTHON_PACKAGES").is_none(),
            "python3 cannot import {module}, and SNAPDIFF_REQUIRE_PYTHON_PACKAGES says it must"
        );
        skip(module, install);
    }
    found
}

/// Runs `python3 -c script args...` (CPython writes the test's files) and
/// returns its standard output; fails the test with Python's error if it fails.
pub fn python_script<S: AsRef<std::ffi::OsStr>>(script: &str, args: &[S]) -> String {
    let out = Command::new("python3")
        .args(["-c", script])
        .args(args)
        .output()
        .expect("python3 must be installed to write test files");
    assert!(
        out.status.success(),
        "python3 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A pickle of `body` (opcodes after the protocol header) at protocol 4.
pub fn pickle4(body: &[u8]) -> Vec<u8> {
    [&[0x80, 4][..], body].concat()
}

/// The `.snap` dumps of the built-in training job leaking
/// (`keep-activations`) for `steps` steps under capture, one every `every`
/// steps, written into `dir`, in step order.
pub fn leaking_training_job(dir: &Path, steps: u32, every: u32) -> Vec<PathBuf> {
    training_job(dir, steps, every, &["--leak", "keep-activations"])
}

/// [`leaking_training_job`] without a leak.
pub fn steady_training_job(dir: &Path, steps: u32, every: u32) -> Vec<PathBuf> {
    training_job(dir, steps, every, &[])
}

/// The built-in training job under capture with `flags` (see
/// [`leaking_training_job`]).
fn training_job(dir: &Path, steps: u32, every: u32, flags: &[&str]) -> Vec<PathBuf> {
    let (steps, every) = (steps.to_string(), every.to_string());
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "capture".as_ref(),
        "-o".as_ref(),
        dir.as_os_str(),
        "--every".as_ref(),
        every.as_ref(),
        "--no-report".as_ref(),
        "--".as_ref(),
        env!("CARGO_BIN_EXE_snapdiff").as_ref(),
        "train".as_ref(),
        "--steps".as_ref(),
        steps.as_ref(),
        "--log-every".as_ref(),
        "0".as_ref(),
    ];
    args.extend(flags.iter().map(std::ffi::OsStr::new));
    snapdiff(args).expect_code(0);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "snap"))
        .collect();
    files.sort();
    files
}

/// A folder every user may write in, as a shared output folder on a
/// cluster is (mode 0777 without the sticky bit, so that the kernel's
/// protection of links in sticky folders plays no part), under `parent`
/// (made traversable).
pub fn shared_folder(parent: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// Plants a symbolic link at `link` to `target`, as another user would in
/// a shared folder: made by `nobody` (uid 65534) when the tests run as
/// root, else by this user.
pub fn plant_link(target: &Path, link: &Path) {
    use std::os::unix::process::CommandExt;
    let mut ln = std::process::Command::new("ln");
    ln.arg("-s").arg(target).arg(link);
    // SAFETY: geteuid only reads this process's credentials.
    if unsafe { libc::geteuid() } == 0 {
        ln.uid(65534).gid(65534);
    }
    let status = ln.status().unwrap();
    assert!(
        status.success(),
        "ln -s {} {}",
        target.display(),
        link.display()
    );
    assert!(link.is_symlink());
}

/// Two runs of one job in sibling folders, as PyTorch's own dumps without
/// a manifest (`job/runA/rank1-step3.pickle`, `job/runB/rank1-step3.pickle`):
/// run A leaks (the `backward` series, at line 31), run B is steady (the
/// `graph-pool` series). Returns `job` and the files, run A's first.
pub fn sibling_runs(parent: &Path) -> (PathBuf, Vec<PathBuf>) {
    let job = parent.join("job");
    let mut files = Vec::new();
    for (run, series) in [("runA", "backward"), ("runB", "graph-pool")] {
        let to = job.join(run);
        std::fs::create_dir_all(&to).unwrap();
        let mut from: Vec<PathBuf> = std::fs::read_dir(fixture("torch-format").join(series))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        from.sort();
        for file in from {
            let name = file.file_name().unwrap().to_str().unwrap();
            let to = to.join(format!("rank1-{name}"));
            std::fs::copy(&file, &to).unwrap();
            files.push(to);
        }
    }
    (job, files)
}

/// The body of `snap`'s `.snap` file of format version 2: the MessagePack
/// encoding of the whole snapshot, events and all.
pub fn snap_v2_body(snap: &snapdiff_format::Snapshot) -> Vec<u8> {
    rmp_serde::to_vec(snap).unwrap()
}

/// A `.snap` file of format version 2, as snapdiff wrote them before
/// version 3: the 20-byte header declaring a body of `body_len` bytes, then
/// `compressed` (one zstd frame, in a file snapdiff wrote).
pub fn snap_v2_file(body_len: u64, compressed: &[u8]) -> Vec<u8> {
    let mut out = snapdiff_format::MAGIC.to_vec();
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(compressed);
    out
}
