//! Automatic dumps: every N steps, every interval, on out-of-memory, on
//! `SIGUSR1` and at exit, into the folder `snapdiff capture` names.
//!
//! A dump that fails (disk full, folder gone) is reported on stderr and the
//! program goes on allocating.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};

use crate::allocator::Inner;

/// Allocators that dump automatically, for the exit and signal handlers.
static REGISTRY: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// Starts automatic dumps for a new allocator, if its configuration asks for them.
pub(crate) fn register(inner: &Arc<Inner>) {
    let config = &inner.config;
    if config.dump_dir.is_none() {
        return;
    }
    {
        let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        registry.retain(|w| w.strong_count() > 0);
        registry.push(Arc::downgrade(inner));
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
        let weak = Arc::downgrade(inner);
        let spawned = std::thread::Builder::new()
            .name("snapdiff-interval".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(interval);
                    match weak.upgrade() {
                        Some(inner) => auto_dump(&inner, "interval", true),
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
pub(crate) fn auto_dump(inner: &Inner, reason: &str, enabled: bool) {
    let Some(dir) = inner.config.dump_dir.as_ref().filter(|_| enabled) else {
        return;
    };
    let seq = inner.dump_seq.fetch_add(1, Ordering::Relaxed);
    let name = format!(
        "snapdiff-{}-dev{}-{seq:04}-{reason}.snap",
        std::process::id(),
        inner.device_ordinal()
    );
    let path: PathBuf = dir.join(name);
    let snap = inner.snapshot();
    if let Err(e) = snapdiff_format::write_path(&path, &snap, snapdiff_format::Existing::Keep) {
        eprintln!("snapdiff-runtime: cannot write snapshot: {e}");
    }
}

/// The exit dump of `inner`, at most once.
fn exit_dump(inner: &Inner) {
    if inner.config.dump_on_exit && !inner.exit_dumped.swap(true, Ordering::AcqRel) {
        auto_dump(inner, "exit", true);
    }
}

extern "C" fn dump_all_at_exit() {
    // Never block or unwind at exit: skip if another thread holds the registry.
    let Ok(registry) = REGISTRY.try_lock() else {
        return;
    };
    let live: Vec<Arc<Inner>> = registry.iter().filter_map(Weak::upgrade).collect();
    drop(registry);
    for inner in &live {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exit_dump(inner)));
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
                    let live: Vec<Arc<Inner>> = {
                        let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
                        registry.iter().filter_map(Weak::upgrade).collect()
                    };
                    for inner in &live {
                        auto_dump(inner, "signal", inner.config.dump_on_signal);
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

/// This machine's name.
pub(crate) fn host_name() -> String {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is writable for its length.
        let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if ok {
            String::from_utf8_lossy(&buf[..end]).into_owned()
        } else {
            "unknown".to_owned()
        }
    })
    .clone()
}

/// Identifies this run of this process: snapshots with the same run id can
/// match blocks by allocation sequence number.
pub(crate) fn run_id() -> &'static str {
    static RUN: OnceLock<String> = OnceLock::new();
    RUN.get_or_init(|| {
        format!(
            "{}-{}-{}",
            host_name(),
            std::process::id(),
            crate::trace::now_us()
        )
    })
}
