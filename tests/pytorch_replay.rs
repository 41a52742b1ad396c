//! Replaying a real PyTorch trace through the runtime's caching allocator.
//!
//! PyTorch's trace records every `alloc` (address, requested size, stream),
//! every free and every `cudaMalloc` (`segment_alloc`). Fed the same requests
//! in the same order, an allocator with PyTorch's rules must hand out the same
//! addresses and ask for the same segments. [`Replay`] does that with the
//! public [`Allocator`] over [`ReplayBackend`], a backend that returns the
//! address PyTorch's `cudaMalloc` returned when the allocator asks for the
//! segment PyTorch obtained at that point, so that best-fit ties (broken by
//! address) fall the same way.
//!
//! A trace starts mid-run: segments and blocks made before recording began
//! are in the file's final segments and in frees of blocks the trace never
//! saw allocated. [`start_state`] works that state out and [`Replay::new`]
//! builds it in the allocator before the trace is replayed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use snapdiff_format::{Action, BlockState, Pool, Snapshot, StackId, TraceEvent};
use snapdiff_runtime::{
    AllocError, Allocator, AllocatorConfig, Backend, BackendError, DeviceBuffer, DeviceDesc,
    MemoryInfo, Stream,
};

/// PyTorch's large-pool split threshold: a large block keeps up to this much
/// slack unsplit (`kSmallSize`).
const SMALL_SIZE: u64 = 1 << 20;

/// A segment that existed when recording began, with its allocated blocks.
#[derive(Clone, Debug)]
pub struct StartSegment {
    pub address: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: Pool,
    /// Allocated blocks as (address, size), in address order.
    pub live: Vec<(u64, u64)>,
}

/// Why a trace cannot be replayed at all.
#[derive(Debug)]
pub enum NotReplayable {
    /// Expandable segments map pages into one growing range; the runtime
    /// allocates whole segments.
    ExpandableSegments,
}

/// The segments and allocated blocks of `device` at the first event of its trace.
///
/// Segments: the final ones, less those the trace allocated, plus those it
/// freed (walking the trace backwards). Allocated blocks: those freed before
/// the trace allocated their address, and final blocks whose address the
/// trace never allocated. The size of a block freed in the trace is its
/// rounded request, plus, in the large pool, the gap up to the next
/// allocated block when that gap is at most 1 MiB: every large-pool block is
/// larger than 1 MiB (allocations are, and a split leaves more than 1 MiB),
/// so such a gap can only be slack PyTorch left unsplit.
pub fn start_state(snap: &Snapshot, device: u32) -> Result<Vec<StartSegment>, NotReplayable> {
    let events = trace_of(snap, device);
    let final_segments: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .collect();
    if final_segments.iter().any(|s| s.is_expandable)
        || events
            .iter()
            .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
    {
        return Err(NotReplayable::ExpandableSegments);
    }
    // address -> (size, stream, pool)
    let mut segments: BTreeMap<u64, (u64, u64, Pool)> = final_segments
        .iter()
        .map(|s| (s.address, (s.total_size, s.stream as u64, s.pool)))
        .collect();
    for e in events.iter().rev() {
        match e.action {
            Action::SegmentAlloc => {
                segments.remove(&e.address);
            }
            Action::SegmentFree => {
                let pool = if e.size == 2 << 20 {
                    Pool::Small
                } else {
                    Pool::Large
                };
                segments.insert(e.address, (e.size, e.stream as u64, pool));
            }
            _ => {}
        }
    }

    // Blocks allocated at the start: address -> (size if known, requested).
    let mut allocated_in_trace = HashSet::new();
    let mut live: BTreeMap<u64, Option<u64>> = BTreeMap::new();
    let mut requested_of: HashMap<u64, u64> = HashMap::new();
    for e in events {
        match e.action {
            Action::Alloc => {
                allocated_in_trace.insert(e.address);
            }
            Action::FreeRequested | Action::FreeCompleted
                if !allocated_in_trace.contains(&e.address) =>
            {
                live.entry(e.address).or_insert(None);
                requested_of.insert(e.address, e.size);
            }
            _ => {}
        }
    }
    for seg in &final_segments {
        for b in &seg.blocks {
            if b.state != BlockState::Inactive && !allocated_in_trace.contains(&b.address) {
                live.insert(b.address, Some(b.size));
            }
        }
    }

    let mut out = Vec::new();
    for (&address, &(size, stream, pool)) in &segments {
        let end = address + size;
        let starts: Vec<(u64, Option<u64>)> =
            live.range(address..end).map(|(&a, &s)| (a, s)).collect();
        let mut blocks = Vec::with_capacity(starts.len());
        for (i, &(a, known)) in starts.iter().enumerate() {
            let next = starts.get(i + 1).map_or(end, |&(n, _)| n);
            let size = known.unwrap_or_else(|| {
                let rounded = requested_of[&a].max(1).div_ceil(512) * 512;
                if pool == Pool::Large && next - a - rounded <= SMALL_SIZE {
                    next - a
                } else {
                    rounded
                }
            });
            blocks.push((a, size));
        }
        out.push(StartSegment {
            address,
            size,
            stream,
            pool,
            live: blocks,
        });
    }
    Ok(out)
}

/// The events of `device`'s trace (none if it has no trace).
pub fn trace_of(snap: &Snapshot, device: u32) -> Vec<TraceEvent> {
    snap.traces
        .iter()
        .find(|t| t.device == device)
        .map_or_else(Vec::new, |t| t.events.iter().collect())
}

/// What the backend was asked, and what it did.
#[derive(Default)]
struct BackendLog {
    /// The segment PyTorch obtained next: (address, size).
    expected: Option<(u64, u64)>,
    /// Segments asked for that PyTorch did not obtain: (size, stream).
    unexpected: Vec<(u64, u64)>,
    /// Segments freed, by address.
    freed: Vec<u64>,
    /// Where the next unexpected segment goes (far above any real address).
    next_free_address: u64,
    /// Bytes held in segments, and the most the device can hold.
    reserved: u64,
    capacity: u64,
    /// Addresses of the segments held now: a job that diverges from the
    /// trace (a leak pins a segment PyTorch freed) must not be handed a
    /// held address again when the trace reuses it.
    held: HashSet<u64>,
}

/// A backend that hands out the addresses PyTorch's `cudaMalloc` returned.
///
/// Before each request the replay tells it which segment PyTorch obtained
/// then, if any; a segment of that size gets that address. Any other
/// request is logged and served from an address range no real GPU uses.
#[derive(Clone)]
pub struct ReplayBackend {
    log: Arc<Mutex<BackendLog>>,
    ordinal: u32,
}

impl ReplayBackend {
    fn new(ordinal: u32) -> ReplayBackend {
        ReplayBackend {
            log: Arc::new(Mutex::new(BackendLog {
                next_free_address: 1 << 60,
                capacity: u64::MAX / 2,
                ..Default::default()
            })),
            ordinal,
        }
    }

    fn expect(&self, segment: Option<(u64, u64)>) {
        self.log.lock().unwrap().expected = segment;
    }
}

impl Backend for ReplayBackend {
    fn allocate(&self, size: u64, stream: Stream) -> Result<u64, BackendError> {
        let mut log = self.log.lock().unwrap();
        if log.reserved + size > log.capacity {
            return Err(BackendError::OutOfMemory);
        }
        log.reserved += size;
        let address = match log.expected {
            Some((address, expected)) if expected == size && !log.held.contains(&address) => {
                log.expected = None;
                address
            }
            _ => {
                log.unexpected.push((size, stream.0));
                let address = log.next_free_address;
                log.next_free_address += size.div_ceil(1 << 21) * (1 << 21);
                address
            }
        };
        log.held.insert(address);
        Ok(address)
    }

    fn free(&self, address: u64, size: u64, _stream: Stream) {
        let mut log = self.log.lock().unwrap();
        log.freed.push(address);
        log.held.remove(&address);
        log.reserved -= size;
    }

    fn memory_info(&self) -> MemoryInfo {
        let log = self.log.lock().unwrap();
        MemoryInfo {
            free: log.capacity - log.reserved,
            total: log.capacity,
        }
    }

    fn device(&self) -> DeviceDesc {
        DeviceDesc {
            ordinal: self.ordinal,
            name: "replay of a PyTorch trace".into(),
        }
    }

    fn host_pointer(&self, _address: u64) -> Option<*mut u8> {
        None
    }
}

/// The first event at which the runtime did not do what PyTorch did.
#[derive(Debug, PartialEq)]
pub struct Divergence {
    /// Index of the event in the device's trace.
    pub event: usize,
    pub what: String,
}

/// The runtime allocator in the state of a PyTorch trace's start, ready to
/// replay the trace.
pub struct Replay {
    pub allocator: Allocator,
    backend: ReplayBackend,
    /// Live buffers by the address PyTorch gave them.
    pub live: HashMap<u64, DeviceBuffer>,
}

impl Replay {
    /// An allocator holding `start`'s segments and allocated blocks, at
    /// PyTorch's addresses.
    pub fn new(ordinal: u32, start: &[StartSegment], config: AllocatorConfig) -> Replay {
        let backend = ReplayBackend::new(ordinal);
        let allocator = Allocator::with_config(backend.clone(), config);
        let mut replay = Replay {
            allocator,
            backend,
            live: HashMap::new(),
        };
        replay.build(start);
        replay
    }

    /// Builds the start state with ordinary requests: each segment is first
    /// filled whole (so that none of its space is free while the next is
    /// made, and every request needs a new segment), then emptied and carved
    /// front to back into its blocks and the free gaps between them (a
    /// request takes the front of the only free block), and finally the
    /// gaps are freed.
    fn build(&mut self, start: &[StartSegment]) {
        let mut fillers: Vec<Vec<DeviceBuffer>> = Vec::new();
        for seg in start {
            self.backend.expect(Some((seg.address, seg.size)));
            let stream = Stream(seg.stream);
            let whole = match seg.pool {
                // A 1 MiB request makes a 2 MiB segment; a second fills it.
                Pool::Small => vec![
                    self.alloc(SMALL_SIZE, stream),
                    self.alloc(SMALL_SIZE, stream),
                ],
                // A request of the segment's size (a multiple of 2 MiB, at
                // least 10 MiB, or exactly 20 MiB) gets a segment of that size.
                Pool::Large => vec![self.alloc(seg.size, stream)],
            };
            assert_eq!(
                whole[0].device_ptr(),
                seg.address,
                "segment {:#x}",
                seg.address
            );
            fillers.push(whole);
        }
        let mut gaps = Vec::new();
        for (seg, whole) in start.iter().zip(fillers) {
            drop(whole);
            let stream = Stream(seg.stream);
            let mut at = seg.address;
            let mut pieces = Vec::new();
            for &(address, size) in &seg.live {
                if address > at {
                    pieces.push((at, address - at, false));
                }
                pieces.push((address, size, true));
                at = address + size;
            }
            if at < seg.address + seg.size {
                pieces.push((at, seg.address + seg.size - at, false));
            }
            for (address, size, live) in pieces {
                // The small pool serves at most 1 MiB per request.
                let chunk = if seg.pool == Pool::Small {
                    SMALL_SIZE
                } else {
                    size
                };
                let mut offset = 0;
                while offset < size {
                    let n = chunk.min(size - offset);
                    let b = self.alloc(n, stream);
                    assert_eq!(
                        b.device_ptr(),
                        address + offset,
                        "carving {:#x}",
                        seg.address
                    );
                    if live {
                        self.live.insert(address, b);
                    } else {
                        gaps.push(b);
                    }
                    offset += n;
                }
            }
        }
        drop(gaps);
    }

    fn alloc(&self, size: u64, stream: Stream) -> DeviceBuffer {
        self.allocator
            .alloc(size as usize, stream)
            .expect("the replay backend never runs out")
    }

    /// Replays `events` (a device's trace), checking each allocation's
    /// address and each segment obtained or released against PyTorch's.
    /// Calls `after(index, event, replay)` after each event. Stops at the
    /// first divergence.
    pub fn run(
        &mut self,
        events: &[TraceEvent],
        mut after: impl FnMut(usize, &TraceEvent, &mut Replay),
    ) -> Result<(), Divergence> {
        // Blocks become reusable at `free_completed`; a trace recorded
        // without those events frees at `free_requested`.
        let free_at = if events.iter().any(|e| e.action == Action::FreeCompleted) {
            Action::FreeCompleted
        } else {
            Action::FreeRequested
        };
        let mut i = 0;
        while i < events.len() {
            let e = &events[i];
            let fail = |what: String| Err(Divergence { event: i, what });
            match &e.action {
                Action::SegmentAlloc => self.backend.expect(Some((e.address, e.size))),
                Action::Alloc => {
                    let b = self.alloc(e.size, Stream(e.stream as u64));
                    let mut log = self.backend.log.lock().unwrap();
                    if let Some((size, stream)) = log.unexpected.pop() {
                        return fail(format!(
                            "alloc of {} B: the runtime obtained a {size} B segment on stream {stream} where PyTorch {}",
                            e.size,
                            match log.expected {
                                Some((a, s)) => format!("obtained {s} B at {a:#x}"),
                                None => "reused a cached block".into(),
                            }
                        ));
                    }
                    if let Some((a, s)) = log.expected.take() {
                        return fail(format!(
                            "alloc of {} B: PyTorch obtained a {s} B segment at {a:#x}; the runtime reused a cached block at {:#x}",
                            e.size,
                            b.device_ptr()
                        ));
                    }
                    drop(log);
                    if b.device_ptr() != e.address {
                        return fail(format!(
                            "alloc of {} B: PyTorch gave {:#x}, the runtime {:#x}",
                            e.size,
                            e.address,
                            b.device_ptr()
                        ));
                    }
                    self.live.insert(e.address, b);
                }
                a if *a == free_at => {
                    let held = self.live.remove(&e.address);
                    if held.is_none() {
                        return fail(format!(
                            "free of {:#x}, which the runtime does not hold",
                            e.address
                        ));
                    }
                }
                Action::SegmentFree => {
                    // One release of the cache frees a run of segments.
                    let mut released = HashSet::new();
                    while i < events.len() && events[i].action == Action::SegmentFree {
                        released.insert(events[i].address);
                        after(i, &events[i], self);
                        i += 1;
                    }
                    self.allocator.empty_cache();
                    let freed: HashSet<u64> =
                        std::mem::take(&mut self.backend.log.lock().unwrap().freed)
                            .into_iter()
                            .collect();
                    if freed != released {
                        let mut extra: Vec<_> = freed.difference(&released).collect();
                        let mut missing: Vec<_> = released.difference(&freed).collect();
                        extra.sort();
                        missing.sort();
                        return Err(Divergence {
                            event: i - 1,
                            what: format!(
                                "release of the cache: PyTorch freed {} segments, the runtime {}; only PyTorch: {missing:x?}; only the runtime: {extra:x?}",
                                released.len(),
                                freed.len()
                            ),
                        });
                    }
                    continue;
                }
                _ => {}
            }
            after(i, e, self);
            i += 1;
        }
        Ok(())
    }
}

/// What a generated job does besides replaying its trace, once per iteration.
#[derive(Clone, Copy, Debug)]
pub enum Extra {
    /// Nothing: a steady job.
    Nothing,
    /// Keeps the block the trace allocates at event `alloc` instead of
    /// freeing it: one more real block at a real stack every iteration.
    KeepBlock { alloc: usize },
    /// One block at `stack` that is replaced by one `bytes` larger every
    /// iteration (a tensor grown by concatenation): same block count, more bytes.
    GrowOneBlock { stack: StackId, bytes: u64 },
    /// One block of `bytes` at `stack`, allocated in the first iteration
    /// and held to the end (a logging buffer one rank keeps): not a leak.
    HoldFromStart { stack: StackId, bytes: u64 },
    /// A block of `bytes` at `stack` every iteration, all freed every
    /// `period` iterations (a cache the collector clears): not a leak.
    Periodic {
        stack: StackId,
        bytes: u64,
        period: usize,
    },
    /// A block of `bytes` at `stack` kept every `every` iterations (a
    /// metric's state appended once an epoch, never reset): a leak.
    Staircase {
        stack: StackId,
        bytes: u64,
        every: usize,
    },
    /// A block of `bytes` at `stack` allocated at each of the iterations
    /// `at` and held to the end (three things loaded lazily): not a leak.
    OneTimeAt {
        stack: StackId,
        bytes: u64,
        at: [usize; 3],
    },
}

/// A training job made from a real trace: its events replayed `iterations`
/// times through the runtime's allocator, from the trace's start state.
#[derive(Clone, Debug)]
pub struct Job {
    pub iterations: usize,
    /// Marks each iteration's start in the trace (`Allocator::mark_step`).
    pub step_marks: bool,
    pub extra: Extra,
    /// The runtime's trace ring: small values make it wrap.
    pub trace_entries: usize,
    /// When set, the device holds only this many bytes more than the most
    /// the job reserved in its first two iterations (the second settles
    /// what the start state left), and the job stops at its first
    /// out-of-memory error.
    pub headroom: Option<u64>,
}

/// The request a job ran out of memory on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailedRequest {
    /// Bytes asked for, rounded, as the allocator's error gives them.
    pub requested: u64,
    /// The stack of the trace event the request replayed.
    pub stack: Option<StackId>,
}

impl Job {
    pub fn steady(iterations: usize) -> Job {
        Job {
            iterations,
            step_marks: true,
            extra: Extra::Nothing,
            trace_entries: 1 << 24,
            headroom: None,
        }
    }

    pub fn with(self, extra: Extra) -> Job {
        Job { extra, ..self }
    }

    /// Runs the job on `source`'s trace of `device` and returns the
    /// runtime's snapshot at its end, carrying `source`'s frames: the
    /// layout (segments, splitting, rounding) is the runtime's, following
    /// PyTorch's rules; the stacks are those of the real trace.
    pub fn run(&self, source: &Snapshot, device: u32) -> Snapshot {
        self.run_to_oom(source, device).0
    }

    /// [`Job::run`], with the request that ran out of memory, if one did
    /// (see [`Job::headroom`]); the snapshot is then taken at the error.
    pub fn run_to_oom(&self, source: &Snapshot, device: u32) -> (Snapshot, Option<FailedRequest>) {
        self.run_inner(source, device, None)
    }

    /// [`Job::run_to_oom`], handing `dump` the runtime's snapshot at the
    /// end of each iteration (with `source`'s stacks), as a job dumping
    /// every step would write it.
    pub fn run_dumping(
        &self,
        source: &Snapshot,
        device: u32,
        dump: &mut dyn FnMut(usize, Snapshot),
    ) -> (Snapshot, Option<FailedRequest>) {
        self.run_inner(source, device, Some(dump))
    }

    fn run_inner(
        &self,
        source: &Snapshot,
        device: u32,
        mut dump: Option<&mut dyn FnMut(usize, Snapshot)>,
    ) -> (Snapshot, Option<FailedRequest>) {
        let events = trace_of(source, device);
        let start = start_state(source, device).expect("a replayable trace");
        let config = AllocatorConfig {
            record_stacks: false,
            trace_entries: self.trace_entries,
            dump_dir: None,
            ..AllocatorConfig::default()
        };
        let mut replay = Replay::new(device, &start, config);
        // Marks the end of the start state in the trace (a snapshot marker).
        replay.allocator.snapshot();
        let free_at = if events.iter().any(|e| e.action == Action::FreeCompleted) {
            Action::FreeCompleted
        } else {
            Action::FreeRequested
        };
        // The source stack of each allocation, in the order they are made.
        let mut stacks: Vec<Option<StackId>> = Vec::new();
        let mut kept = Vec::new();
        let mut periodic = Vec::new();
        let mut grown: Option<DeviceBuffer> = None;
        let mut held: Option<DeviceBuffer> = None;
        let mut stairs = Vec::new();
        let mut failed = None;
        // The iteration's live blocks by their trace address (kept when
        // the job stops at an error, as a program's are at its dump).
        let mut this_iteration: HashMap<u64, (usize, DeviceBuffer)> = HashMap::new();
        'job: for iteration in 0..self.iterations {
            if self.step_marks {
                replay.allocator.mark_step(iteration as u64);
            }
            if let (2, Some(headroom)) = (iteration, self.headroom) {
                let peak = replay.allocator.stats().peak_reserved_bytes;
                replay.backend.log.lock().unwrap().capacity = peak + headroom;
            }
            let mut alloc = |replay: &Replay, size: u64, stream: i64, stack: Option<StackId>| {
                stacks.push(stack);
                match replay.allocator.alloc(size as usize, Stream(stream as u64)) {
                    Ok(b) => Ok(b),
                    Err(AllocError::OutOfMemory { requested, .. }) => {
                        Err(FailedRequest { requested, stack })
                    }
                    Err(e) => panic!("{e}"),
                }
            };
            match self.extra {
                Extra::GrowOneBlock { stack, bytes } => {
                    drop(grown.take());
                    let size = bytes * (iteration as u64 + 1);
                    match alloc(&replay, size, 0, Some(stack)) {
                        Ok(b) => grown = Some(b),
                        Err(f) => {
                            failed = Some(f);
                            break 'job;
                        }
                    }
                }
                Extra::Periodic {
                    stack,
                    bytes,
                    period,
                } => {
                    match alloc(&replay, bytes, 0, Some(stack)) {
                        Ok(b) => periodic.push(b),
                        Err(f) => {
                            failed = Some(f);
                            break 'job;
                        }
                    }
                    if periodic.len() == period {
                        periodic.clear();
                    }
                }
                Extra::Staircase {
                    stack,
                    bytes,
                    every,
                } if iteration % every == every - 1 => {
                    match alloc(&replay, bytes, 0, Some(stack)) {
                        Ok(b) => stairs.push(b),
                        Err(f) => {
                            failed = Some(f);
                            break 'job;
                        }
                    }
                }
                Extra::OneTimeAt { stack, bytes, at } if at.contains(&iteration) => {
                    match alloc(&replay, bytes, 0, Some(stack)) {
                        Ok(b) => stairs.push(b),
                        Err(f) => {
                            failed = Some(f);
                            break 'job;
                        }
                    }
                }
                Extra::HoldFromStart { stack, bytes } if iteration == 0 => {
                    match alloc(&replay, bytes, 0, Some(stack)) {
                        Ok(b) => held = Some(b),
                        Err(f) => {
                            failed = Some(f);
                            break 'job;
                        }
                    }
                }
                Extra::Nothing
                | Extra::KeepBlock { .. }
                | Extra::HoldFromStart { .. }
                | Extra::Staircase { .. }
                | Extra::OneTimeAt { .. } => {}
            }
            let mut i = 0;
            while i < events.len() {
                let e = &events[i];
                match &e.action {
                    Action::SegmentAlloc => replay.backend.expect(Some((e.address, e.size))),
                    Action::Alloc => match alloc(&replay, e.size, e.stream, e.stack) {
                        Ok(b) => {
                            this_iteration.insert(e.address, (i, b));
                        }
                        Err(f) => {
                            failed = Some(f);
                            break 'job;
                        }
                    },
                    a if *a == free_at => match this_iteration.remove(&e.address) {
                        Some((at, b)) => {
                            if matches!(self.extra, Extra::KeepBlock { alloc } if alloc == at) {
                                kept.push(b);
                            }
                        }
                        // A block from before the trace: freed once.
                        None => drop(replay.live.remove(&e.address)),
                    },
                    Action::SegmentFree => {
                        while i + 1 < events.len() && events[i + 1].action == Action::SegmentFree {
                            i += 1;
                        }
                        replay.allocator.empty_cache();
                    }
                    _ => {}
                }
                i += 1;
            }
            // What the trace left allocated belongs to the step (the last
            // step's outputs, say) and is freed before the next one.
            this_iteration.clear();
            if let Some(dump) = dump.as_mut() {
                let mut snap = replay.allocator.snapshot();
                with_source_stacks(&mut snap, source, &stacks);
                dump(iteration, snap);
            }
        }
        let mut snap = replay.allocator.snapshot();
        drop((kept, periodic, grown, held, this_iteration));
        with_source_stacks(&mut snap, source, &stacks);
        (snap, failed)
    }
}

/// Replaces the runtime's stacks in `snap` by `source`'s: the `n`-th
/// allocation of the trace (after the start state's marker) gets
/// `stacks[n]`; frees, blocks and segments get the stack of the allocation
/// they belong to. The start state's blocks keep none (before recording).
fn with_source_stacks(snap: &mut Snapshot, source: &Snapshot, stacks: &[Option<StackId>]) {
    snap.frames = source.frames.clone();
    snap.stacks = source.stacks.clone();
    snap.strings = source.strings.clone();
    let mut events: Vec<TraceEvent> = snap.traces[0].events.iter().collect();
    // The start state's events end at its snapshot marker; a ring that
    // wrapped lost them, with the marker, and the allocations before the
    // oldest kept event are unknown.
    let kept_from = events
        .iter()
        .position(|e| e.action == Action::Snapshot)
        .map(|m| m + 1);
    let allocs_lost = match kept_from {
        Some(from) => {
            events.drain(..from);
            0
        }
        None => {
            let in_trace = events.iter().filter(|e| e.action == Action::Alloc).count();
            stacks.len() - in_trace
        }
    };
    let mut next = stacks[allocs_lost..].iter();
    // The stack of the allocation each block address and segment belongs to.
    let mut block_stack: HashMap<u64, Option<StackId>> = HashMap::new();
    let mut segment_stack: HashMap<u64, Option<StackId>> = HashMap::new();
    // Segment events waiting for the allocation that made their segment.
    let mut made_by_next = Vec::new();
    for i in 0..events.len() {
        let e = &mut events[i];
        match e.action {
            Action::Alloc => {
                e.stack = *next.next().expect("one stack per allocation");
                block_stack.insert(e.address, e.stack);
                let stack = e.stack;
                for j in made_by_next.drain(..) {
                    let segment: &mut TraceEvent = &mut events[j];
                    segment.stack = stack;
                    segment_stack.insert(segment.address, stack);
                }
            }
            Action::SegmentAlloc => made_by_next.push(i),
            // The request that failed: the last stack handed out.
            Action::Oom => e.stack = *next.next().expect("the failed request's stack"),
            Action::SegmentFree => e.stack = segment_stack.get(&e.address).copied().flatten(),
            _ => e.stack = block_stack.get(&e.address).copied().flatten(),
        }
    }
    snap.traces[0].events = events.into();
    for seg in &mut snap.segments {
        seg.stack = segment_stack.get(&seg.address).copied().flatten();
        for b in &mut seg.blocks {
            b.stack = b
                .state
                .is_active()
                .then(|| block_stack.get(&b.address).copied().flatten())
                .flatten();
        }
    }
}
