//! `snapdiff capture [-o DIR] [--every N | --interval T] -- CMD [ARGS...]`.
//!
//! Runs CMD with the environment that makes `snapdiff-runtime` (and, through
//! a start-up hook, PyTorch) dump snapshots into DIR, passes termination
//! signals on to it, returns its exit code, and then reports on what it
//! wrote.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::Context;
use snapdiff_runtime::config::{
    ENV_DIR, ENV_EVERY_STEPS, ENV_INTERVAL, ENV_REQUESTS, ENV_STACKS, ENV_TRACE_ENTRIES,
};

use crate::args::CaptureArgs;
use crate::exit::Exit;
use crate::manifest;

/// The Python start-up hook, put on the command's PYTHONPATH: records
/// PyTorch's memory history once torch is imported (see the files' own notes).
const PYTHON_HOOK: [(&str, &str); 3] = [
    (
        "sitecustomize.py",
        include_str!("../../../../python/snapdiff/hook/sitecustomize.py"),
    ),
    (
        "snapdiff_capture.py",
        include_str!("../../../../python/snapdiff/hook/snapdiff_capture.py"),
    ),
    (
        "snapdiff_cpu_recorder.py",
        include_str!("../../../../python/snapdiff/hook/snapdiff_cpu_recorder.py"),
    ),
];

/// What a captured run left behind.
pub(crate) struct Captured {
    /// How CMD ended.
    pub(crate) exit: Exit,
    /// Snapshot files it wrote, oldest first.
    pub(crate) snapshots: Vec<PathBuf>,
    /// Dumps that could not be written.
    pub(crate) failed: Vec<FailedDump>,
    /// Half-written dumps of killed processes, removed.
    pub(crate) abandoned: usize,
}

/// A dump the PyTorch hook could not write (a full disk, say).
pub(crate) struct FailedDump {
    /// The optimizer steps done when it was due.
    pub(crate) step: Option<u64>,
    /// Why it was due: step, interval, signal, oom or exit.
    pub(crate) reason: Option<String>,
    /// Why it failed.
    pub(crate) error: String,
}

/// The top-level entry point for `snapdiff capture`.
pub(crate) fn run(args: CaptureArgs) -> anyhow::Result<Exit> {
    let captured = capture(&args)?;
    // JSON escapes control characters itself, and must stay exact.
    let mut out: Box<dyn std::io::Write> = if args.report.json {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(crate::output::text_out())
    };
    use std::io::Write;
    // What was written is said on stderr under --json, which stdout keeps for JSON.
    if args.report.json {
        report_files(&mut std::io::stderr().lock(), &args.output, &captured)?;
    } else {
        report_files(&mut out, &args.output, &captured)?;
    }
    if args.no_report || captured.snapshots.is_empty() {
        return Ok(match args.fail_over {
            Some(_) if captured.exit == Exit::Clean => {
                eprintln!("snapdiff: no snapshot to judge, so no verdict (--fail-over)");
                Exit::Error
            }
            _ => captured.exit,
        });
    }
    // Snapshots of different processes (ranks, or a job and its children)
    // are never mixed: each process is reported on its own.
    let processes = crate::processes::by_process(&captured.snapshots);
    if processes.len() > 1 {
        let names: Vec<&str> = processes.iter().map(|(p, _)| p.as_str()).collect();
        writeln!(
            out,
            "\nsnapshots of {} processes ({}): each is reported on its own",
            processes.len(),
            names.join(", ")
        )?;
    }
    let mut over = Vec::new();
    let mut growing = Vec::new();
    for (process, files) in &processes {
        writeln!(out)?;
        if processes.len() > 1 {
            writeln!(out, "{process}:")?;
        }
        let suspected = crate::cmd::trend::report(files, &args.report, &mut out)?;
        if suspected.is_some_and(|bytes| bytes > 0) {
            growing.push(process.as_str());
        }
        if let (Some(bytes), Some(limit)) = (suspected, args.fail_over)
            && bytes > limit
        {
            over.push(format!("{process}: {}", snapdiff_render::text::size(bytes)));
        }
        // A job that died of an out-of-memory error: what it asked for and
        // what held the memory, from the dump taken at the error.
        if let Some(oom_dump) = files.iter().rev().find(|f| {
            f.file_stem()
                .is_some_and(|s| s.to_string_lossy().ends_with("-oom"))
        }) && !args.report.json
        {
            writeln!(
                out,
                "
out of memory: {}",
                oom_dump.display()
            )?;
            match crate::input::read(oom_dump) {
                Ok(snap) => crate::cmd::oom::report(&snap, &args.report, &mut out)?,
                Err(e) => eprintln!(
                    "snapdiff: {}",
                    snapdiff_format::visible::escaped(&e.to_string())
                ),
            }
        }
    }
    if !growing.is_empty() && growing.len() < processes.len() && !args.report.json {
        writeln!(
            out,
            "\nnote: {}",
            snapdiff_render::trend::one_rank_note(&growing)
        )?;
    }
    out.flush()?;
    if captured.exit != Exit::Clean {
        return Ok(captured.exit);
    }
    let Some(limit) = args.fail_over else {
        return Ok(Exit::Clean);
    };
    if !over.is_empty() {
        eprintln!(
            "snapdiff: suspected growth over the {} limit (--fail-over) in {}",
            snapdiff_render::text::size(limit),
            over.join("; ")
        );
        return Ok(Exit::OverThreshold);
    }
    if !captured.failed.is_empty() {
        eprintln!(
            "snapdiff: {} of {} dumps failed, so the evidence is incomplete: no verdict \
             (--fail-over)",
            captured.failed.len(),
            captured.failed.len() + captured.snapshots.len()
        );
        return Ok(Exit::Error);
    }
    Ok(Exit::Clean)
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
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env(ENV_DIR, &dir)
        .env(ENV_REQUESTS, &requests);
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
    let status = child.wait().context("cannot wait for the command")?;
    forwarder.stop();
    let abandoned = remove_abandoned_dumps(&dir);

    let mut snapshots: Vec<PathBuf> = snapshot_files(&dir)
        .into_iter()
        .filter(|p| !before.contains(p))
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
    let failed = manifest::entries(&dir.join(manifest::FILE_NAME), manifest_before)
        .into_iter()
        .filter(|entry| entry.file.is_none())
        .map(|entry| FailedDump {
            step: entry.step,
            reason: entry.reason,
            error: entry.error.unwrap_or_default(),
        })
        .collect();
    Ok(Captured {
        exit,
        snapshots,
        failed,
        abandoned,
    })
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

/// Removes the temporary files of dumps that processes of the job were
/// writing when they were killed (SIGKILL, the OOM killer): the PyTorch hook
/// writes `.{stem}.{pid}.tmp` and renames it into place only when whole.
/// Files of processes still alive are left alone. Returns how many went.
fn remove_abandoned_dumps(dir: &Path) -> usize {
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
            .and_then(|(stem, pid)| stem.contains("-step").then_some(pid))
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

/// Lists what was written, or says plainly that nothing was.
pub(crate) fn report_files(
    out: &mut dyn std::io::Write,
    dir: &Path,
    captured: &Captured,
) -> anyhow::Result<()> {
    match captured.snapshots.len() {
        0 => writeln!(
            out,
            "no snapshot was written to {}: does the program allocate through snapdiff-runtime's \
             Allocator::new, or use PyTorch with CUDA?",
            dir.display()
        )?,
        n => {
            writeln!(
                out,
                "{n} snapshot{} in {}:",
                if n == 1 { "" } else { "s" },
                dir.display()
            )?;
            let shown = 8;
            for p in captured.snapshots.iter().take(shown) {
                writeln!(
                    out,
                    "  {}",
                    p.file_name().unwrap_or_default().to_string_lossy()
                )?;
            }
            if n > shown {
                writeln!(out, "  ... and {} more", n - shown)?;
            }
        }
    }
    if captured.abandoned > 0 {
        writeln!(
            out,
            "removed {} half-written dump{} of a killed process",
            captured.abandoned,
            if captured.abandoned == 1 { "" } else { "s" }
        )?;
    }
    if let Some(first) = captured.failed.first() {
        let steps: Vec<String> = captured
            .failed
            .iter()
            .filter_map(|f| match (f.step, f.reason.as_deref()) {
                (Some(step), Some("step") | None) => Some(step.to_string()),
                (Some(step), Some(reason)) => Some(format!("{step} ({reason})")),
                (None, _) => None,
            })
            .collect();
        writeln!(
            out,
            "{} dump{} could not be written (at step{} {}): {}; the report covers only the \
             snapshots listed",
            captured.failed.len(),
            if captured.failed.len() == 1 { "" } else { "s" },
            if steps.len() == 1 { "" } else { "s" },
            steps.join(", "),
            first.error
        )?;
    }
    Ok(())
}

/// The signals capture owns while the job runs: termination signals are
/// passed on to the job; SIGUSR1 is a request for a snapshot, asked of the
/// job's processes through a file (see `ENV_REQUESTS`), never sent as a
/// signal, which would kill a process that has no handler for it (before
/// `import torch`, in a program that never imports it, or at interpreter
/// shutdown).
mod signals {
    use std::os::unix::process::ExitStatusExt;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1};
    use signal_hook::iterator::Signals;

    /// How long a request may wait for a process of the job to take it
    /// before capture says that none could (the hooks look every 0.2 s).
    const ANSWER_WITHIN: Duration = Duration::from_secs(2);

    /// Signals caught, not yet served.
    pub(super) struct Caught(Option<Signals>);

    /// Serves the signals while the job runs; see [`Forwarder::stop`].
    pub(super) struct Forwarder(Arc<AtomicBool>);

    impl Forwarder {
        /// Says that the job has ended. The signals stay caught until
        /// capture exits (letting them go would bring back their default
        /// action: a SIGUSR1 meant for the job would kill capture as it
        /// reports): SIGUSR1 is then ignored, and a termination signal ends
        /// capture as it would have.
        pub(super) fn stop(self) {
            self.0.store(true, Ordering::Release);
        }
    }

    /// Catches SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGUSR1 from now on.
    pub(super) fn catch() -> Caught {
        Caught(Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1]).ok())
    }

    impl Caught {
        /// Serves the signals caught, from before too, until stopped:
        /// termination signals go on to process `pid`, and SIGUSR1 appends
        /// a byte to `requests`. A Ctrl-C typed at the terminal already
        /// reaches the child (same process group), so SIGINT is only passed
        /// on when this process is not in the terminal's foreground group.
        pub(super) fn forward_to(self, pid: u32, requests: PathBuf, job: &str) -> Forwarder {
            let ended = Arc::new(AtomicBool::new(false));
            let Some(mut signals) = self.0 else {
                return Forwarder(ended);
            };
            let job = job.to_owned();
            let checking = Arc::new(AtomicBool::new(false));
            let job_ended = Arc::clone(&ended);
            std::thread::spawn(move || {
                for signal in signals.forever() {
                    let ended = job_ended.load(Ordering::Acquire);
                    match signal {
                        SIGUSR1 if ended => {}
                        SIGUSR1 => request_dump(&requests, &job, &checking),
                        _ if ended => std::process::exit(128 + signal),
                        SIGINT if in_foreground() => {}
                        // SAFETY: sends a signal to our own child.
                        _ => unsafe {
                            libc::kill(pid as libc::pid_t, signal);
                        },
                    }
                }
            });
            Forwarder(ended)
        }
    }

    /// Asks every process of the job for a dump. When none has taken the
    /// request within [`ANSWER_WITHIN`], says so in one line (one check at
    /// a time, however many signals come).
    fn request_dump(requests: &Path, job: &str, checking: &Arc<AtomicBool>) {
        let mut served = requests.as_os_str().to_owned();
        served.push(".served");
        let served = PathBuf::from(served);
        let size = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
        let before = size(&served);
        {
            use std::io::Write;
            let appended = std::fs::OpenOptions::new()
                .append(true)
                .open(requests)
                .and_then(|mut f| f.write_all(b"."));
            if let Err(e) = appended {
                eprintln!("snapdiff: SIGUSR1: cannot ask {job} for a snapshot ({e})");
                return;
            }
        }
        if checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let (checking, job) = (Arc::clone(checking), job.to_owned());
        std::thread::spawn(move || {
            std::thread::sleep(ANSWER_WITHIN);
            if size(&served) == before {
                eprintln!(
                    "snapdiff: SIGUSR1: no process of {job} can take a snapshot yet (PyTorch \
                     not imported, or no snapdiff-runtime allocator); none taken"
                );
            }
            checking.store(false, Ordering::Release);
        });
    }

    fn in_foreground() -> bool {
        // SAFETY: plain queries of this process and its terminal.
        unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
    }

    /// The signal that killed a child, if one did.
    pub(super) fn terminating_signal(status: &std::process::ExitStatus) -> Option<i32> {
        status.signal()
    }

    /// A signal's name.
    pub(super) fn name(signal: i32) -> &'static str {
        match signal {
            1 => "SIGHUP",
            2 => "SIGINT",
            3 => "SIGQUIT",
            6 => "SIGABRT",
            9 => "SIGKILL",
            11 => "SIGSEGV",
            15 => "SIGTERM",
            _ => "signal",
        }
    }
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
            (format!(".rank0-step4.{dead}.tmp"), false),
            (format!(".pid{dead}-step9-exit.{dead}.tmp"), false),
            (format!(".rank1-step4.{alive}.tmp"), true),
            (format!(".notes.{dead}.tmp"), true),
            (format!("rank0-step4.{dead}.tmp"), true),
            ("rank0-step3.pickle".to_owned(), true),
        ];
        for (name, _) in &files {
            std::fs::write(dir.path().join(name), b"partial").unwrap();
        }
        assert_eq!(remove_abandoned_dumps(dir.path()), 2);
        for (name, kept) in &files {
            assert_eq!(dir.path().join(name).exists(), *kept, "{name}");
        }
    }
}
