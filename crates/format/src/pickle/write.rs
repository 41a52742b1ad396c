//! Writing a snapshot as PyTorch writes it: the dict of
//! `torch.cuda.memory._snapshot()`, pickled, so that a Rust job's dumps open
//! in PyTorch's memory viewer and `torch.cuda._memory_viz`.
//!
//! Written by hand, not with serde-pickle: PyTorch's files share each
//! stack's frame list among all the blocks and events that carry it (the
//! pickle memo), and serde-pickle cannot write shared objects, so its files
//! would repeat every frame of every block (tens of times larger). This
//! writer memoizes each distinct string, frame and frame list once, as
//! CPython's pickler does for PyTorch's own dict. Protocol 4, without
//! framing (optional for readers).

use std::io::Write;

use rustc_hash::FxHashMap;

use crate::events::Events;
use crate::model::{
    Action, BlockState, Frame, PINNED_HOST_DEVICE, Pool, Segment, Snapshot, StackId, TraceEvent,
};
use crate::value::Value;
use crate::{Error, Result};

use super::opcodes::{
    APPENDS, BINBYTES, BINFLOAT, BINGET, BININT, BININT1, BININT2, BINUNICODE, EMPTY_DICT,
    EMPTY_LIST, LONG_BINGET, LONG1, MARK, MEMOIZE, NEWFALSE, NEWTRUE, NONE, PROTO, SETITEMS,
    SHORT_BINBYTES, SHORT_BINUNICODE, STOP, TUPLE2,
};

/// Items per APPENDS or SETITEMS batch, as CPython's pickler writes them.
const BATCH: usize = 1000;

/// Writes `snap` as a PyTorch snapshot pickle.
///
/// # Errors
///
/// When writing fails.
pub fn write_torch_pickle<W: Write>(snap: &Snapshot, out: W) -> Result<()> {
    let mut w = Writer {
        out: std::io::BufWriter::with_capacity(1 << 20, out),
        memo: 0,
        strings: FxHashMap::default(),
        frames: vec![None; snap.frames.len()],
        stacks: vec![None; snap.stacks.len()],
        snap,
    };
    w.snapshot()
        .map_err(|e| Error::io("cannot write the pickle", e))
}

/// A pickler with a memo of what it wrote: strings by text, frames and
/// frame lists by id.
struct Writer<'a, W: Write> {
    out: std::io::BufWriter<W>,
    /// Memo slots used so far.
    memo: u32,
    strings: FxHashMap<Box<str>, u32>,
    frames: Vec<Option<u32>>,
    stacks: Vec<Option<u32>>,
    snap: &'a Snapshot,
}

type Io = std::io::Result<()>;

impl<'a, W: Write> Writer<'a, W> {
    fn op(&mut self, op: u8) -> Io {
        self.out.write_all(&[op])
    }

    /// Memoizes the object just written; returns its slot.
    fn memoize(&mut self) -> std::io::Result<u32> {
        self.op(MEMOIZE)?;
        self.memo += 1;
        Ok(self.memo - 1)
    }

    fn get(&mut self, slot: u32) -> Io {
        match u8::try_from(slot) {
            Ok(small) => self.out.write_all(&[BINGET, small]),
            Err(_) => {
                self.op(LONG_BINGET)?;
                self.out.write_all(&slot.to_le_bytes())
            }
        }
    }

    fn int(&mut self, v: i128) -> Io {
        match v {
            0..=0xff => self.out.write_all(&[BININT1, v as u8]),
            0x100..=0xffff => {
                self.op(BININT2)?;
                self.out.write_all(&(v as u16).to_le_bytes())
            }
            _ if i32::try_from(v).is_ok() => {
                self.op(BININT)?;
                self.out.write_all(&(v as i32).to_le_bytes())
            }
            _ => {
                // Little-endian two's complement, as short as it goes.
                let bytes = v.to_le_bytes();
                let mut n = bytes.len();
                while n > 1 {
                    let (last, prev) = (bytes[n - 1], bytes[n - 2]);
                    let redundant =
                        (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0);
                    if !redundant {
                        break;
                    }
                    n -= 1;
                }
                self.out.write_all(&[LONG1, n as u8])?;
                self.out.write_all(&bytes[..n])
            }
        }
    }

    fn bool(&mut self, v: bool) -> Io {
        self.op(if v { NEWTRUE } else { NEWFALSE })
    }

    /// A string, memoized: each distinct text is written once.
    fn str(&mut self, s: &str) -> Io {
        if let Some(&slot) = self.strings.get(s) {
            return self.get(slot);
        }
        self.text(s)?;
        let slot = self.memoize()?;
        self.strings.insert(s.into(), slot);
        Ok(())
    }

    /// A string written out whole.
    fn text(&mut self, s: &str) -> Io {
        match u8::try_from(s.len()) {
            Ok(n) => self.out.write_all(&[SHORT_BINUNICODE, n])?,
            Err(_) => {
                self.op(BINUNICODE)?;
                self.out.write_all(&(s.len() as u32).to_le_bytes())?;
            }
        }
        self.out.write_all(s.as_bytes())
    }

    /// A list of `n` items, item `i` written by `item(self, i)`.
    fn list(&mut self, n: usize, mut item: impl FnMut(&mut Self, usize) -> Io) -> Io {
        self.op(EMPTY_LIST)?;
        self.memoize()?;
        let mut i = 0;
        while i < n {
            self.op(MARK)?;
            for j in i..(i + BATCH).min(n) {
                item(self, j)?;
            }
            self.op(APPENDS)?;
            i += BATCH;
        }
        Ok(())
    }

    fn value(&mut self, v: &Value) -> Io {
        match v {
            Value::None => self.op(NONE),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(*i),
            Value::Float(f) => {
                self.op(BINFLOAT)?;
                self.out.write_all(&f.to_be_bytes())
            }
            Value::Str(s) => self.str(s),
            Value::Bytes(b) => {
                match u8::try_from(b.len()) {
                    Ok(n) => self.out.write_all(&[SHORT_BINBYTES, n])?,
                    Err(_) => {
                        self.op(BINBYTES)?;
                        self.out.write_all(&(b.len() as u32).to_le_bytes())?;
                    }
                }
                self.out.write_all(b)?;
                self.memoize().map(drop)
            }
            Value::List(items) => self.list(items.len(), |w, i| w.value(&items[i])),
            Value::Map(entries) => {
                self.op(EMPTY_DICT)?;
                self.memoize()?;
                for batch in entries.chunks(BATCH) {
                    self.op(MARK)?;
                    for (key, value) in batch {
                        self.str(key)?;
                        self.value(value)?;
                    }
                    self.op(SETITEMS)?;
                }
                Ok(())
            }
        }
    }

    /// `{"filename", "line", "name"}` and any further keys; each frame once.
    fn frame(&mut self, id: u32) -> Io {
        if let Some(slot) = self.frames[id as usize] {
            return self.get(slot);
        }
        let frame: &'a Frame = &self.snap.frames[id as usize];
        self.op(EMPTY_DICT)?;
        let slot = self.memoize()?;
        self.op(MARK)?;
        self.str("filename")?;
        self.str(&frame.file)?;
        self.str("line")?;
        self.int(i128::from(frame.line))?;
        self.str("name")?;
        self.str(&frame.name)?;
        for (key, value) in &frame.extra {
            self.str(key)?;
            self.str(value)?;
        }
        self.op(SETITEMS)?;
        self.frames[id as usize] = Some(slot);
        Ok(())
    }

    /// The frame list of `stack` (innermost first); each stack's list once.
    fn frames_of(&mut self, stack: Option<StackId>) -> Io {
        let Some(stack) = stack else {
            return self.list(0, |_, _| Ok(()));
        };
        if let Some(slot) = self.stacks[stack as usize] {
            return self.get(slot);
        }
        let slot = self.memo;
        let snap = self.snap;
        // A backward allocation's own frames end at the forward marker; the
        // forward frames after it are in its `forward_frames`, written as read.
        let ids = &snap.stacks[stack as usize];
        let own = ids
            .iter()
            .position(|&f| snap.frames[f as usize].is_forward_marker())
            .unwrap_or(ids.len());
        self.list(own, |w, i| w.frame(ids[i]))?;
        self.stacks[stack as usize] = Some(slot);
        Ok(())
    }

    fn snapshot(&mut self) -> Io {
        let snap = self.snap;
        self.out.write_all(&[PROTO, 4])?;
        // Pinned host memory goes back under its own keys.
        let host = |device: u32| device == PINNED_HOST_DEVICE;
        let (host_segments, segments): (Vec<&'a Segment>, Vec<&'a Segment>) =
            snap.segments.iter().partition(|s| host(s.device));
        // One trace per device up to the last that has one (PyTorch writes
        // one per device allocator, empty when history is off).
        let devices = snap
            .traces
            .iter()
            .map(|t| t.device)
            .filter(|&d| !host(d))
            .max()
            .map_or(0, |d| d as usize + 1);
        self.op(EMPTY_DICT)?;
        self.memoize()?;
        self.op(MARK)?;
        self.str("segments")?;
        self.list(segments.len(), |w, i| w.segment(segments[i]))?;
        self.str("device_traces")?;
        self.list(devices, |w, d| {
            let none = Events::new();
            let events = snap
                .traces
                .iter()
                .find(|t| t.device as usize == d)
                .map_or(&none, |t| &t.events);
            w.events(events)
        })?;
        if !host_segments.is_empty() {
            self.str("host_segments")?;
            self.list(host_segments.len(), |w, i| w.segment(host_segments[i]))?;
        }
        if let Some(trace) = snap.traces.iter().find(|t| host(t.device)) {
            self.str("host_traces")?;
            self.events(&trace.events)?;
        }
        self.str("external_annotations")?;
        self.list(snap.annotations.len(), |w, i| {
            let a = &snap.annotations[i];
            w.op(EMPTY_DICT)?;
            w.memoize()?;
            w.op(MARK)?;
            w.str("device")?;
            w.int(i128::from(a.device))?;
            if let Some(t) = a.time_us {
                w.str("time_us")?;
                w.int(i128::from(t))?;
            }
            if let Some(name) = &a.name {
                w.str("name")?;
                w.str(name)?;
            }
            if let Some(stage) = &a.stage {
                w.str("stage")?;
                w.str(stage)?;
            }
            for (key, value) in &a.extra {
                w.str(key)?;
                w.value(value)?;
            }
            w.op(SETITEMS)
        })?;
        if snap.allocator_settings != Value::None {
            self.str("allocator_settings")?;
            self.value(&snap.allocator_settings)?;
        }
        for (key, value) in &snap.extra {
            self.str(key)?;
            self.value(value)?;
        }
        self.op(SETITEMS)?;
        self.op(STOP)?;
        self.out.flush()
    }

    /// One device's trace: a list of event dicts.
    fn events(&mut self, events: &Events) -> Io {
        let mut each = events.iter();
        self.list(events.len(), |w, _| {
            w.event(&each.next().expect("one event per item of the list"))
        })
    }

    fn segment(&mut self, s: &'a Segment) -> Io {
        let active = |b: &&crate::Block| b.state != BlockState::Inactive;
        let allocated: u64 = s
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum();
        let active_size: u64 = s.blocks.iter().filter(active).map(|b| b.size).sum();
        let requested: u64 = s
            .blocks
            .iter()
            .filter(active)
            .map(|b| b.requested_size)
            .sum();
        self.op(EMPTY_DICT)?;
        self.memoize()?;
        self.op(MARK)?;
        for (key, value) in [
            ("device", i128::from(s.device)),
            ("address", i128::from(s.address)),
            ("total_size", i128::from(s.total_size)),
            (
                "allocated_size",
                i128::from(s.allocated_size.unwrap_or(allocated)),
            ),
            (
                "active_size",
                i128::from(s.active_size.unwrap_or(active_size)),
            ),
            (
                "requested_size",
                i128::from(s.requested_size.unwrap_or(requested)),
            ),
            ("stream", i128::from(s.stream)),
        ] {
            self.str(key)?;
            self.int(value)?;
        }
        self.str("segment_type")?;
        self.str(match s.pool {
            Pool::Small => "small",
            Pool::Large => "large",
        })?;
        self.str("segment_pool_id")?;
        self.int(i128::from(s.pool_id.0))?;
        self.int(i128::from(s.pool_id.1))?;
        self.op(TUPLE2)?;
        self.memoize()?;
        self.str("is_expandable")?;
        self.bool(s.is_expandable)?;
        self.str("frames")?;
        self.frames_of(s.stack)?;
        self.str("blocks")?;
        self.list(s.blocks.len(), |w, i| {
            let b = &s.blocks[i];
            w.op(EMPTY_DICT)?;
            w.memoize()?;
            w.op(MARK)?;
            w.str("address")?;
            w.int(i128::from(b.address))?;
            w.str("size")?;
            w.int(i128::from(b.size))?;
            w.str("requested_size")?;
            w.int(i128::from(b.requested_size))?;
            w.str("state")?;
            w.str(b.state.name())?;
            w.str("frames")?;
            w.frames_of(b.stack)?;
            if !b.history.is_empty() {
                w.str("history")?;
                w.list(b.history.len(), |w, k| {
                    let h = &b.history[k];
                    w.op(EMPTY_DICT)?;
                    w.memoize()?;
                    w.op(MARK)?;
                    w.str("addr")?;
                    w.int(i128::from(h.address))?;
                    w.str("real_size")?;
                    w.int(i128::from(h.real_size))?;
                    if h.stack.is_some() {
                        w.str("frames")?;
                        w.frames_of(h.stack)?;
                    }
                    for (key, value) in &h.extra {
                        w.str(key)?;
                        w.value(value)?;
                    }
                    w.op(SETITEMS)
                })?;
            }
            for (key, value) in &b.extra {
                w.str(key)?;
                w.value(value)?;
            }
            w.op(SETITEMS)
        })?;
        for (key, value) in &s.extra {
            self.str(key)?;
            self.value(value)?;
        }
        self.op(SETITEMS)
    }

    fn event(&mut self, e: &TraceEvent) -> Io {
        self.op(EMPTY_DICT)?;
        self.memoize()?;
        self.op(MARK)?;
        self.str("action")?;
        self.str(e.action.name())?;
        match e.action {
            Action::Oom => {
                self.str("device_free")?;
                self.int(i128::from(e.device_free().unwrap_or(0)))?;
            }
            _ => {
                self.str("addr")?;
                self.int(i128::from(e.address))?;
            }
        }
        self.str("size")?;
        self.int(i128::from(e.size))?;
        self.str("stream")?;
        self.int(i128::from(e.stream))?;
        if let Some(t) = e.time_us {
            self.str("time_us")?;
            self.int(i128::from(t))?;
        }
        if e.stack.is_some() {
            self.str("frames")?;
            self.frames_of(e.stack)?;
        }
        let snap = self.snap;
        if let Some(c) = e.compile_context {
            self.str("compile_context")?;
            self.str(snap.string(c))?;
        }
        if let Some(m) = e.user_metadata {
            self.str("user_metadata")?;
            self.str(snap.string(m))?;
        }
        if let Some(details) = &e.details {
            if let Some((a, b)) = details.pool_id {
                self.str("pool_id")?;
                self.int(i128::from(a))?;
                self.int(i128::from(b))?;
                self.op(TUPLE2)?;
                self.memoize()?;
            }
            for (key, value) in &details.extra {
                self.str(key)?;
                self.value(value)?;
            }
        }
        self.op(SETITEMS)
    }
}
