//! The signals capture owns while the job runs: termination signals are
//! passed on to the job; SIGUSR1 is a request for a snapshot, asked of the
//! job's processes through a file (see `ENV_REQUESTS`), never sent as a
//! signal, which would kill a process that has no handler for it (before
//! `import torch`, in a program that never imports it, or at interpreter
//! shutdown).

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
