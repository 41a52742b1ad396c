//! How an [`Allocator`](crate::Allocator) records and dumps, and the
//! environment variables through which `snapdiff capture` sets it.

use std::path::PathBuf;
use std::time::Duration;

use crate::stacks::StackCapture;

/// Output folder for automatic dumps. Setting it turns dumps on: every
/// [`ENV_EVERY_STEPS`] steps, every [`ENV_INTERVAL`], on out-of-memory, on
/// `SIGUSR1` and at exit.
pub const ENV_DIR: &str = "SNAPDIFF_DIR";
/// Dump every N steps (counted by [`Allocator::mark_step`](crate::Allocator::mark_step)).
pub const ENV_EVERY_STEPS: &str = "SNAPDIFF_EVERY_STEPS";
/// Dump every interval: `30s`, `500ms`, `2m`, or a number of seconds.
pub const ENV_INTERVAL: &str = "SNAPDIFF_INTERVAL";
/// Entries of the trace ring buffer; `0` records no trace.
pub const ENV_TRACE_ENTRIES: &str = "SNAPDIFF_TRACE_ENTRIES";
/// `0` to record no stacks, `1` to record them.
pub const ENV_STACKS: &str = "SNAPDIFF_STACKS";
/// A file through which `snapdiff capture` asks for dumps: it appends a byte
/// for each `SIGUSR1` it gets, instead of passing the signal on (which
/// would kill a process that has not installed a handler yet). A process
/// that takes a request appends a byte to the file's name plus `.served`.
pub const ENV_REQUESTS: &str = "SNAPDIFF_REQUESTS";

/// Settings of an [`Allocator`](crate::Allocator).
///
/// ```
/// use snapdiff_runtime::AllocatorConfig;
/// let quiet = AllocatorConfig { record_stacks: false, trace_entries: 0, ..Default::default() };
/// assert!(quiet.dump_dir.is_none());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Record the stack of every allocation. Default: on.
    pub record_stacks: bool,
    /// How stacks are captured. Default: frame pointers when the program
    /// is built with them (`-C force-frame-pointers=yes`), else the
    /// call-frame tables ([`StackCapture::Cfi`]), which any build has.
    pub stack_capture: StackCapture,
    /// Capacity of the trace ring buffer (oldest events are dropped first);
    /// 0 records no trace. Default: 100,000 events.
    pub trace_entries: usize,
    /// Folder for automatic dumps; `None` writes none. Default: none.
    pub dump_dir: Option<PathBuf>,
    /// With `dump_dir`: dump every this many steps. Default: never.
    pub dump_every_steps: Option<u64>,
    /// With `dump_dir`: dump every this long. Default: never.
    pub dump_interval: Option<Duration>,
    /// With `dump_dir`: dump before an out-of-memory error returns. Default: on.
    pub dump_on_oom: bool,
    /// With `dump_dir`: dump when the process exits while the allocator is
    /// alive (`std::process::exit`, or returning from `main` with the
    /// allocator in a static). An allocator dropped before exit holds
    /// nothing to dump. Default: on.
    pub dump_on_exit: bool,
    /// With `dump_dir`: dump on `SIGUSR1` (Unix). Default: on.
    pub dump_on_signal: bool,
    /// A label stored in every snapshot's metadata.
    pub label: Option<String>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            record_stacks: true,
            stack_capture: StackCapture::FramePointers,
            trace_entries: 100_000,
            dump_dir: None,
            dump_every_steps: None,
            dump_interval: None,
            dump_on_oom: true,
            dump_on_exit: true,
            dump_on_signal: true,
            label: None,
        }
    }
}

impl AllocatorConfig {
    /// The defaults, with whatever the `SNAPDIFF_*` environment variables
    /// (set by `snapdiff capture`) say on top.
    pub fn from_env() -> AllocatorConfig {
        AllocatorConfig::default().with_env()
    }

    /// This configuration with the `SNAPDIFF_*` environment variables applied
    /// on top. Unparsable values are reported on stderr and ignored.
    pub fn with_env(mut self) -> AllocatorConfig {
        fn var(name: &str) -> Option<String> {
            std::env::var(name).ok().filter(|v| !v.trim().is_empty())
        }
        fn warn(name: &str, value: &str, expected: &str) {
            eprintln!("snapdiff-runtime: ignoring {name}={value:?}: expected {expected}");
        }
        if let Some(dir) = var(ENV_DIR) {
            self.dump_dir = Some(PathBuf::from(dir));
        }
        if let Some(v) = var(ENV_EVERY_STEPS) {
            match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => self.dump_every_steps = Some(n),
                _ => warn(ENV_EVERY_STEPS, &v, "a positive number of steps"),
            }
        }
        if let Some(v) = var(ENV_INTERVAL) {
            match parse_interval(&v) {
                Some(d) => self.dump_interval = Some(d),
                None => warn(ENV_INTERVAL, &v, "a duration such as 30s, 500ms or 2m"),
            }
        }
        if let Some(v) = var(ENV_TRACE_ENTRIES) {
            match v.trim().parse::<usize>() {
                Ok(n) => self.trace_entries = n,
                _ => warn(ENV_TRACE_ENTRIES, &v, "a number of events"),
            }
        }
        if let Some(v) = var(ENV_STACKS) {
            match v.trim() {
                "0" | "false" | "off" => self.record_stacks = false,
                "1" | "true" | "on" => self.record_stacks = true,
                _ => warn(ENV_STACKS, &v, "0 or 1"),
            }
        }
        self
    }
}

/// Parses `30s`, `500ms`, `2m`, `1h` or a plain number of seconds.
pub fn parse_interval(text: &str) -> Option<Duration> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return (secs > 0.0 && secs.is_finite()).then(|| Duration::from_secs_f64(secs));
    }
    humantime::parse_duration(t).ok().filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_intervals() {
        assert_eq!(parse_interval("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_interval("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_interval("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_interval("0"), None);
        assert_eq!(parse_interval("soon"), None);
    }
}
