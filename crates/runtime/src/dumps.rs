//! Automatic dumps: every N steps, every interval, on out-of-memory, on
//! `SIGUSR1` and at exit, into the folder `snapdiff capture` names.
//!
//! A dump that fails (disk full, folder gone) is reported on stderr and the
//! program goes on allocating.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Once, Weak};

use crate::recorder::Recorder;

/// Allocators that dump automatically, for the exit and signal handlers.
static REGISTRY: Mutex<Vec<Weak<Recorder>>> = Mutex::new(Vec::new());

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
        eprintln!("snapdiff-runtime: cannot write snapshot: {e}");
    }
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
                    let live: Vec<Arc<Recorder>> = {
                        let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
                        registry.iter().filter_map(Weak::upgrade).collect()
                    };
                    for recorder in &live {
                        auto_dump(recorder, "signal", recorder.config.dump_on_signal);
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("snapdiff-runtime: cannot dump on SIGUSR1: {e}");
        }
    });
}

#[cfg(not(unix))]
fn start_signal_thread() {}
