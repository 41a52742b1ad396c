//! The allocator's books behind one lock, and the copy of them a snapshot
//! is built from (`snapshot.rs`).
//!
//! A [`Recorder`] holds the backend, the caching allocator's segments and
//! blocks, the interned stacks, the trace ring and the statistics, all
//! behind one mutex so that a snapshot is consistent at one moment while
//! other threads allocate. `Allocator` (`allocator.rs`) is the public handle
//! over it, and `dumps.rs` writes its snapshots when a configuration asks.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use crate::backend::{Backend, BackendError, DeviceDesc, Stream};
use crate::caching::{self, BlockIdx, Caching};
use crate::config::AllocatorConfig;
use crate::stacks::{self, RawStackId, StackTable, Symbolizer};
use crate::trace::{RawAction, RawEvent, TraceRing, now_us};

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The device is full even after the allocator released its cache.
    #[error(
        "out of memory on device {device}: tried to allocate {requested} bytes \
         ({reserved} reserved by the allocator, {allocated} allocated, {device_free} free on the device)"
    )]
    OutOfMemory {
        /// Device ordinal.
        device: u32,
        /// Bytes asked for.
        requested: u64,
        /// Bytes the allocator held in segments.
        reserved: u64,
        /// Bytes handed out to the program.
        allocated: u64,
        /// Bytes the device had left.
        device_free: u64,
    },
    /// The device reported another error.
    #[error("device {device}: {message}")]
    Device {
        /// Device ordinal.
        device: u32,
        /// What it said.
        message: String,
    },
}

/// Allocator statistics, with PyTorch's meanings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Bytes of allocated blocks (rounded sizes, with any unsplit slack).
    pub allocated_bytes: u64,
    /// Bytes of active blocks; equal to `allocated_bytes` here, since blocks
    /// are reusable as soon as they are freed.
    pub active_bytes: u64,
    /// Bytes the program asked for, over allocated blocks.
    pub requested_bytes: u64,
    /// Bytes held in segments.
    pub reserved_bytes: u64,
    /// The most `allocated_bytes` has been.
    pub peak_allocated_bytes: u64,
    /// The most `reserved_bytes` has been.
    pub peak_reserved_bytes: u64,
    /// Allocated blocks.
    pub blocks: u64,
    /// Segments held.
    pub segments: u64,
    /// Allocations served, in all.
    pub allocations: u64,
    /// Frees, in all.
    pub frees: u64,
    /// Times the cache was released to retry a failed segment allocation.
    pub alloc_retries: u64,
    /// Allocations that failed for lack of memory.
    pub ooms: u64,
}

thread_local! {
    /// Return addresses of the stack being captured (reused to avoid allocating).
    static SCRATCH: RefCell<Vec<usize>> = RefCell::new(Vec::with_capacity(stacks::MAX_FRAMES));
}

/// Allocators created so far: the high bits of each one's allocation
/// sequence numbers, so that they are unique within the process.
static NEXT_ALLOCATOR: AtomicU64 = AtomicU64::new(1);

/// Allocation sequence numbers: 24 bits of allocator, 40 of count.
const SEQ_ALLOCATOR_SHIFT: u32 = 40;

/// Everything behind the allocator's lock.
struct State {
    caching: Caching,
    stacks: StackTable,
    trace: TraceRing,
    stats: Stats,
    step: Option<u64>,
    /// The last allocation sequence number handed out.
    next_seq: u64,
}

/// The allocator's books and what they are kept for.
pub(crate) struct Recorder {
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) config: AllocatorConfig,
    pub(crate) device: DeviceDesc,
    state: Mutex<State>,
    symbolizer: Mutex<Symbolizer>,
    /// Sequence number of the next automatic dump.
    pub(crate) dump_seq: AtomicU64,
    /// Whether the exit dump was written.
    pub(crate) exit_dumped: AtomicBool,
}

/// A block copied out of the allocator for a snapshot.
pub(crate) struct BlockCopy {
    pub(crate) address: u64,
    pub(crate) size: u64,
    pub(crate) requested: u64,
    pub(crate) allocated: bool,
    pub(crate) stack: Option<RawStackId>,
    pub(crate) seq: u64,
}

impl Recorder {
    /// Books for a new allocator over `backend`, with `config`.
    pub(crate) fn new(backend: Box<dyn Backend>, config: AllocatorConfig) -> Recorder {
        let device = backend.device();
        let state = State {
            caching: Caching::default(),
            stacks: StackTable::default(),
            trace: TraceRing::new(config.trace_entries),
            stats: Stats::default(),
            step: None,
            next_seq: NEXT_ALLOCATOR.fetch_add(1, Ordering::Relaxed) << SEQ_ALLOCATOR_SHIFT,
        };
        Recorder {
            backend,
            config,
            device,
            state: Mutex::new(state),
            symbolizer: Mutex::new(Symbolizer::default()),
            dump_seq: AtomicU64::new(0),
            exit_dumped: AtomicBool::new(false),
        }
    }

    /// Allocates `size` bytes for `stream`: the block and its address.
    #[inline]
    pub(crate) fn alloc(&self, size: usize, stream: Stream) -> Result<(BlockIdx, u64), AllocError> {
        let requested = size as u64;
        let config = &self.config;
        let (mut state, stack) = if config.record_stacks {
            // Capture before taking the lock; only interning needs it.
            let mut ips = SCRATCH.with_borrow_mut(std::mem::take);
            stacks::capture(config.stack_capture, &mut ips);
            let mut state = self.state();
            let stack = state.stacks.intern(&ips);
            SCRATCH.set(ips);
            (state, Some(stack))
        } else {
            (self.state(), None)
        };
        let rounded = caching::round_size(requested);
        let pool = caching::pool_of(rounded);
        let tracing = state.trace.enabled();
        let time_us = if tracing { now_us() } else { 0 };
        let idx = match state.caching.find_free(pool, stream, rounded) {
            Some(idx) => idx,
            None => self.new_segment(&mut state, rounded, stream, stack, time_us)?,
        };
        state.next_seq += 1;
        let seq = state.next_seq;
        state.caching.allocate(idx, rounded, requested, stack, seq);
        let (address, size) = {
            let b = state.caching.block(idx);
            (b.address, b.size)
        };
        let s = &mut state.stats;
        s.allocated_bytes += size;
        s.active_bytes += size;
        s.requested_bytes += requested;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        s.blocks += 1;
        s.allocations += 1;
        if tracing {
            state.trace.push(RawEvent::new(
                RawAction::Alloc,
                address,
                requested,
                stream.0,
                time_us,
                stack,
                Some(seq),
            ));
        }
        Ok((idx, address))
    }

    /// Obtains a segment for a rounded request, releasing the cache and
    /// retrying once if the device is full.
    fn new_segment(
        &self,
        state: &mut State,
        rounded: u64,
        stream: Stream,
        stack: Option<RawStackId>,
        time_us: i64,
    ) -> Result<BlockIdx, AllocError> {
        let size = caching::segment_size(rounded);
        let pool = caching::pool_of(rounded);
        let backend = &self.backend;
        let mut result = backend.allocate(size, stream);
        if result == Err(BackendError::OutOfMemory) {
            state.stats.alloc_retries += 1;
            self.release_cache(state, time_us);
            result = backend.allocate(size, stream);
        }
        let device = self.device.ordinal;
        match result {
            Ok(address) => {
                state.stats.reserved_bytes += size;
                state.stats.peak_reserved_bytes = state
                    .stats
                    .peak_reserved_bytes
                    .max(state.stats.reserved_bytes);
                state.stats.segments += 1;
                state.trace.push(RawEvent::new(
                    RawAction::SegmentAlloc,
                    address,
                    size,
                    stream.0,
                    time_us,
                    stack,
                    None,
                ));
                Ok(state
                    .caching
                    .add_segment(address, size, stream, pool, stack))
            }
            Err(BackendError::OutOfMemory) => {
                state.stats.ooms += 1;
                let device_free = backend.memory_info().free;
                state.trace.push(RawEvent::new(
                    RawAction::Oom,
                    device_free,
                    rounded,
                    stream.0,
                    time_us,
                    stack,
                    None,
                ));
                Err(AllocError::OutOfMemory {
                    device,
                    requested: rounded,
                    reserved: state.stats.reserved_bytes,
                    allocated: state.stats.allocated_bytes,
                    device_free,
                })
            }
            Err(BackendError::Device(message)) => Err(AllocError::Device { device, message }),
        }
    }

    /// Returns every cached segment that holds no allocation to the device.
    pub(crate) fn empty_cache(&self) {
        let mut state = self.state();
        let now = if state.trace.enabled() { now_us() } else { 0 };
        self.release_cache(&mut state, now);
    }

    /// The current statistics.
    pub(crate) fn stats(&self) -> Stats {
        self.state().stats
    }

    /// Records the start of step `step`, in the trace and for later snapshots.
    pub(crate) fn mark_step(&self, step: u64) {
        let mut state = self.state();
        state.step = Some(step);
        let time_us = now_us();
        state.trace.push(RawEvent::new(
            RawAction::Step,
            0,
            step,
            0,
            time_us,
            None,
            None,
        ));
    }

    /// The step last marked, if any.
    pub(crate) fn step(&self) -> Option<u64> {
        self.state().step
    }

    pub(crate) fn device_ordinal(&self) -> u32 {
        self.device.ordinal
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the books half-written
        // in a way later calls would trip over, so recover from poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release_cache(&self, state: &mut State, time_us: i64) {
        for (address, size, stream) in state.caching.release_free_segments(None) {
            self.backend.free(address, size, stream);
            state.stats.reserved_bytes -= size;
            state.stats.segments -= 1;
            state.trace.push(RawEvent::new(
                RawAction::SegmentFree,
                address,
                size,
                stream.0,
                time_us,
                None,
                None,
            ));
        }
    }

    #[inline]
    pub(crate) fn free(&self, block: BlockIdx, stream: Stream) {
        let mut state = self.state();
        let (address, size, requested, stack, seq) = {
            let b = state.caching.block(block);
            (b.address, b.size, b.requested, b.stack, b.seq)
        };
        state.caching.free(block);
        let s = &mut state.stats;
        s.allocated_bytes -= size;
        s.active_bytes -= size;
        s.requested_bytes -= requested;
        s.blocks -= 1;
        s.frees += 1;
        if state.trace.enabled() {
            let time_us = now_us();
            // Like PyTorch with `context="alloc"`, frees carry the allocation's stack.
            state.trace.push(RawEvent::new(
                RawAction::Free,
                address,
                requested,
                stream.0,
                time_us,
                stack,
                Some(seq),
            ));
        }
    }

    /// The symbolizer, shared by the snapshots taken (its cache of
    /// symbolized addresses outlives each).
    pub(crate) fn symbolizer(&self) -> std::sync::MutexGuard<'_, Symbolizer> {
        self.symbolizer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The books as a snapshot needs them, copied under the lock, with a
    /// `snapshot` marker added to the trace as PyTorch adds one.
    pub(crate) fn copy_books(&self) -> BooksCopy {
        let mut state = self.state();
        let mut segments = Vec::with_capacity(state.caching.segments.len());
        for (&address, seg) in &state.caching.segments {
            let blocks: Vec<BlockCopy> = state
                .caching
                .segment_blocks(seg)
                .map(|b| BlockCopy {
                    address: b.address,
                    size: b.size,
                    requested: b.requested,
                    allocated: b.allocated,
                    stack: b.stack,
                    seq: b.seq,
                })
                .collect();
            segments.push((address, seg.clone(), blocks));
        }
        let events: Vec<RawEvent> = state.trace.events().cloned().collect();
        let mut used: Vec<RawStackId> = segments
            .iter()
            .flat_map(|(_, s, blocks)| {
                s.stack
                    .into_iter()
                    .chain(blocks.iter().filter_map(|b| b.stack))
            })
            .chain(events.iter().filter_map(RawEvent::stack))
            .collect();
        used.sort_unstable();
        used.dedup();
        let raw_stacks: FxHashMap<RawStackId, Vec<usize>> = used
            .into_iter()
            .map(|id| (id, state.stacks.get(id).to_vec()))
            .collect();
        let stats = state.stats;
        let step = state.step;
        // Mark where this snapshot was taken, as PyTorch does, for later snapshots' traces.
        if state.trace.enabled() {
            state.trace.push(RawEvent::new(
                RawAction::Snapshot,
                0,
                stats.active_bytes,
                0,
                now_us(),
                None,
                None,
            ));
        }
        BooksCopy {
            segments,
            events,
            raw_stacks,
            stats,
            step,
        }
    }
}

/// The books as a snapshot needs them, copied out from under the lock.
pub(crate) struct BooksCopy {
    /// Each segment by address, with its blocks.
    pub(crate) segments: Vec<(u64, caching::Segment, Vec<BlockCopy>)>,
    /// The trace ring's events, oldest first.
    pub(crate) events: Vec<RawEvent>,
    /// The return addresses of every stack the segments, blocks and events use.
    pub(crate) raw_stacks: FxHashMap<RawStackId, Vec<usize>>,
    pub(crate) stats: Stats,
    /// The step last marked.
    pub(crate) step: Option<u64>,
}
