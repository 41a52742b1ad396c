//! Automatic dumps: every N steps, every interval, on out-of-memory, on
//! `SIGUSR1` (sent to the process, or to `snapdiff capture`) and at exit,
//! into the folder `snapdiff capture` names.
//!
//! A dump that fails (disk full, folder gone) is reported once on stderr,
//! counted at exit, and noted in the folder's `manifest.jsonl` so that
//! capture's verdict says which steps it lacks; the program goes on
//! allocating.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

use crate::recorder::Recorder;

/// Allocators that dump automatically, for the exit and signal handlers.
static REGISTRY: Mutex<Vec<Weak<Recorder>>> = Mutex::new(Vec::new());

/// Dumps that could not be written, and the last one's error.
static FAILURES: AtomicUsize = AtomicUsize::new(0);
static LAST_FAILURE: Mutex<String> = Mutex::new(String::new());

/// How often the file of capture's requests is looked at (one `stat`).
const REQUEST_POLL: Duration = Duration::from_millis(200);

/// The manifest capture reads beside the dumps (see `snapdiff capture`).
const MANIFEST: &str = snapdiff_format::names::MANIFEST_FILE_NAME;

/// Starts automatic dumps for a new allocator, if its configuration asks for them.
pub(crate) fn register(recorder: &Arc<Recorder>) {
    let config = &recorder.config;
    if config.dump_dir.is_none() {
        return;
    }
    {
        let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        registry.retain(|w| w.strong_count() > 0);
        registry.push(Arc::downgrade(recorder));
    }
    if config.dump_on_exit {
        static AT_EXIT: Once = Once::new();
        // SAFETY: registers a function that takes no arguments and does not unwind.
        AT_EXIT.call_once(|| unsafe {
            libc::atexit(dump_all_at_exit);
        });
    }
    if config.dump_on_signal {
        start_signal_thread();
        if let Some(requests) = std::env::var_os(crate::config::ENV_REQUESTS) {
            start_request_thread(PathBuf::from(requests));
        }
    }
    if let Some(interval) = config.dump_interval {
        let weak = Arc::downgrade(recorder);
        let spawned = std::thread::Builder::new()
            .name("snapdiff-interval".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(interval);
                    match weak.upgrade() {
                        Some(recorder) => auto_dump(&recorder, "interval", true),
                        None => break,
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("snapdiff-runtime: cannot start interval dumps: {e}");
        }
    }
}

/// Writes a snapshot into the dump folder, named after the process, the
/// device, a sequence number and `reason`, if dumps are on and `enabled`.
pub(crate) fn auto_dump(recorder: &Recorder, reason: &str, enabled: bool) {
    let Some(dir) = recorder.config.dump_dir.as_ref().filter(|_| enabled) else {
        return;
    };
    let seq = recorder.dump_seq.fetch_add(1, Ordering::Relaxed);
    let name = format!(
        "snapdiff-{}-dev{}-{seq:04}-{reason}.snap",
        std::process::id(),
        recorder.device_ordinal()
    );
    let path: PathBuf = dir.join(name);
    let snap = recorder.snapshot();
    if let Err(e) = snapdiff_format::write_path(&path, &snap, snapdiff_format::Existing::Keep) {
        dump_failed(dir, recorder, reason, &e.to_string());
    }
}

/// Reports a dump that could not be written: in full the first time (later
/// ones are counted, and said at exit), and as a line of the manifest, as
/// the PyTorch hook notes its own.
fn dump_failed(dir: &Path, recorder: &Recorder, reason: &str, error: &str) {
    if FAILURES.fetch_add(1, Ordering::Relaxed) == 0 {
        eprintln!("snapdiff-runtime: cannot write snapshot: {error}; the program goes on");
    }
    *LAST_FAILURE.lock().unwrap_or_else(|e| e.into_inner()) = error.to_owned();
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    // A step's dump is named `step-000014`; the manifest says why: "step".
    let reason = if reason.starts_with("step-") {
        "step"
    } else {
        reason
    };
    let entry = serde_json::json!({
        "file": null,
        "error": error,
        "pid": std::process::id(),
        "device": format!("dev{}", recorder.device_ordinal()),
        "step": recorder.step(),
        "time": time,
        "reason": reason,
    });
    append(&dir.join(MANIFEST), format!("{entry}\n").as_bytes());
}

/// Appends `bytes` to the file at `path` in one write (so that lines of
/// several processes never interleave), never through a symbolic link
/// (one planted in a shared folder would redirect the write); a failure
/// is said once, never raised.
fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    static SAID: Once = Once::new();
    let mut options = std::fs::OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let written = options
        .open(path)
        .and_then(|mut file| file.write_all(bytes));
    if let Err(e) = written {
        #[cfg(unix)]
        let planted = e.raw_os_error() == Some(libc::ELOOP);
        #[cfg(not(unix))]
        let planted = false;
        SAID.call_once(|| {
            let why = if planted {
                "a symbolic link is there; not followed".to_owned()
            } else {
                e.to_string()
            };
            eprintln!(
                "snapdiff-runtime: cannot append to {}: {why}",
                path.display()
            );
        });
    }
}

/// Every live allocator's dump for `reason`.
fn dump_all(reason: &str) {
    let live: Vec<Arc<Recorder>> = {
        let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        registry.iter().filter_map(Weak::upgrade).collect()
    };
    for recorder in &live {
        auto_dump(recorder, reason, recorder.config.dump_on_signal);
    }
}

/// Serves the dumps `snapdiff capture` asks for through `requests` (see
/// [`ENV_REQUESTS`](crate::config::ENV_REQUESTS)): a byte appended is one
/// request.
fn start_request_thread(requests: PathBuf) {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let size = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
        let mut served = requests.clone().into_os_string();
        served.push(".served");
        let served = PathBuf::from(served);
        let spawned = std::thread::Builder::new()
            .name("snapdiff-requests".into())
            .spawn(move || {
                let mut seen = size(&requests);
                loop {
                    std::thread::sleep(REQUEST_POLL);
                    let now = size(&requests);
                    if now > seen {
                        seen = now;
                        append(&served, b".");
                        dump_all("signal");
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("snapdiff-runtime: cannot serve capture's dump requests: {e}");
        }
    });
}

/// The exit dump of `recorder`, at most once.
fn exit_dump(recorder: &Recorder) {
    if recorder.config.dump_on_exit && !recorder.exit_dumped.swap(true, Ordering::AcqRel) {
        auto_dump(recorder, "exit", true);
    }
}

extern "C" fn dump_all_at_exit() {
    // Never block or unwind at exit: skip if another thread holds the registry.
    let Ok(registry) = REGISTRY.try_lock() else {
        return;
    };
    let live: Vec<Arc<Recorder>> = registry.iter().filter_map(Weak::upgrade).collect();
    drop(registry);
    for recorder in &live {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exit_dump(recorder)));
    }
    let failures = FAILURES.load(Ordering::Relaxed);
    if failures > 1
        && let Ok(last) = LAST_FAILURE.try_lock()
    {
        eprintln!("snapdiff-runtime: {failures} snapshot writes failed; the last: {last}");
    }
}

#[cfg(unix)]
fn start_signal_thread() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let signals = match signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1]) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("snapdiff-runtime: cannot dump on SIGUSR1: {e}");
                return;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("snapdiff-signal".into())
            .spawn(move || {
                let mut signals = signals;
                for _ in signals.forever() {
                    dump_all("signal");
                }
            });
        if let Err(e) = spawned {
            eprintln!("snapdiff-runtime: cannot dump on SIGUSR1: {e}");
        }
    });
}

#[cfg(not(unix))]
fn start_signal_thread() {}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_that_is_a_planted_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let manifest = dir.path().join(MANIFEST);
        std::os::unix::fs::symlink(&victim, &manifest).unwrap();
        append(&manifest, b"{\"file\": null}\n");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(manifest.is_symlink());
        // A plain manifest is appended to.
        let plain = dir.path().join("plain.jsonl");
        append(&plain, b"a\n");
        append(&plain, b"b\n");
        assert_eq!(std::fs::read(&plain).unwrap(), b"a\nb\n");
    }
}
