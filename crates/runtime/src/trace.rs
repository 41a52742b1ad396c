//! The trace: a bounded ring buffer of allocator events.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use snapdiff_format::Action;

use crate::stacks::RawStackId;

/// What an event records; [`RawAction::Free`] stands for PyTorch's
/// `free_requested` and `free_completed` pair (this allocator completes
/// frees at once), stored once to halve the cost of tracing frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawAction {
    Alloc,
    Free,
    SegmentAlloc,
    SegmentFree,
    Oom,
    Step,
    Snapshot,
}

impl RawAction {
    /// The snapshot actions this event becomes.
    pub(crate) fn actions(self) -> &'static [Action] {
        match self {
            RawAction::Alloc => &[Action::Alloc],
            RawAction::Free => &[Action::FreeRequested, Action::FreeCompleted],
            RawAction::SegmentAlloc => &[Action::SegmentAlloc],
            RawAction::SegmentFree => &[Action::SegmentFree],
            RawAction::Oom => &[Action::Oom],
            RawAction::Step => &[Action::Step],
            RawAction::Snapshot => &[Action::Snapshot],
        }
    }
}

/// One event as the runtime records it (stacks not yet symbolized), packed
/// into 48 bytes: tracing runs on every allocation and free.
#[derive(Clone, Debug)]
pub(crate) struct RawEvent {
    pub(crate) action: RawAction,
    /// The stack, or [`NO_STACK`].
    stack: RawStackId,
    /// The block or segment address; for [`RawAction::Oom`], the device's free bytes.
    pub(crate) address: u64,
    pub(crate) size: u64,
    pub(crate) stream: u64,
    pub(crate) time_us: i64,
    /// The allocation sequence number, or 0.
    seq: u64,
}

const NO_STACK: RawStackId = RawStackId::MAX;

impl RawEvent {
    pub(crate) fn new(
        action: RawAction,
        address: u64,
        size: u64,
        stream: u64,
        time_us: i64,
        stack: Option<RawStackId>,
        seq: Option<u64>,
    ) -> RawEvent {
        RawEvent {
            action,
            stack: stack.unwrap_or(NO_STACK),
            address,
            size,
            stream,
            time_us,
            seq: seq.unwrap_or(0),
        }
    }

    pub(crate) fn stack(&self) -> Option<RawStackId> {
        (self.stack != NO_STACK).then_some(self.stack)
    }

    pub(crate) fn seq(&self) -> Option<u64> {
        (self.seq != 0).then_some(self.seq)
    }

    /// The event's address, and for an `oom` event the device's free bytes instead.
    pub(crate) fn address_and_device_free(&self) -> (u64, Option<u64>) {
        match self.action {
            RawAction::Oom => (0, Some(self.address)),
            _ => (self.address, None),
        }
    }
}

/// The most recent events, oldest dropped first once full.
pub(crate) struct TraceRing {
    events: VecDeque<RawEvent>,
    capacity: usize,
}

impl TraceRing {
    pub(crate) fn new(capacity: usize) -> TraceRing {
        TraceRing {
            events: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    pub(crate) fn push(&mut self, event: RawEvent) {
        if self.capacity == 0 {
            return;
        }
        if self.events.len() == self.capacity {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    pub(crate) fn events(&self) -> impl Iterator<Item = &RawEvent> {
        self.events.iter()
    }
}

/// Microseconds since the Unix epoch, from a monotonic clock: the wall clock
/// is read once, and later times add the monotonic time elapsed since.
///
/// On Linux the monotonic clock is the coarse one, which the kernel updates
/// every tick (1 to 4 ms): reading it costs a few nanoseconds where the
/// precise clock costs about 20, twice per allocation and free with the
/// trace on. Trace times serve rates over seconds and timelines over steps,
/// for which milliseconds are plenty; the order of events is the ring's.
pub(crate) fn now_us() -> i64 {
    static BASE: OnceLock<i64> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        wall - monotonic_us()
    });
    base + monotonic_us()
}

#[cfg(target_os = "linux")]
fn monotonic_us() -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the time into `now`; this clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    now.tv_sec * 1_000_000 + now.tv_nsec / 1000
}

#[cfg(not(target_os = "linux"))]
fn monotonic_us() -> i64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as i64
}
