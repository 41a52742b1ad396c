//! The snapshot model: one [`Snapshot`] per file, whatever wrote it.
//!
//! It follows PyTorch's `torch.cuda.memory._snapshot()` dict closely so that
//! import loses nothing, with one difference that matters for speed: frames,
//! stacks and repeated event strings are interned into tables and referred to
//! by index. Real snapshots repeat the same 30-90 frame stacks thousands of
//! times; PyTorch's pickles share them through the pickle memo, and the reader
//! maps that sharing straight onto these tables.

pub use compact_str::CompactString;
use serde::{Deserialize, Serialize};
pub use thin_vec::ThinVec;

use crate::codes::impl_coded_enum;
use crate::events::Events;
use crate::value::{Extra, Value};

/// Index into [`Snapshot::frames`].
pub type FrameId = u32;
/// Index into [`Snapshot::stacks`].
pub type StackId = u32;
/// Index into [`Snapshot::strings`].
pub type StrId = u32;

/// Everything one snapshot file holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Who wrote the snapshot, when, and on which devices.
    pub meta: Meta,
    /// Interned frames; [`FrameId`]s index this table.
    #[serde(with = "crate::columns::frames")]
    pub frames: Vec<Frame>,
    /// Interned stacks, each a list of frames, innermost (most recent) first
    /// as PyTorch writes them; [`StackId`]s index this table.
    #[serde(with = "crate::columns::stacks")]
    pub stacks: Vec<Vec<FrameId>>,
    /// Interned strings of trace events (compile context, user metadata);
    /// [`StrId`]s index this table.
    pub strings: Vec<String>,
    /// Reserved memory: every segment of every device, each with its blocks.
    #[serde(deserialize_with = "crate::columns::segments::deserialize")]
    pub segments: Vec<Segment>,
    /// Recorded allocator events, one trace per device, oldest first.
    pub traces: Vec<DeviceTrace>,
    /// PyTorch's `external_annotations` (`record_function` regions).
    pub annotations: Vec<Annotation>,
    /// PyTorch's `allocator_settings` dict, as written ([`Value::None`] when absent).
    pub allocator_settings: Value,
    /// Top-level keys this model has no field for (`host_segments`, ...).
    pub extra: Extra,
}

/// Where a snapshot came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The program that recorded it: [`Meta::PRODUCER_RUNTIME`],
    /// [`Meta::PRODUCER_TORCH`], or another name.
    pub producer: String,
    /// The file format it was first read from, e.g. `PyTorch pickle (protocol 4)`;
    /// kept when the snapshot is converted.
    pub source: Option<String>,
    /// When it was taken, in microseconds since the Unix epoch.
    pub created_us: Option<i64>,
    /// The recording process.
    pub pid: Option<u32>,
    /// The recording machine.
    pub host: Option<String>,
    /// Identifies one run of one process: two snapshots with the same run id
    /// can match blocks by identity.
    pub run_id: Option<String>,
    /// A free-form label (e.g. why the dump was taken).
    pub label: Option<String>,
    /// The training step at which it was taken, if the program marked steps.
    pub step: Option<u64>,
    /// The devices the snapshot covers.
    pub devices: Vec<DeviceInfo>,
    /// Anything else the producer wanted to record.
    pub extra: Extra,
}

impl Meta {
    /// [`Meta::producer`] of snapshots written by `snapdiff-runtime`.
    pub const PRODUCER_RUNTIME: &'static str = "snapdiff-runtime";
    /// [`Meta::producer`] of snapshots read from PyTorch files.
    pub const PRODUCER_TORCH: &'static str = "torch";
}

/// The device ordinal of PyTorch's pinned host memory (`host_segments` and
/// `host_traces`), read as a device of its own; reports name it with
/// [`DeviceName`].
pub const PINNED_HOST_DEVICE: u32 = u32::MAX;

/// How reports name a device: `device 0`, or `pinned host memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceName(pub u32);

impl std::fmt::Display for DeviceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            PINNED_HOST_DEVICE => f.write_str("pinned host memory"),
            ordinal => write!(f, "device {ordinal}"),
        }
    }
}

/// One device of the snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Device ordinal, as in [`Segment::device`].
    pub ordinal: u32,
    /// Device name (e.g. `NVIDIA A100-SXM4-80GB`, `host`).
    pub name: String,
    /// Total device memory in bytes, if known.
    pub total_memory: Option<u64>,
}

/// One stack frame.
///
/// Its texts are [`CompactString`]s, which keep up to 24 bytes inline: most
/// function names, and some files, take no allocation of their own (a file
/// of thousands of distinct frames reads 12% faster than with `String`s; see
/// bench/runs/2026-11-24.md). They read as `&str` like a `String`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    /// Function name.
    pub name: CompactString,
    /// Source file (`??` or empty when unknown).
    pub file: CompactString,
    /// Line number (0 when unknown).
    pub line: u32,
    /// Further keys, e.g. PyTorch's `fx_node_*` fields.
    pub extra: Vec<(String, String)>,
}

/// Which pool a segment belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    /// Requests of at most 1 MiB, packed into 2 MiB segments.
    Small,
    /// Larger requests.
    #[default]
    Large,
}
impl_coded_enum!(Pool { Small = 0 => "small", Large = 1 => "large" });

/// The state of a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockState {
    /// Held by the program.
    #[default]
    ActiveAllocated,
    /// Freed by the program but still in use by another stream.
    /// PyTorch's docstring calls it `active_awaiting_free`; both read.
    ActivePendingFree,
    /// Free and cached by the allocator.
    Inactive,
}
impl_coded_enum!(BlockState {
    ActiveAllocated = 0 => "active_allocated",
    ActivePendingFree = 1 => "active_pending_free" | "active_awaiting_free",
    Inactive = 2 => "inactive",
});

impl BlockState {
    /// Whether the block counts as active memory (allocated or pending free).
    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }
}

/// A contiguous range of device memory obtained from the driver
/// (`cudaMalloc`), or one mapped range of an expandable segment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Device ordinal.
    pub device: u32,
    /// Start address.
    pub address: u64,
    /// Size in bytes; the blocks' sizes sum to it.
    pub total_size: u64,
    /// The stream the segment serves (a `cudaStream_t` value; 0 is the default stream).
    pub stream: i64,
    /// Small or large pool.
    pub pool: Pool,
    /// The owning memory pool (CUDA graph or `MemPool`); `(0, 0)` is the default.
    pub pool_id: (i64, i64),
    /// Whether it is (a mapped range of) an expandable segment.
    pub is_expandable: bool,
    /// Stack that created the segment.
    pub stack: Option<StackId>,
    /// The blocks, in address order.
    #[serde(deserialize_with = "crate::columns::segments::counted_blocks")]
    pub blocks: Vec<Block>,
    /// PyTorch's `allocated_size`, as the file states it. It normally equals
    /// the sum over the blocks ([`Totals`] always recomputes it), but
    /// anonymized or edited files can disagree, and import keeps what they say.
    pub allocated_size: Option<u64>,
    /// PyTorch's `active_size`, as the file states it.
    pub active_size: Option<u64>,
    /// PyTorch's `requested_size`, as the file states it.
    pub requested_size: Option<u64>,
    /// Keys this model has no field for.
    pub extra: Extra,
}

impl Segment {
    /// Whether the segment is pinned host memory (PyTorch's `host_segments`),
    /// not a device's.
    pub fn is_pinned_host(&self) -> bool {
        self.device == PINNED_HOST_DEVICE
    }
}

/// A piece of a segment: handed out to the program, or free in the cache.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// Start address.
    pub address: u64,
    /// Size in bytes (rounded; may include unsplit slack).
    pub size: u64,
    /// Bytes the program asked for. Only meaningful for active blocks.
    pub requested_size: u64,
    /// Allocated, pending free, or cached.
    pub state: BlockState,
    /// Stack that allocated the block.
    pub stack: Option<StackId>,
    /// The allocation's sequence number within its process, when the
    /// producer records one (`snapdiff-runtime` does; PyTorch does not).
    pub alloc_seq: Option<u64>,
    /// Old PyTorch files (early 2023) kept a `history` per block instead of frames.
    pub history: ThinVec<HistoryEntry>,
    /// Keys this model has no field for.
    pub extra: ThinVec<(String, Value)>,
}

/// An entry of an old-style block `history`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Address of the allocation.
    pub address: u64,
    /// Size requested.
    pub real_size: u64,
    /// Stack of the allocation.
    pub stack: Option<StackId>,
    /// Keys this model has no field for.
    pub extra: Extra,
}

/// The recorded events of one device, oldest first.
///
/// Stored column by column in `.snap` files (see `columns.rs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceTrace {
    /// Device ordinal.
    pub device: u32,
    /// The events, stored column by column (25 bytes an event on PyTorch
    /// traces, where a `TraceEvent` takes 112).
    pub events: Events,
}

/// What a trace event records.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Action {
    /// A block was handed out; `size` is the request, unrounded.
    #[default]
    Alloc,
    /// The program freed a block.
    FreeRequested,
    /// The block became reusable.
    FreeCompleted,
    /// A segment was obtained from the driver.
    SegmentAlloc,
    /// A segment was returned to the driver.
    SegmentFree,
    /// Pages were mapped into an expandable segment.
    SegmentMap,
    /// Pages were unmapped from an expandable segment.
    SegmentUnmap,
    /// A snapshot was taken here; `size` is the active bytes at that moment.
    Snapshot,
    /// An allocation failed; `size` is the rounded request.
    Oom,
    /// `torch.cuda.memory._annotate_memory` tagged an allocation.
    Annotate,
    /// The program marked the start of a training step; `size` is the step number.
    Step,
    /// An action this version does not know, kept by name.
    Other(Box<str>),
}

impl Action {
    /// The one-byte code of a known action in `.snap` files.
    pub(crate) fn code(&self) -> Option<u8> {
        match self {
            Action::Alloc => Some(0),
            Action::FreeRequested => Some(1),
            Action::FreeCompleted => Some(2),
            Action::SegmentAlloc => Some(3),
            Action::SegmentFree => Some(4),
            Action::SegmentMap => Some(5),
            Action::SegmentUnmap => Some(6),
            Action::Snapshot => Some(7),
            Action::Oom => Some(8),
            Action::Annotate => Some(9),
            Action::Step => Some(10),
            Action::Other(_) => None,
        }
    }

    /// The known action with one-byte code `code`.
    #[inline]
    pub(crate) fn from_code(code: u8) -> Option<Action> {
        Some(match code {
            0 => Action::Alloc,
            1 => Action::FreeRequested,
            2 => Action::FreeCompleted,
            3 => Action::SegmentAlloc,
            4 => Action::SegmentFree,
            5 => Action::SegmentMap,
            6 => Action::SegmentUnmap,
            7 => Action::Snapshot,
            8 => Action::Oom,
            9 => Action::Annotate,
            10 => Action::Step,
            _ => return None,
        })
    }

    /// PyTorch's name of the action (`alloc`, `free_requested`, ...).
    pub fn name(&self) -> &str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
            Action::Step => "step",
            Action::Other(name) => name,
        }
    }

    /// The action with PyTorch's name `name`; unknown names become [`Action::Other`].
    pub fn from_name(name: &str) -> Action {
        match name {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            "annotate" => Action::Annotate,
            "step" => Action::Step,
            other => Action::Other(other.into()),
        }
    }
}

impl Serialize for Action {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Binary files store known actions as a one-byte code.
        match self.code() {
            Some(code) if !s.is_human_readable() => s.serialize_u8(code),
            _ => s.serialize_str(self.name()),
        }
    }
}

impl<'de> Deserialize<'de> for Action {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Action, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Action;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an action name or code")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Action, E> {
                u8::try_from(v)
                    .ok()
                    .and_then(Action::from_code)
                    .ok_or_else(|| E::custom(format!("unknown action code {v}")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Action, E> {
                self.visit_u64(u64::try_from(v).map_err(|_| E::custom("negative action code"))?)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Action, E> {
                Ok(Action::from_name(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// One recorded allocator event, as [`Events`] yields it.
///
/// Fields that few events carry live in the boxed [`EventDetails`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// What happened.
    pub action: Action,
    /// Block or segment address (0 for `snapshot`, `oom` and `step`).
    pub address: u64,
    /// Bytes; the meaning depends on the action (see [`Action`]).
    pub size: u64,
    /// The stream.
    pub stream: i64,
    /// When, in microseconds since the Unix epoch.
    pub time_us: Option<i64>,
    /// Stack recorded with the event.
    pub stack: Option<StackId>,
    /// PyTorch's compile context (`N/A` outside compiled regions).
    pub compile_context: Option<StrId>,
    /// PyTorch's user metadata string.
    pub user_metadata: Option<StrId>,
    /// The allocation's sequence number within its process, when recorded.
    pub alloc_seq: Option<u64>,
    /// The rarer fields, when any is present.
    pub details: Option<Box<EventDetails>>,
}

/// Fields of a [`TraceEvent`] that few events carry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EventDetails {
    /// `oom` only: free device memory reported by the driver.
    pub device_free: Option<u64>,
    /// The owning memory pool, when recorded.
    pub pool_id: Option<(i64, i64)>,
    /// Keys this model has no field for.
    pub extra: Extra,
}

impl TraceEvent {
    /// The event's details, created empty if it has none yet.
    pub fn details_mut(&mut self) -> &mut EventDetails {
        self.details.get_or_insert_with(Default::default)
    }

    /// `oom` only: free device memory reported by the driver.
    pub fn device_free(&self) -> Option<u64> {
        self.details.as_ref().and_then(|d| d.device_free)
    }
}

/// A PyTorch external annotation (a `record_function` region boundary).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Annotation {
    /// Device ordinal.
    pub device: u32,
    /// When, in microseconds since the Unix epoch.
    pub time_us: Option<i64>,
    /// Region name.
    pub name: Option<String>,
    /// `START` or `END`.
    pub stage: Option<String>,
    /// Further metadata.
    pub extra: Extra,
}

/// Memory totals with PyTorch's meanings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Number of segments.
    pub segments: u64,
    /// Number of blocks (all states).
    pub blocks: u64,
    /// Sum of segment sizes.
    pub reserved_bytes: u64,
    /// Sum of sizes of `active_allocated` blocks.
    pub allocated_bytes: u64,
    /// Sum of sizes of active blocks (allocated or pending free).
    pub active_bytes: u64,
    /// Sum of requested sizes of active blocks.
    pub requested_bytes: u64,
}

impl Totals {
    /// Adds one segment and its blocks.
    /// Sums saturate: sizes come from files, and a forged one must not
    /// wrap a total to a small number.
    pub fn add_segment(&mut self, segment: &Segment) {
        self.segments += 1;
        self.reserved_bytes = self.reserved_bytes.saturating_add(segment.total_size);
        for block in &segment.blocks {
            self.blocks += 1;
            if block.state == BlockState::ActiveAllocated {
                self.allocated_bytes = self.allocated_bytes.saturating_add(block.size);
            }
            if block.state.is_active() {
                self.active_bytes = self.active_bytes.saturating_add(block.size);
                self.requested_bytes = self.requested_bytes.saturating_add(block.requested_size);
            }
        }
    }

    /// Adds the totals of other segments.
    pub fn merge(&mut self, other: &Totals) {
        self.segments += other.segments;
        self.blocks += other.blocks;
        self.reserved_bytes = self.reserved_bytes.saturating_add(other.reserved_bytes);
        self.allocated_bytes = self.allocated_bytes.saturating_add(other.allocated_bytes);
        self.active_bytes = self.active_bytes.saturating_add(other.active_bytes);
        self.requested_bytes = self.requested_bytes.saturating_add(other.requested_bytes);
    }
}

impl Snapshot {
    /// The frames of stack `id`, innermost first; empty for `None`.
    pub fn stack_frames(&self, id: Option<StackId>) -> impl Iterator<Item = &Frame> + '_ {
        let ids: &[FrameId] = id.map_or(&[], |id| &self.stacks[id as usize]);
        ids.iter().map(|&f| &self.frames[f as usize])
    }

    /// The interned string `id`.
    pub fn string(&self, id: StrId) -> &str {
        &self.strings[id as usize]
    }

    /// Totals over all devices. Pinned host memory is not a device's and
    /// is left out: see [`Snapshot::pinned_host_totals`].
    pub fn totals(&self) -> Totals {
        let mut totals = Totals::default();
        for segment in self.device_segments() {
            totals.add_segment(segment);
        }
        totals
    }

    /// The segments of the devices, without pinned host memory's.
    pub fn device_segments(&self) -> impl Iterator<Item = &Segment> + '_ {
        self.segments.iter().filter(|s| !s.is_pinned_host())
    }

    /// The pinned host allocator's segments (one block each).
    pub fn pinned_host_segments(&self) -> impl Iterator<Item = &Segment> + '_ {
        self.segments.iter().filter(|s| s.is_pinned_host())
    }

    /// Totals of pinned host memory, when the file recorded it
    /// (`record_pinned_host_memory=True`).
    pub fn pinned_host_totals(&self) -> Option<Totals> {
        let mut totals = Totals::default();
        for segment in self.pinned_host_segments() {
            totals.add_segment(segment);
        }
        (totals.segments > 0).then_some(totals)
    }

    /// Number of trace events over all devices.
    pub fn trace_len(&self) -> usize {
        self.traces.iter().map(|t| t.events.len()).sum()
    }

    /// Device ordinals present in segments, traces or the device list, sorted.
    pub fn device_ordinals(&self) -> Vec<u32> {
        let mut ords: Vec<u32> = self
            .segments
            .iter()
            .map(|s| s.device)
            .chain(self.traces.iter().map(|t| t.device))
            .chain(self.meta.devices.iter().map(|d| d.ordinal))
            .collect();
        ords.sort_unstable();
        ords.dedup();
        ords
    }

    /// Sorts the frame table by file, function and line, and renumbers the
    /// stacks to match. `snapdiff convert` and the runtime call it before a
    /// snapshot is written: neighbouring frames then share their file and
    /// function, and their lines differ little, which is what makes `.snap`
    /// files small. Readers leave frames in the order the file has them.
    pub fn sort_frames(&mut self) {
        // Rank the distinct files and names first, so that the frame sort
        // compares integers rather than long, similar paths.
        fn ranks<'a>(texts: impl Iterator<Item = &'a str>) -> rustc_hash::FxHashMap<&'a str, u32> {
            let mut distinct: Vec<&str> = texts.collect();
            distinct.sort_unstable();
            distinct.dedup();
            distinct
                .into_iter()
                .enumerate()
                .map(|(i, t)| (t, i as u32))
                .collect()
        }
        let file_rank = ranks(self.frames.iter().map(|f| f.file.as_str()));
        let name_rank = ranks(self.frames.iter().map(|f| f.name.as_str()));
        let keys: Vec<(u32, u32, u32)> = self
            .frames
            .iter()
            .map(|f| {
                (
                    file_rank[f.file.as_str()],
                    name_rank[f.name.as_str()],
                    f.line,
                )
            })
            .collect();
        let mut order: Vec<FrameId> = (0..self.frames.len() as FrameId).collect();
        order.sort_unstable_by(|&a, &b| {
            keys[a as usize]
                .cmp(&keys[b as usize])
                .then_with(|| {
                    self.frames[a as usize]
                        .extra
                        .cmp(&self.frames[b as usize].extra)
                })
                .then(a.cmp(&b))
        });
        drop(file_rank);
        drop(name_rank);
        if order.iter().enumerate().all(|(i, &f)| i as FrameId == f) {
            return;
        }
        let mut new_id = vec![0 as FrameId; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_id[old as usize] = new as FrameId;
        }
        let mut old_frames: Vec<Option<Frame>> = std::mem::take(&mut self.frames)
            .into_iter()
            .map(Some)
            .collect();
        self.frames = order
            .iter()
            .map(|&old| old_frames[old as usize].take().expect("a permutation"))
            .collect();
        for stack in &mut self.stacks {
            for f in stack.iter_mut() {
                *f = new_id[*f as usize];
            }
        }
    }

    /// Checks that every table index is in range, so that analysis can index
    /// without checks. Readers call it on every file they load.
    pub fn check_references(&self) -> Result<(), String> {
        let frames = self.frames.len();
        for (i, stack) in self.stacks.iter().enumerate() {
            if let Some(&f) = stack.iter().find(|&&f| f as usize >= frames) {
                return Err(format!(
                    "stack {i} refers to frame {f}, but there are {frames} frames"
                ));
            }
        }
        let stacks = self.stacks.len();
        let strings = self.strings.len();
        let check_stack = |s: Option<StackId>, what: &dyn Fn() -> String| match s {
            Some(s) if s as usize >= stacks => Err(format!(
                "{} refers to stack {s}, but there are {stacks} stacks",
                what()
            )),
            _ => Ok(()),
        };
        for (si, seg) in self.segments.iter().enumerate() {
            check_stack(seg.stack, &|| format!("segment {si}"))?;
            for (bi, block) in seg.blocks.iter().enumerate() {
                check_stack(block.stack, &|| format!("segment {si} block {bi}"))?;
                for h in &block.history {
                    check_stack(h.stack, &|| format!("segment {si} block {bi} history"))?;
                }
            }
        }
        for trace in &self.traces {
            if let Some((ei, what, id)) = trace.events.first_reference_past(stacks, strings) {
                let there_are = if what == "stack" { stacks } else { strings };
                return Err(format!(
                    "{} trace event {ei} refers to {what} {id}, but there are {there_are} {what}s",
                    DeviceName(trace.device)
                ));
            }
        }
        Ok(())
    }
}
