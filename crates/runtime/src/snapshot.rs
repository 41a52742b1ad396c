//! A snapshot built from a copy of the allocator's books (`recorder.rs`
//! copies them under its lock): stacks symbolized into the frame and stack
//! tables, segments and blocks in the model's terms, the trace's raw events
//! as PyTorch's actions, and what identifies the process and its run.

use std::sync::OnceLock;

use rustc_hash::FxHashMap;
use snapdiff_format::{
    Block, BlockState, DeviceInfo, DeviceTrace, Frame, Meta, Segment, Snapshot, StackId, TraceEvent,
};

use crate::recorder::{BooksCopy, Recorder};
use crate::stacks::{RawStackId, Symbolizer};
use crate::trace::now_us;

impl Recorder {
    /// A snapshot of the books now: copied under the lock, symbolized and
    /// built after releasing it, so other threads allocate meanwhile.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let copy = self.copy_books();
        build(copy, self, &mut self.symbolizer())
    }
}

/// The snapshot of `copy`, the books of `recorder`, with its stacks
/// symbolized by `symbolizer`.
pub(crate) fn build(copy: BooksCopy, recorder: &Recorder, symbolizer: &mut Symbolizer) -> Snapshot {
    let BooksCopy {
        segments,
        events,
        raw_stacks,
        stats,
        step,
    } = copy;
    let mut builder = SnapshotBuilder::default();
    let mut ids: Vec<&RawStackId> = raw_stacks.keys().collect();
    ids.sort_unstable();
    for &id in ids {
        builder.add_stack(id, &raw_stacks[&id], symbolizer);
    }
    let device = recorder.device.ordinal;
    let mut snap = Snapshot {
        meta: Meta {
            producer: Meta::PRODUCER_RUNTIME.to_owned(),
            source: None,
            created_us: Some(now_us()),
            pid: Some(std::process::id()),
            host: Some(host_name()),
            run_id: Some(run_id().to_owned()),
            label: recorder.config.label.clone(),
            step,
            devices: vec![DeviceInfo {
                ordinal: device,
                name: recorder.device.name.clone(),
                total_memory: Some(recorder.backend.memory_info().total),
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
                ..Block::default()
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
    if !events.is_empty() || recorder.config.trace_entries > 0 {
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
