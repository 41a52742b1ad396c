//! A job run under capture (`capture`, `demo`): its environment and
//! start-up hook, the child process and its exit, the signals sent to
//! capture while it runs (`signals.rs`), and what it left in its folder.

mod signals;

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::Context;
use snapdiff_render::capture::{DumpTime, LostDump};
use snapdiff_runtime::config::{
    ENV_DIR, ENV_EVERY_STEPS, ENV_INTERVAL, ENV_REQUESTS, ENV_STACKS, ENV_TRACE_ENTRIES,
};

use crate::args::CaptureArgs;
use crate::exit::Exit;
use snapdiff_runs::manifest;

/// The Python start-up hook, put on the command's PYTHONPATH: records
/// PyTorch's memory history once torch is imported (see the files' own notes).
const PYTHON_HOOK: [(&str, &str); 8] = [
    (
        "sitecustomize.py",
        include_str!("../../../../python/snapdiff/hook/sitecustomize.py"),
    ),
    (
        "snapdiff_capture.py",
        include_str!("../../../../python/snapdiff/hook/snapdiff_capture.py"),
    ),
    (
        "snapdiff_dumping.py",
        include_str!("../../../../python/snapdiff/hook/snapdiff_dumping.py"),
    ),
    (
        "snapdiff_files.py",
        include_str!("../../../../python/snapdiff/hook/snapdiff_files.py"),
    ),
    (
        "snapdiff_signals.py",
        include_str!("../../../../python/snapdiff/hook/snapdiff_signals.py"),
    ),
    (
        "snapdiff_cpu_recorder.py",
        include_str!("../../../../python/snapdiff/hook/snapdiff_cpu_recorder.py"),
    ),
    (
        "snapdiff_cpu_alloc.cpp",
        include_str!("../../../../python/snapdiff/hook/snapdiff_cpu_alloc.cpp"),
    ),
    (
        "snapdiff_owners.py",
        include_str!("../../../../python/snapdiff/hook/snapdiff_owners.py"),
    ),
];

/// What a captured run left behind.
pub(crate) struct Captured {
    /// How CMD ended.
    pub(crate) exit: Exit,
    /// Snapshot files it wrote, oldest first.
    pub(crate) snapshots: Vec<PathBuf>,
    /// Dumps that could not be written.
    pub(crate) failed: Vec<LostDump>,
    /// Half-written dumps of killed processes, removed.
    pub(crate) abandoned: usize,
    /// When it wrote no snapshot, why, as far as its processes said.
    pub(crate) nothing_because: Option<String>,
    /// How long its dumps held it, as far as the manifest says.
    pub(crate) held: Option<DumpTime>,
    /// Whether `--watch --fail-fast` ended it at a suspect.
    pub(crate) failed_fast: bool,
    /// Processes whose recording stopped while they ran, with when and why:
    /// `pid 812 at step 10: ...`.
    pub(crate) stopped: Vec<String>,
}

/// The signals caught by [`catch_signals`], until [`capture`] serves them.
static CAUGHT: std::sync::Mutex<Option<signals::Caught>> = std::sync::Mutex::new(None);

/// Catches the signals capture owns, from now on: one that comes before the
/// job starts is served once it has, and none kills capture (which would
/// leave its temporary folder behind and the job unwatched).
pub(crate) fn catch_signals() {
    let mut caught = CAUGHT.lock().unwrap_or_else(|e| e.into_inner());
    if caught.is_none() {
        *caught = Some(signals::catch());
    }
}

/// Runs the command of `args` under capture.
pub(crate) fn capture(args: &CaptureArgs) -> anyhow::Result<Captured> {
    catch_signals();
    let signals = CAUGHT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .unwrap_or_else(signals::catch);
    let dir = writable_folder(&args.output)?;
    let hook = tempfile::Builder::new()
        .prefix("snapdiff-hook-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    for (name, text) in PYTHON_HOOK {
        std::fs::write(hook.path().join(name), text)
            .context("cannot write the Python start-up hook")?;
    }
    let requests = hook.path().join("requests");
    std::fs::write(&requests, b"").context("cannot write the file of dump requests")?;

    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let run = run_id();
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env(ENV_DIR, &dir)
        .env(ENV_RUN, &run)
        .env(ENV_REQUESTS, &requests)
        .env("SNAPDIFF_STATUS", hook.path().join("status"));
    if let Some(n) = args.every {
        cmd.env(ENV_EVERY_STEPS, n.to_string());
    }
    if let Some(t) = args.interval {
        // Seconds, parsed once here: the runtime and the hook read a number.
        cmd.env(ENV_INTERVAL, t.as_secs_f64().to_string());
    }
    if let Some(n) = args.max_entries {
        cmd.env(ENV_TRACE_ENTRIES, n.to_string());
    }
    if args.no_stacks {
        cmd.env(ENV_STACKS, "0");
    }
    // Owners are found by default; `--owners` is the default said aloud.
    let owners = args.owners || !args.no_owners;
    cmd.env("SNAPDIFF_OWNERS", if owners { "1" } else { "0" });
    let mut python_path = OsString::from(hook.path());
    if let Some(existing) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        python_path.push(":");
        python_path.push(existing);
    }
    cmd.env("PYTHONPATH", python_path);

    end_with_this_process(&mut cmd);

    let name = crate::output::shown(Path::new(program));
    let started = SystemTime::now();
    let before = snapshot_files(&dir);
    let manifest_before = std::fs::metadata(dir.join(manifest::FILE_NAME)).map_or(0, |m| m.len());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", program.to_string_lossy()))?;
    let forwarder = signals.forward_to(child.id(), requests, &name);
    let job_ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watching = (args.watch || args.live.asked())
        .then(|| {
            crate::live::beside_capture(
                dir.clone(),
                &args.live,
                &args.report,
                (child.id(), started),
                std::sync::Arc::clone(&job_ended),
            )
        })
        .transpose()?;
    let status = child.wait().context("cannot wait for the command")?;
    job_ended.store(true, std::sync::atomic::Ordering::Relaxed);
    let failed_fast = watching.is_some_and(|w| w.join().unwrap_or(false));
    forwarder.stop();
    let abandoned = remove_abandoned_dumps(&dir, &run);

    // Dumps another job wrote into the folder meanwhile (another run in
    // the manifest) are not this job's.
    let (entries, others): (Vec<manifest::Entry>, Vec<manifest::Entry>) =
        manifest::entries(&dir.join(manifest::FILE_NAME), manifest_before)
            .into_iter()
            .partition(|e| e.run.as_deref().is_none_or(|r| r == run));
    let others: HashSet<String> = others.into_iter().filter_map(|e| e.file).collect();
    let mut snapshots: Vec<PathBuf> = snapshot_files(&dir)
        .into_iter()
        .filter(|p| !before.contains(p))
        .filter(|p| {
            p.file_name()
                .is_none_or(|n| !others.contains(n.to_string_lossy().as_ref()))
        })
        .filter(|p| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= started)
        })
        .collect();
    snapshots.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    let exit = match (status.code(), signals::terminating_signal(&status)) {
        (Some(0), _) => Exit::Clean,
        (Some(code), _) => {
            eprintln!("snapdiff: {name} exited with code {code}");
            Exit::Code(code.clamp(1, 255) as u8)
        }
        (None, Some(signal)) => {
            eprintln!(
                "snapdiff: {name} was killed by signal {signal} ({})",
                signals::name(signal)
            );
            Exit::Code((128 + signal).clamp(1, 255) as u8)
        }
        (None, None) => Exit::Error,
    };
    let held = dump_time(&entries);
    let mut stopped: Vec<String> = Vec::new();
    let mut said = HashSet::new();
    for e in &entries {
        if let Some(why) = &e.stopped
            && said.insert(e.pid)
        {
            let who = e
                .pid
                .map_or_else(|| "a process".to_owned(), |p| format!("pid {p}"));
            let when = e
                .step
                .filter(|&s| s > 0)
                .map_or_else(String::new, |s| format!(" by step {s}"));
            let why = snapdiff_format::visible::escaped(why);
            stopped.push(format!("{who}: recording stopped{when}: {why}"));
        }
    }
    let failed = entries
        .into_iter()
        .filter(|entry| entry.file.is_none())
        .map(|entry| LostDump {
            step: entry.step,
            reason: entry.reason,
            error: entry.error.unwrap_or_default(),
        })
        .collect();
    let nothing_because = snapshots
        .is_empty()
        .then(|| why_nothing(&hook.path().join("status")));
    Ok(Captured {
        exit,
        snapshots,
        failed,
        abandoned,
        nothing_because,
        held,
        failed_fast,
        stopped,
    })
}

/// The time the written dumps of `entries` held the job, from the seconds
/// each line gives (`None` when no line gives any), with the interval
/// dumps skipped and how far the interval widened.
fn dump_time(entries: &[manifest::Entry]) -> Option<DumpTime> {
    let valid = |s: &f64| s.is_finite() && *s >= 0.0;
    // (the dump's seconds, its owners' seconds) of each written dump.
    let timed: Vec<(f64, Option<f64>)> = entries
        .iter()
        .filter(|e| e.file.is_some())
        .filter_map(|e| Some((e.seconds.filter(valid)?, e.owners_seconds.filter(valid))))
        .collect();
    if timed.is_empty() {
        return None;
    }
    let seconds: Vec<f64> = timed.iter().map(|t| t.0).collect();
    let owners: Vec<f64> = timed.iter().filter_map(|t| t.1).collect();
    // Each process counts its skipped ticks from its start: its last count.
    let mut skipped: std::collections::HashMap<Option<u32>, u64> = Default::default();
    for e in entries {
        if let Some(n) = e.skipped {
            let count = skipped.entry(e.pid).or_default();
            *count = (*count).max(n);
        }
    }
    let widened_to = entries
        .iter()
        .filter_map(|e| e.interval)
        .filter(|s| s.is_finite() && *s > 0.0)
        .reduce(f64::max);
    Some(DumpTime {
        dumps: seconds.len(),
        seconds: seconds.iter().sum(),
        longest: seconds.iter().copied().fold(0.0, f64::max),
        longest_without_owners: timed
            .iter()
            .map(|(s, o)| s - o.unwrap_or(0.0))
            .fold(0.0, f64::max),
        owners: (!owners.is_empty()).then(|| {
            (
                owners.iter().sum(),
                owners.iter().copied().fold(0.0, f64::max),
            )
        }),
        skipped_ticks: skipped.values().sum(),
        widened_to,
    })
}

/// What one Python process's capture came to (the hook's status line).
#[derive(Debug, Default, serde::Deserialize)]
struct PythonStatus {
    #[serde(default)]
    torch: bool,
    #[serde(default)]
    recording: bool,
    #[serde(default)]
    waiting: bool,
    #[serde(default)]
    cuda: bool,
    #[serde(default)]
    tensors: u64,
}

/// Why a run left no snapshot, from the status lines its Python processes
/// wrote at exit (none: no Python process ran the hook).
fn why_nothing(status: &Path) -> String {
    let lines: Vec<PythonStatus> = std::fs::read_to_string(status)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let with_torch: Vec<&PythonStatus> = lines.iter().filter(|s| s.torch).collect();
    if lines.is_empty() {
        "no Python process imported torch under capture, and no Rust program allocated \
         through snapdiff-runtime's Allocator::new (which dumps at exit)"
            .to_owned()
    } else if with_torch.is_empty() {
        "Python ran but never imported torch (capture records PyTorch's memory)".to_owned()
    } else if with_torch.iter().all(|s| s.waiting) {
        "torch was imported in child processes that never stepped an optimizer (capture waits \
         for a step there, to pass over DataLoader workers)"
            .to_owned()
    } else if with_torch.iter().all(|s| s.cuda && !s.recording) {
        "torch was imported but never used its CUDA device, so recording never began".to_owned()
    } else if with_torch.iter().all(|s| !s.cuda && s.tensors == 0) {
        "torch was imported but made no tensor".to_owned()
    } else {
        "torch was recording, but every dump failed or the process was killed before its first"
            .to_owned()
    }
}

/// Creates `dir` if needed and checks that a file can be written in it, so
/// that a job is never run for nothing.
fn writable_folder(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{}: cannot create the output folder", dir.display()))?;
    let dir =
        std::fs::canonicalize(dir).with_context(|| format!("{}: cannot resolve", dir.display()))?;
    tempfile::Builder::new()
        .prefix(".snapdiff-probe-")
        .tempfile_in(&dir)
        .with_context(|| format!("{}: cannot write in the output folder", dir.display()))?;
    Ok(dir)
}

/// The run of capture the job's processes are part of: the PyTorch hook
/// writes it in each manifest line and temporary file name.
const ENV_RUN: &str = "SNAPDIFF_RUN";

/// A new run's id: eight hex digits, random (the standard library's hash
/// keys are seeded by the system's random source).
fn run_id() -> String {
    use std::hash::BuildHasher;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let hash = std::collections::hash_map::RandomState::new().hash_one((now, std::process::id()));
    format!("{:08x}", hash as u32)
}

/// Removes the temporary files of dumps (and of their owners files) that
/// processes of this run of the job (`run`) were writing when they were
/// killed (SIGKILL, the OOM killer): the PyTorch hook and the runtime
/// (`snapdiff_format::write_atomically`) write each as
/// `.{name}.{random}.{run}.{pid}.tmp` and put it in place only when whole.
/// Files of processes still alive, of other runs (another job, another
/// machine sharing the folder) and of no run are left alone. Returns how
/// many went.
fn remove_abandoned_dumps(dir: &Path, run: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".tmp"))
            .and_then(|n| n.rsplit_once('.'))
            .and_then(|(rest, pid)| Some((rest.rsplit_once('.')?, pid)))
            .and_then(|((stem, of), pid)| (is_dump(stem) && of == run).then_some(pid))
            .and_then(|pid| pid.parse::<i32>().ok())
            .filter(|&pid| pid > 0)
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether a temporary's name before its run is a dump's (or its owners
/// file's): the hook's `rank0-step4...`, the runtime's `snapdiff-...`.
fn is_dump(stem: &str) -> bool {
    stem.contains("-step") || stem.starts_with("snapdiff-")
}

/// The job gets SIGTERM if `snapdiff capture` dies (even by SIGKILL), so it
/// writes its exit snapshot and ends instead of running on unwatched.
fn end_with_this_process(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Snapshot files in `dir`: what the runtime and the Python hook write.
fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name.starts_with("snapdiff-") && name.ends_with(".snap"))
                || ((name.starts_with("rank") || name.starts_with("pid"))
                    && name.ends_with(".pickle"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_written_dumps_of_dead_processes_are_removed_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut exited = Command::new("true").spawn().unwrap();
        exited.wait().unwrap();
        let dead = exited.id();
        let alive = std::process::id();
        let files = [
            (format!(".rank0-step4.0a1b2c3d.r1.{dead}.tmp"), false),
            (
                format!(".pid{dead}-step9-exit.0a1b2c3d.r1.{dead}.tmp"),
                false,
            ),
            (format!(".rank2-step6.3fa9c01b.r1.{dead}.tmp"), false),
            (
                format!(".pid{dead}-step4.owners.json.0e000d46.r1.{dead}.tmp"),
                false,
            ),
            (
                format!(".snapdiff-{dead}-dev0-0003-exit.snap.Xa9k2Q.r1.{dead}.tmp"),
                false,
            ),
            (format!(".rank1-step6.77e0d2aa.r1.{alive}.tmp"), true),
            // Another run's, or another machine's (its pid is none here).
            (format!(".rank0-step4.0a1b2c3d.r2.{dead}.tmp"), true),
            (format!(".rank0-step4.0a1b2c3d.-.{dead}.tmp"), true),
            (format!(".rank0-step4.{dead}.tmp"), true),
            (format!(".notes.r1.{dead}.tmp"), true),
            (format!("rank0-step4.r1.{dead}.tmp"), true),
            ("rank0-step3.pickle".to_owned(), true),
        ];
        for (name, _) in &files {
            std::fs::write(dir.path().join(name), b"partial").unwrap();
        }
        assert_eq!(remove_abandoned_dumps(dir.path(), "r1"), 5);
        for (name, kept) in &files {
            assert_eq!(dir.path().join(name).exists(), *kept, "{name}");
        }
    }
}
