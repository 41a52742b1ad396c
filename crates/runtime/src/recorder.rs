//! The allocator's books behind one lock, and the snapshot copied out of
//! them.
//!
//! A [`Recorder`] holds the backend, the caching allocator's segments and
//! blocks, the interned stacks, the trace ring and the statistics, all
//! behind one mutex so that a snapshot is consistent at one moment while
//! other threads allocate. `Allocator` (`allocator.rs`) is the public handle
//! over it, and `dumps.rs` writes its snapshots when a configuration asks.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use rustc_hash::FxHashMap;
use snapdiff_format::{
    Block, BlockState, DeviceInfo, DeviceTrace, Frame, Meta, Segment, Snapshot, StackId, TraceEvent,
};

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
struct BlockCopy {
    address: u64,
    size: u64,
    requested: u64,
    allocated: bool,
    stack: Option<RawStackId>,
    seq: u64,
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

    pub(crate) fn snapshot(&self) -> Snapshot {
        // Copy under the lock; symbolize after releasing it.
        let (segments, events, raw_stacks, stats, step) = {
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
            (segments, events, raw_stacks, stats, step)
        };

        let mut builder = SnapshotBuilder::default();
        {
            let mut symbolizer = self.symbolizer.lock().unwrap_or_else(|e| e.into_inner());
            let mut ids: Vec<&RawStackId> = raw_stacks.keys().collect();
            ids.sort_unstable();
            for &id in ids {
                builder.add_stack(id, &raw_stacks[&id], &mut symbolizer);
            }
        }
        let device = self.device.ordinal;
        let mut snap = Snapshot {
            meta: Meta {
                producer: Meta::PRODUCER_RUNTIME.to_owned(),
                source: None,
                created_us: Some(now_us()),
                pid: Some(std::process::id()),
                host: Some(host_name()),
                run_id: Some(run_id().to_owned()),
                label: self.config.label.clone(),
                step,
                devices: vec![DeviceInfo {
                    ordinal: device,
                    name: self.device.name.clone(),
                    total_memory: Some(self.backend.memory_info().total),
                }],
                extra: vec![],
            },
            ..Snapshot::default()
        };
        for (address, seg, blocks) in segments {
            let blocks: Vec<Block> = blocks
                .into_iter()
                .map(|b| Block {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested,
                    state: if b.allocated {
                        BlockState::ActiveAllocated
                    } else {
                        BlockState::Inactive
                    },
                    stack: b.stack.and_then(|s| builder.stack(s)),
                    alloc_seq: b.allocated.then_some(b.seq),
                    history: vec![],
                    extra: vec![],
                })
                .collect();
            let allocated: u64 = blocks
                .iter()
                .filter(|b| b.state.is_active())
                .map(|b| b.size)
                .sum();
            let requested: u64 = blocks
                .iter()
                .filter(|b| b.state.is_active())
                .map(|b| b.requested_size)
                .sum();
            snap.segments.push(Segment {
                device,
                address,
                total_size: seg.size,
                stream: seg.stream.0 as i64,
                pool: seg.pool,
                pool_id: (0, 0),
                is_expandable: false,
                stack: seg.stack.and_then(|s| builder.stack(s)),
                blocks,
                allocated_size: Some(allocated),
                active_size: Some(allocated),
                requested_size: Some(requested),
                extra: vec![],
            });
        }
        debug_assert_eq!(snap.totals().allocated_bytes, stats.allocated_bytes);
        if !events.is_empty() || self.config.trace_entries > 0 {
            let events = events
                .iter()
                .flat_map(|e| e.action.actions().iter().map(move |a| (a, e)))
                .map(|(action, e)| {
                    let (address, device_free) = e.address_and_device_free();
                    TraceEvent {
                        action: action.clone(),
                        address,
                        size: e.size,
                        stream: e.stream as i64,
                        time_us: Some(e.time_us),
                        stack: e.stack().and_then(|s| builder.stack(s)),
                        compile_context: None,
                        user_metadata: None,
                        alloc_seq: e.seq(),
                        details: device_free.map(|f| {
                            Box::new(snapdiff_format::EventDetails {
                                device_free: Some(f),
                                ..Default::default()
                            })
                        }),
                    }
                })
                .collect();
            snap.traces.push(DeviceTrace { device, events });
        }
        (snap.frames, snap.stacks) = builder.finish();
        snap.sort_frames();
        snap
    }
}

/// Turns interned return-address stacks into the snapshot's frame and stack tables.
#[derive(Default)]
struct SnapshotBuilder {
    frames: Vec<Frame>,
    frame_ids: FxHashMap<Frame, u32>,
    stacks: Vec<Vec<u32>>,
    stack_ids: FxHashMap<Vec<u32>, StackId>,
    by_raw: FxHashMap<RawStackId, Option<StackId>>,
}

impl SnapshotBuilder {
    fn add_stack(&mut self, raw: RawStackId, ips: &[usize], symbolizer: &mut Symbolizer) {
        let mut ids = Vec::with_capacity(ips.len());
        for &ip in ips {
            for frame in symbolizer.frames(ip) {
                let id = match self.frame_ids.get(frame) {
                    Some(&id) => id,
                    None => {
                        let id = self.frames.len() as u32;
                        self.frames.push(frame.clone());
                        self.frame_ids.insert(frame.clone(), id);
                        id
                    }
                };
                ids.push(id);
            }
        }
        let stack = if ids.is_empty() {
            None
        } else {
            let next = self.stacks.len() as StackId;
            let id = *self.stack_ids.entry(ids.clone()).or_insert(next);
            if id == next {
                self.stacks.push(ids);
            }
            Some(id)
        };
        self.by_raw.insert(raw, stack);
    }

    fn stack(&self, raw: RawStackId) -> Option<StackId> {
        self.by_raw.get(&raw).copied().flatten()
    }

    fn finish(self) -> (Vec<Frame>, Vec<Vec<u32>>) {
        (self.frames, self.stacks)
    }
}

/// This machine's name.
fn host_name() -> String {
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
fn run_id() -> &'static str {
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
