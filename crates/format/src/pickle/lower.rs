//! Turning pickled dicts into typed records, with PyTorch's schema.
//!
//! The same functions serve two moments. While the pickle runs, every
//! completed dict that looks like a frame, a trace event, a block or a
//! segment is lowered at once (errors are ignored then: the dict simply
//! stays generic).
//! After it runs, [`Lowerer`] walks the result from the top with the schema
//! in hand, picks up the lowered records and converts whatever is still
//! generic, reporting problems with their path (`segments[3].blocks[0].size`).
//!
//! Frames and stacks are interned here: a frame list that the pickle memo
//! shares is one container, converted once into one [`StackId`].

use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::{FxBuildHasher, FxHashMap};

use crate::events::Events;
use crate::intern::Interner;
use crate::model::{
    Action, Block, BlockState, Frame, FrameId, HistoryEntry, PINNED_HOST_DEVICE, Pool, Segment,
    StackId, StrId, ThinVec, TraceEvent,
};
use crate::pickle::heap::{
    Container, Failure, Heap, Key, Record, Val, at, bool_of, describe, entries, i64_of, index, int,
    items, key_text, missing, pair_of, str_handle, str_of, u32_of, u64_of,
};
use crate::value::Value;

/// No text id yet, in [`Lowerer::text_ids`].
const UNSEEN: u32 = u32::MAX;

/// How many entries the frame and stack indexes are reserved for, at most.
const MAX_RESERVED_INDEX: usize = 4096;

/// How deep generic values (settings, unknown keys) may nest.
const MAX_DEPTH: usize = 64;

/// Segments of at most this size without a `segment_type` belong to the small pool.
const SMALL_SEGMENT_SIZE: u64 = 2 << 20;

/// Typed records lowered so far, and the interning tables behind them.
#[derive(Default)]
pub(crate) struct Lowerer {
    /// Distinct frames, in id order, up to those still pending.
    frames: Vec<Frame>,
    /// Frames found but not built yet, in id order after `frames`; see
    /// [`Lowerer::build_frames`].
    pending_frames: Vec<PendingFrame>,
    /// Frames without extra keys (nearly all) by name, file and line, the
    /// texts given by their [`Lowerer::text_id`]: three integers to hash, and
    /// no frame built to find a known one.
    plain_frame_ids: FxHashMap<(u32, u32, u32), FrameId>,
    /// Frames with extra keys (PyTorch's `fx_node_*` fields), by content.
    other_frame_ids: FxHashMap<Frame, FrameId>,
    /// Pickled strings by text: the first pickled string of each text,
    /// which stands for all strings equal to it.
    texts: HashTable<(u64, u32)>,
    /// The [`Lowerer::text_id`] of each pickled string seen in a frame (by
    /// heap string id; [`UNSEEN`] for none).
    text_ids: Vec<u32>,
    stacks: Interner<Vec<FrameId>>,
    /// Frame ids of the stack being interned (reused to avoid allocating).
    scratch: Vec<FrameId>,
    strings: Interner<String>,
    /// The string each event field ([`EventText`]) was given last.
    last_event_texts: [Option<StrId>; 2],
    /// The interned id of pickled strings given to an event field with a
    /// text other than the field's last (by heap string id; [`UNSEEN`] for
    /// none): such a string given again, through the memo, needs no compare.
    string_ids: Vec<StrId>,
    /// Lowered events, moved out when placed into a trace.
    events: Events,
    /// Whether each lowered event was already moved out.
    event_taken: Vec<bool>,
    /// Whether each lowered event was already put into a list; see
    /// [`Lowerer::place`].
    event_placed: Vec<bool>,
    /// The action each pickled string names, once looked up (by heap string id).
    heap_actions: Vec<Option<Action>>,
    /// Lowered blocks and whether their dict had an `address`.
    blocks: BlockStore,
    /// Whether each lowered block was already put into a list.
    block_placed: Vec<bool>,
    /// Segments lowered while the pickle ran, until the schema pass takes
    /// them; see [`Lowerer::lower_segment`].
    segments: Vec<Segment>,
    /// Whether each lowered segment was already taken.
    segment_taken: Vec<bool>,
    /// Bytes of generic values still allowed to be produced: bounds the
    /// expansion of a pickle that shares one container or string many times
    /// over, to a small multiple of the file's size.
    value_budget: usize,
}

/// `a == b`, without calling `memcmp` for empty strings: glibc's AVX-512
/// `memcmp` reads through the dangling pointer of an empty `String` with a
/// masked load, which costs a ~100 ns microcode assist per call on the
/// machine measured (bench/runs/2026-11-24.md), and PyTorch writes an empty
/// `user_metadata` on every trace event.
fn same_text(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// An event with no fields set, for [`Lowerer::add_event`] to fill in. A
/// constant, copied from read-only memory: `TraceEvent::default()` builds it
/// on the stack and copies it with loads that straddle its stores.
const BLANK_EVENT: TraceEvent = TraceEvent {
    action: Action::Alloc,
    address: 0,
    size: 0,
    stream: 0,
    time_us: None,
    stack: None,
    compile_context: None,
    user_metadata: None,
    alloc_seq: None,
    details: None,
};

/// A frame found while the pickle runs, built into a [`Frame`] afterwards.
enum PendingFrame {
    /// A frame without extra keys: its name and file as pickled strings.
    Plain { name: u32, file: u32, line: u32 },
    /// A frame with extra keys, built already.
    Built(Box<Frame>),
}

/// The text fields of a trace event, for [`Lowerer::event_text`].
#[derive(Clone, Copy)]
enum EventText {
    CompileContext,
    UserMetadata,
}

/// The records a list held as a run ([`Container::Events`],
/// [`Container::Blocks`]) stands for.
#[derive(Clone, Copy)]
enum Run {
    Events,
    Blocks,
}

/// Which typed record a dict's keys say it is.
enum Shape {
    Frame,
    Event,
    Block,
    Other,
}

fn shape(heap: &Heap, entries: &[[Val; 2]]) -> Shape {
    let (mut action, mut state, mut size, mut blocks, mut filename, mut name, mut line) =
        (false, false, false, false, false, false, false);
    for &[k, _] in entries {
        match heap.key(k) {
            Key::Action => action = true,
            Key::State => state = true,
            Key::Size => size = true,
            Key::Blocks => blocks = true,
            Key::Filename => filename = true,
            Key::Name => name = true,
            Key::Line => line = true,
            _ => {}
        }
    }
    if action {
        Shape::Event
    } else if state && size && !blocks {
        Shape::Block
    } else if filename && name && line && !state && !blocks {
        Shape::Frame
    } else {
        Shape::Other
    }
}

impl Lowerer {
    /// The frame, stack and string tables, for the snapshot.
    pub(crate) fn into_tables(
        mut self,
        heap: &Heap,
    ) -> (Vec<Frame>, Vec<Vec<FrameId>>, Vec<String>) {
        self.build_frames(heap);
        // The table was reserved generously. Shrinking copies it, which is
        // worth it only when most of it went unused.
        if self.frames.capacity() > 2 * self.frames.len() {
            self.frames.shrink_to_fit();
        }
        (
            self.frames,
            self.stacks.into_items(),
            self.strings.into_items(),
        )
    }

    /// A lowerer for a pickle of `len` bytes.
    pub(crate) fn for_input(len: usize) -> Lowerer {
        Lowerer {
            // A trace event takes at least 48 pickled bytes and a distinct
            // frame at least 32; reserving for that many costs address space,
            // not memory, and saves copying the tables as they grow.
            events: Events::with_capacity(len / 48),
            event_taken: Vec::with_capacity(len / 48),
            event_placed: Vec::with_capacity(len / 48),
            // A block dict takes at least 48 pickled bytes too.
            blocks: BlockStore::default(),
            block_placed: Vec::with_capacity(len / 48),
            // A segment dict takes at least 256 pickled bytes with its block.
            segments: Vec::with_capacity(len / 256),
            segment_taken: Vec::with_capacity(len / 256),
            frames: Vec::with_capacity(len / 32),
            pending_frames: Vec::with_capacity(len / 32),
            // Not so for a hash table: its inserts land all over it, touching
            // every page. The frame and stack indexes are reserved only up to
            // a few thousand entries (128 KiB each), which saves rehashing
            // them as they grow in files that write thousands of distinct
            // frames and stacks (the snapviewer sample: 3295 and 1040).
            plain_frame_ids: FxHashMap::with_capacity_and_hasher(
                (len / 32).min(MAX_RESERVED_INDEX),
                FxBuildHasher,
            ),
            stacks: Interner::with_capacity((len / 128).min(MAX_RESERVED_INDEX)),
            value_budget: 8 * len + (4 << 20),
            ..Lowerer::default()
        }
    }

    /// Lowers dict `id` in place if its keys say it is a frame, a trace event
    /// or a block and it converts cleanly; otherwise leaves it generic.
    pub(crate) fn lower_dict(&mut self, heap: &mut Heap, id: u32) {
        let Container::Dict(entries) = &heap.containers[id as usize] else {
            return;
        };
        if let Some(record) = self.lower_entries(heap, entries) {
            heap.settle(id, record);
        }
    }

    /// The typed record that a dict of `entries` lowers to, if its keys say
    /// it is a frame, a trace event or a block and it converts cleanly.
    pub(crate) fn lower_entries(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Option<Record> {
        // PyTorch writes `action` first: an event needs no look at its other keys.
        let shape = match entries.first() {
            Some(&[k, _]) if heap.key(k) == Key::Action => Shape::Event,
            _ => shape(heap, entries),
        };
        match shape {
            Shape::Frame => self.frame(heap, entries).ok().map(Record::Frame),
            Shape::Event => {
                self.add_event(heap, entries).ok()?;
                self.event_taken.push(false);
                self.event_placed.push(false);
                Some(Record::Event(self.events.len() as u32 - 1))
            }
            Shape::Block => {
                let block = self.block(heap, entries).ok()?;
                let i = self.blocks.push(block);
                self.block_placed.push(false);
                Some(Record::Block(i))
            }
            Shape::Other => None,
        }
    }

    fn frame(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Result<FrameId, Failure> {
        let (mut name, mut file, mut line) = (None, None, None);
        let mut extra = Vec::new();
        for &[k, v] in entries {
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match heap.key(k) {
                Key::Name => name = Some(str_handle(heap, v).map_err(wrap)?),
                Key::Filename => file = Some(str_handle(heap, v).map_err(wrap)?),
                // Negative lines do not occur; clamp rather than reject.
                Key::Line => {
                    line =
                        Some(u32::try_from(int(heap, v).map_err(wrap)?.max(0)).unwrap_or(u32::MAX))
                }
                _ => extra.push((key_text(heap, k), value_text(heap, v))),
            }
        }
        let name = name.ok_or_else(|| missing("name"))?;
        let file = file.ok_or_else(|| missing("filename"))?;
        let line = line.ok_or_else(|| missing("line"))?;
        if extra.is_empty() {
            return Ok(self.plain_frame(heap, name, file, line));
        }
        let new_id = self.next_frame_id();
        let frame = Frame {
            name: heap.str(name).into(),
            file: heap.str(file).into(),
            line,
            extra,
        };
        if let Some(&id) = self.other_frame_ids.get(&frame) {
            return Ok(id);
        }
        self.other_frame_ids.insert(frame.clone(), new_id);
        self.pending_frames
            .push(PendingFrame::Built(Box::new(frame)));
        Ok(new_id)
    }

    /// The id of the frame with no extra keys whose name and file are
    /// pickled strings `name` and `file`.
    pub(crate) fn plain_frame(&mut self, heap: &Heap, name: u32, file: u32, line: u32) -> FrameId {
        let new_id = self.next_frame_id();
        let key = (self.text_id(heap, name), self.text_id(heap, file), line);
        let id = *self.plain_frame_ids.entry(key).or_insert(new_id);
        if id == new_id {
            self.pending_frames
                .push(PendingFrame::Plain { name, file, line });
        }
        id
    }

    /// The id the next new frame gets.
    fn next_frame_id(&self) -> FrameId {
        (self.frames.len() + self.pending_frames.len()) as FrameId
    }

    /// Builds the frames still pending. While the pickle runs, a new frame is
    /// only noted (16 bytes); building them all in one go afterwards, away
    /// from the opcodes, costs less than building each as it is found: the
    /// snapviewer sample, with 3295 distinct frames, reads 3% faster.
    pub(crate) fn build_frames(&mut self, heap: &Heap) {
        if self.pending_frames.is_empty() {
            return;
        }
        self.frames
            .extend(self.pending_frames.drain(..).map(|pending| match pending {
                PendingFrame::Plain { name, file, line } => Frame {
                    name: heap.str(name).into(),
                    file: heap.str(file).into(),
                    line,
                    extra: Vec::new(),
                },
                PendingFrame::Built(frame) => *frame,
            }));
    }

    /// The id of pickled string `h`'s text: that of the first pickled string
    /// with the same text. PyTorch shares most frame strings through the
    /// memo, but not all, so frames are matched by text, not by string.
    #[inline(always)]
    fn text_id(&mut self, heap: &Heap, h: u32) -> u32 {
        match self.text_ids.get(h as usize) {
            Some(&id) if id != UNSEEN => id,
            _ => self.new_text_id(heap, h),
        }
    }

    /// [`Lowerer::text_id`] for a pickled string not seen before.
    #[cold]
    #[inline(never)]
    fn new_text_id(&mut self, heap: &Heap, h: u32) -> u32 {
        let text = heap.str(h);
        let hash = FxBuildHasher.hash_one(text);
        let (_, id) = *self
            .texts
            .entry(
                hash,
                |&(_, other)| same_text(heap.str(other), text),
                |&(hash, _)| hash,
            )
            .or_insert((hash, h))
            .get();
        if h as usize >= self.text_ids.len() {
            self.text_ids.resize(h as usize + 1, UNSEEN);
        }
        self.text_ids[h as usize] = id;
        id
    }

    /// Lowers list `id` to an interned stack if it is a non-empty list of
    /// lowered frames. Called whenever a list is built or grows; most lists
    /// in a snapshot are frame lists, and this keeps them from existing as
    /// lists of handles.
    pub(crate) fn lower_list(&mut self, heap: &mut Heap, id: u32) {
        let Container::List(items) = &heap.containers[id as usize] else {
            return;
        };
        let Some(stack) = self.frames_stack(heap, items) else {
            return;
        };
        heap.settle(id, Record::Stack(stack));
    }

    /// The interned stack of `items`, if they are all lowered frames (and
    /// there is at least one).
    fn frames_stack(&mut self, heap: &Heap, items: &[Val]) -> Option<StackId> {
        if items.is_empty() {
            return None;
        }
        self.scratch.clear();
        for &item in items {
            match item {
                Val::Frame(f) => self.scratch.push(f),
                Val::Obj(c) => match heap.containers[c as usize] {
                    Container::Frame(f) => self.scratch.push(f),
                    _ => return None,
                },
                _ => return None,
            }
        }
        Some(self.intern_scratch_stack())
    }

    /// Notes that `items` are being put into a list, and fails if one of them
    /// is a trace event or block dict already put into one: each appears once
    /// in a snapshot, and a file that refers to one many times through the
    /// memo is refused as it is read, before the references pile up.
    pub(crate) fn place(&mut self, heap: &Heap, items: &[Val]) -> Result<(), &'static str> {
        for &item in items {
            let (placed, what) = match item {
                Val::Event(i) => (&mut self.event_placed[i as usize], "trace event"),
                Val::Block(i) => (&mut self.block_placed[i as usize], "block"),
                Val::Obj(c) => match heap.containers[c as usize] {
                    Container::Event(i) => (&mut self.event_placed[i as usize], "trace event"),
                    Container::Block(i) => (&mut self.block_placed[i as usize], "block"),
                    _ => continue,
                },
                _ => continue,
            };
            if std::mem::replace(placed, true) {
                return Err(what);
            }
        }
        Ok(())
    }

    /// Adds `items` to list `id` without copying them into it, when the
    /// list stands for lowered records: frames into an empty list make a
    /// stack, and trace events or blocks that continue the list's run of
    /// them (or start one in an empty list) lengthen it. Says whether it did.
    pub(crate) fn fill_list(&mut self, heap: &mut Heap, id: u32, items: &[Val]) -> bool {
        let run = match heap.containers[id as usize] {
            Container::List(ref v) if v.is_empty() => None,
            Container::Events { start, len } => Some((Run::Events, start, len)),
            Container::Blocks { start, len } => Some((Run::Blocks, start, len)),
            _ => return false,
        };
        let kind = match (run, items.first()) {
            (Some((kind, ..)), _) => Some(kind),
            (None, Some(Val::Event(_))) => Some(Run::Events),
            (None, Some(Val::Block(_))) => Some(Run::Blocks),
            _ => None,
        };
        if let Some(kind) = kind
            && let Some((start, len)) = self.continued_run(kind, run.map(|(_, s, l)| (s, l)), items)
        {
            heap.containers[id as usize] = match kind {
                Run::Events => Container::Events { start, len },
                Run::Blocks => Container::Blocks { start, len },
            };
            return true;
        }
        if run.is_some() {
            return false;
        }
        match self.frames_stack(heap, items) {
            Some(stack) => {
                heap.settle(id, Record::Stack(stack));
                true
            }
            None => false,
        }
    }

    /// If `items` are the lowered records of `kind` that continue `run` (its
    /// start and length; none for an empty list), none of them put into a
    /// list yet: the run's start and length with them, and they are now
    /// placed.
    fn continued_run(
        &mut self,
        kind: Run,
        run: Option<(u32, u32)>,
        items: &[Val],
    ) -> Option<(u32, u32)> {
        let (record, placed): (fn(u32) -> Val, _) = match kind {
            Run::Events => (Val::Event, &mut self.event_placed),
            Run::Blocks => (Val::Block, &mut self.block_placed),
        };
        let first = match (kind, items.first()?) {
            (Run::Events, &Val::Event(i)) | (Run::Blocks, &Val::Block(i)) => i,
            _ => return None,
        };
        let (start, len) = run.unwrap_or((first, 0));
        let next = start.checked_add(len)?;
        let in_order = first == next
            && items
                .iter()
                .enumerate()
                .all(|(k, &v)| v == record(next.wrapping_add(k as u32)));
        let fresh = placed.get_mut(next as usize..next as usize + items.len())?;
        if !in_order || fresh.iter().any(|&p| p) {
            return None;
        }
        let len = len.checked_add(u32::try_from(items.len()).ok()?)?;
        fresh.fill(true);
        Some((start, len))
    }

    /// The interned stack of `frames`, which the machine read straight from
    /// a run of memo gets.
    pub(crate) fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        self.stacks.intern(frames, <[FrameId]>::to_vec)
    }

    /// Turns lowered stack `id` back into a list, because the pickle adds to it.
    pub(crate) fn unlower_list(&self, heap: &mut Heap, id: u32) {
        let items = match heap.containers[id as usize] {
            Container::Stack(stack) => self
                .stacks
                .get(stack)
                .iter()
                .map(|&f| Val::Frame(f))
                .collect(),
            Container::Events { start, len } => (start..start + len).map(Val::Event).collect(),
            Container::Blocks { start, len } => (start..start + len).map(Val::Block).collect(),
            _ => return,
        };
        heap.containers[id as usize] = Container::List(items);
    }

    fn intern_scratch_stack(&mut self) -> StackId {
        self.stacks
            .intern(self.scratch.as_slice(), <[FrameId]>::to_vec)
    }

    /// Converts a `frames` value (a list of frame dicts) to an interned stack;
    /// an empty list is no stack.
    pub(crate) fn stack(&mut self, heap: &Heap, v: Val) -> Result<Option<StackId>, Failure> {
        let expected = |item: Val| format!("expected a frame dict, found {}", describe(heap, item));
        let items = match v {
            Val::None => return Ok(None),
            Val::Stack(s) => return Ok(Some(s)),
            Val::Obj(id) => match &heap.containers[id as usize] {
                Container::Stack(s) => return Ok(Some(*s)),
                Container::List(items) | Container::Tuple(items) => items,
                _ => {
                    return Err(format!(
                        "expected a list of frames, found {}",
                        describe(heap, v)
                    ));
                }
            },
            other => {
                return Err(format!(
                    "expected a list of frames, found {}",
                    describe(heap, other)
                ));
            }
        };
        if items.is_empty() {
            return Ok(None);
        }
        let mut ids = Vec::with_capacity(items.len());
        for (i, &item) in items.iter().enumerate() {
            let id = match item {
                Val::Frame(f) => f,
                Val::Obj(c) => match &heap.containers[c as usize] {
                    Container::Frame(f) => *f,
                    Container::Dict(entries) => {
                        self.frame(heap, entries).map_err(|f| index(i, f))?
                    }
                    _ => return Err(index(i, expected(item))),
                },
                other => return Err(index(i, expected(other))),
            };
            ids.push(id);
        }
        self.scratch = ids;
        Ok(Some(self.intern_scratch_stack()))
    }

    /// Converts an event dict and adds it to the end of the event store; on
    /// failure the store is left as it was.
    fn add_event(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Result<(), Failure> {
        let event = self.event(heap, entries)?;
        self.events.push(event);
        Ok(())
    }

    /// Converts an event dict.
    ///
    /// Inlined into its callers so that the event's fields go from
    /// registers into the store's columns: built in memory and copied, its
    /// fields were read back by wide loads right after narrow stores, which
    /// stalls store forwarding.
    #[inline(always)]
    fn event(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Result<TraceEvent, Failure> {
        let mut e = BLANK_EVENT;
        let (mut has_action, mut has_size) = (false, false);
        for &[k, v] in entries {
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match heap.key(k) {
                Key::Action => {
                    e.action = self.action(heap, v).map_err(wrap)?;
                    has_action = true;
                }
                Key::Addr => e.address = u64_of(heap, v).map_err(wrap)?,
                Key::Size => {
                    e.size = u64_of(heap, v).map_err(wrap)?;
                    has_size = true;
                }
                Key::Stream => e.stream = i64_of(heap, v).map_err(wrap)?,
                Key::TimeUs => e.time_us = Some(i64_of(heap, v).map_err(wrap)?),
                Key::Frames => {
                    e.stack = match lowered_stack(heap, v) {
                        Some(stack) => Some(stack),
                        None => self.stack(heap, v).map_err(wrap)?,
                    }
                }
                Key::DeviceFree => {
                    let free = u64_of(heap, v).map_err(wrap)?;
                    e.details_mut().device_free = Some(free);
                }
                Key::CompileContext => {
                    let id = self.event_text(heap, v, EventText::CompileContext);
                    e.compile_context = Some(id.map_err(wrap)?)
                }
                Key::UserMetadata => {
                    let id = self.event_text(heap, v, EventText::UserMetadata);
                    e.user_metadata = Some(id.map_err(wrap)?)
                }
                Key::PoolId => {
                    let pool = pair_of(heap, v).map_err(wrap)?;
                    e.details_mut().pool_id = Some(pool);
                }
                _ => {
                    let value = self.value(heap, v, 1).map_err(wrap)?;
                    let extra = (key_text(heap, k), value);
                    e.details_mut().extra.push(extra);
                }
            }
        }
        if !has_action {
            return Err(missing("action"));
        }
        if !has_size {
            return Err(missing("size"));
        }
        Ok(e)
    }

    /// The action a string names, looked up once per pickled string object.
    fn action(&mut self, heap: &Heap, v: Val) -> Result<Action, Failure> {
        let text = str_of(heap, v)?;
        let Val::Str(heap_id) = v else {
            unreachable!("str_of accepted it")
        };
        let slot = heap_id as usize;
        if slot >= self.heap_actions.len() {
            self.heap_actions.resize(slot + 1, None);
        }
        Ok(self.heap_actions[slot]
            .get_or_insert_with(|| Action::from_name(text))
            .clone())
    }

    /// Interns the string of an event's text `field`. A pickled string seen
    /// before is known by its handle. A new one nearly always carries the
    /// field's last text (PyTorch writes `N/A` as a new pickled string each
    /// time), so a short compare with it usually saves hashing it, and
    /// noting its handle, which would not be seen again.
    fn event_text(&mut self, heap: &Heap, v: Val, field: EventText) -> Result<StrId, Failure> {
        let handle = str_handle(heap, v)?;
        if let Some(&id) = self.string_ids.get(handle as usize)
            && id != UNSEEN
        {
            return Ok(id);
        }
        let text = heap.str(handle);
        let last = &mut self.last_event_texts[field as usize];
        if let Some(id) = *last
            && same_text(self.strings.get(id), text)
        {
            return Ok(id);
        }
        let id = self.strings.intern(text, str::to_owned);
        *last = Some(id);
        if handle as usize >= self.string_ids.len() {
            self.string_ids.resize(handle as usize + 1, UNSEEN);
        }
        self.string_ids[handle as usize] = id;
        Ok(id)
    }

    /// A block dict, in the form it waits in for its segment.
    fn block(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Result<StoredBlock, Failure> {
        let mut b = StoredBlock {
            address: 0,
            size: 0,
            requested_size: 0,
            stack: None,
            state: BlockState::default(),
            has_address: false,
            rare: None,
        };
        let (mut has_size, mut has_state, mut has_requested) = (false, false, false);
        let (mut history, mut extra) = (ThinVec::new(), ThinVec::new());
        for &[k, v] in entries {
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match heap.key(k) {
                Key::Address => {
                    b.address = u64_of(heap, v).map_err(wrap)?;
                    b.has_address = true;
                }
                Key::Size => {
                    b.size = u64_of(heap, v).map_err(wrap)?;
                    has_size = true;
                }
                Key::RequestedSize => {
                    b.requested_size = u64_of(heap, v).map_err(wrap)?;
                    has_requested = true;
                }
                Key::State => {
                    let name = str_of(heap, v).map_err(wrap)?;
                    b.state = BlockState::from_name(name).ok_or_else(|| {
                        wrap(format!(
                            "unknown block state {}",
                            crate::visible::quoted(name)
                        ))
                    })?;
                    has_state = true;
                }
                Key::Frames => b.stack = self.stack(heap, v).map_err(wrap)?,
                Key::History => {
                    for (i, &h) in items(heap, v).map_err(wrap)?.iter().enumerate() {
                        let entry = self
                            .history(heap, h)
                            .map_err(|f| at("history", index(i, f)))?;
                        history.push(entry);
                    }
                }
                _ => {
                    let value = self.value(heap, v, 1).map_err(wrap)?;
                    extra.push((key_text(heap, k), value));
                }
            }
        }
        if !has_size {
            return Err(missing("size"));
        }
        if !has_state {
            return Err(missing("state"));
        }
        // Old files: the request and the stack live in the first history entry.
        if let Some(first) = history.first() {
            if !has_requested {
                b.requested_size = first.real_size;
            }
            if b.stack.is_none() {
                b.stack = first.stack;
            }
        } else if !has_requested {
            b.requested_size = b.size;
        }
        if !history.is_empty() || !extra.is_empty() {
            b.rare = Some(Box::new((history, extra)));
        }
        Ok(b)
    }

    fn history(&mut self, heap: &Heap, v: Val) -> Result<HistoryEntry, Failure> {
        let mut h = HistoryEntry::default();
        for &[k, v] in entries(heap, v)? {
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match heap.key(k) {
                Key::Addr => h.address = u64_of(heap, v).map_err(wrap)?,
                Key::RealSize => h.real_size = u64_of(heap, v).map_err(wrap)?,
                Key::Frames => h.stack = self.stack(heap, v).map_err(wrap)?,
                _ => {
                    let value = self.value(heap, v, 1).map_err(wrap)?;
                    h.extra.push((key_text(heap, k), value));
                }
            }
        }
        Ok(h)
    }

    /// Takes the lowered block behind `v`, or converts a generic block dict.
    pub(crate) fn take_block(&mut self, heap: &Heap, v: Val) -> Result<(Block, bool), Failure> {
        let mut take = |i: u32| {
            self.blocks
                .take(i)
                .map(StoredBlock::into_block)
                .ok_or_else(|| ": the same block dict appears twice".to_owned())
        };
        match v {
            Val::Block(i) => take(i),
            Val::Obj(id) => match &heap.containers[id as usize] {
                Container::Block(i) => take(*i),
                Container::Dict(entries) => self.block(heap, entries).map(StoredBlock::into_block),
                _ => Err(format!(
                    ": expected a block dict, found {}",
                    describe(heap, v)
                )),
            },
            other => Err(format!(
                ": expected a block dict, found {}",
                describe(heap, other)
            )),
        }
    }

    /// Lowers a segment dict whose `entries` are all there is of it (as
    /// PyTorch writes each: its fields, then its list of blocks, each block
    /// lowered already) into the segment store, and returns its index. Its
    /// blocks are taken at once, while they and the dict are in cache: made
    /// after the parse, a million blocks' segments took a quarter of a
    /// large file's reading. Anything else is left to the schema pass to
    /// convert or to report, with nothing taken.
    pub(crate) fn lower_segment(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Option<u32> {
        if !entries.iter().any(|&[k, _]| heap.key(k) == Key::Blocks) {
            return None;
        }
        let (mut segment, _, blocks) = self.segment_fields(heap, entries, false).ok()?;
        if !blocks.iter().all(|&b| self.untaken_block(heap, b)) {
            return None;
        }
        self.take_segment_blocks(heap, &mut segment, &blocks).ok()?;
        self.segments.push(segment);
        self.segment_taken.push(false);
        Some(self.segments.len() as u32 - 1)
    }

    /// Whether `v` is a lowered block still in the store.
    fn untaken_block(&self, heap: &Heap, v: Val) -> bool {
        let i = match v {
            Val::Block(i) => i,
            Val::Obj(id) => match heap.containers[id as usize] {
                Container::Block(i) => i,
                _ => return false,
            },
            _ => return false,
        };
        self.blocks.get(i).is_some()
    }

    /// Lowered segment `i`: taken out of the store, or with `keep` copied,
    /// the store keeping it for other readers of its dict. `host` makes it
    /// the pinned host allocator's, whatever device it named.
    pub(crate) fn lowered_segment(
        &mut self,
        i: u32,
        host: bool,
        keep: bool,
    ) -> Result<Segment, Failure> {
        let i = i as usize;
        if self.segment_taken.get(i) != Some(&false) {
            return Err(": the same segment dict appears twice".to_owned());
        }
        let mut segment = if keep {
            self.segments[i].clone()
        } else {
            self.segment_taken[i] = true;
            std::mem::take(&mut self.segments[i])
        };
        if host {
            segment.device = PINNED_HOST_DEVICE;
        }
        Ok(segment)
    }

    /// All the lowered segments, if `items`, a list of segments, holds them
    /// all in order, none taken or held anywhere else: PyTorch's segment
    /// list, moved out whole rather than copied segment by segment.
    pub(crate) fn take_segment_run(&mut self, heap: &Heap, items: &[Val]) -> Option<Vec<Segment>> {
        if items.len() != self.segments.len() || self.segment_taken.iter().any(|&t| t) {
            return None;
        }
        let in_order = items.iter().enumerate().all(|(k, &v)| match v {
            Val::Obj(id) => {
                matches!(heap.containers[id as usize], Container::Segment(i) if i as usize == k)
                    && heap.unshared(v)
            }
            _ => false,
        });
        if !in_order {
            return None;
        }
        self.segment_taken.fill(true);
        Some(std::mem::take(&mut self.segments))
    }

    /// The fields of a segment dict of `entries`, all but its blocks; the
    /// handle of its list of blocks, and the list's items. `host`: the
    /// pinned host allocator's segment, one device whatever it says.
    pub(crate) fn segment_fields<'h>(
        &mut self,
        heap: &'h Heap,
        entries: &[[Val; 2]],
        host: bool,
    ) -> Result<(Segment, Val, std::borrow::Cow<'h, [Val]>), Failure> {
        let mut seg = Segment::default();
        if host {
            seg.device = PINNED_HOST_DEVICE;
        }
        let mut pool = None;
        let (mut has_address, mut has_total) = (false, false);
        let mut block_vals = std::borrow::Cow::Borrowed(&[][..]);
        let mut blocks = Val::None;
        for &[k, v] in entries {
            // Matched as the file spells it; the key's text for messages and
            // `extra` is made only where needed (a segment has a dozen keys).
            let field = match k {
                Val::Str(id) => heap.str(id),
                _ => "",
            };
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match field {
                // The host allocator's segments are one device, whatever they say.
                "device" if host => {}
                "device" => seg.device = u32_of(heap, v).map_err(wrap)?,
                "address" => {
                    seg.address = u64_of(heap, v).map_err(wrap)?;
                    has_address = true;
                }
                "total_size" => {
                    seg.total_size = u64_of(heap, v).map_err(wrap)?;
                    has_total = true;
                }
                "stream" => seg.stream = i64_of(heap, v).map_err(wrap)?,
                "segment_type" => {
                    let name = str_of(heap, v).map_err(wrap)?;
                    pool = Some(Pool::from_name(name).ok_or_else(|| {
                        wrap(format!(
                            "unknown segment type {}",
                            crate::visible::quoted(name)
                        ))
                    })?);
                }
                "segment_pool_id" => seg.pool_id = pair_of(heap, v).map_err(wrap)?,
                "is_expandable" => seg.is_expandable = bool_of(heap, v).map_err(wrap)?,
                "frames" => seg.stack = self.stack(heap, v).map_err(wrap)?,
                "blocks" => {
                    block_vals = items(heap, v).map_err(wrap)?;
                    blocks = v;
                }
                "allocated_size" => seg.allocated_size = Some(u64_of(heap, v).map_err(wrap)?),
                "active_size" => seg.active_size = Some(u64_of(heap, v).map_err(wrap)?),
                "requested_size" => seg.requested_size = Some(u64_of(heap, v).map_err(wrap)?),
                _ => {
                    let value = self.value(heap, v, 1).map_err(wrap)?;
                    seg.extra.push((key_text(heap, k), value));
                }
            }
        }
        if !has_address {
            return Err(": missing 'address'".to_owned());
        }
        if !has_total {
            return Err(": missing 'total_size'".to_owned());
        }
        seg.pool = pool.unwrap_or(if seg.total_size <= SMALL_SEGMENT_SIZE {
            Pool::Small
        } else {
            Pool::Large
        });
        Ok((seg, blocks, block_vals))
    }

    /// Moves the blocks `items` into `seg`, giving those without an address
    /// (older files leave it out) the one after the block before, as
    /// PyTorch's viewer does.
    pub(crate) fn take_segment_blocks(
        &mut self,
        heap: &Heap,
        seg: &mut Segment,
        items: &[Val],
    ) -> Result<(), Failure> {
        let mut next_address = seg.address;
        seg.blocks.reserve_exact(items.len());
        for (i, &b) in items.iter().enumerate() {
            let (mut block, has_address) = self
                .take_block(heap, b)
                .map_err(|f| at("blocks", index(i, f)))?;
            if !has_address {
                block.address = next_address;
            }
            next_address = block.address.wrapping_add(block.size);
            seg.blocks.push(block);
        }
        Ok(())
    }

    /// Takes the lowered event behind `v`, or converts a generic event dict.
    pub(crate) fn take_event(&mut self, heap: &Heap, v: Val) -> Result<TraceEvent, Failure> {
        // An event moved out with a whole tail of events is past the end of
        // `event_taken`: taken too.
        let mut take = |i: u32| match self.event_taken.get_mut(i as usize) {
            Some(taken) if !*taken => {
                *taken = true;
                Ok(self.events.get(i as usize).expect("a lowered event"))
            }
            _ => Err(": the same trace event dict appears twice".to_owned()),
        };
        match v {
            Val::Event(i) => take(i),
            Val::Obj(id) => match &heap.containers[id as usize] {
                Container::Event(i) => take(*i),
                Container::Dict(entries) => self.event(heap, entries),
                _ => Err(format!(
                    ": expected a trace event dict, found {}",
                    describe(heap, v)
                )),
            },
            other => Err(format!(
                ": expected a trace event dict, found {}",
                describe(heap, other)
            )),
        }
    }

    /// The lowered events `start..` as one vector, if list `items` refers to
    /// exactly them in order. This is the common case (PyTorch writes each
    /// device's events in order, one device after another) and it moves the
    /// events without copying them one by one.
    pub(crate) fn take_event_tail(&mut self, heap: &Heap, items: &[Val]) -> Option<Events> {
        let start = self.events.len().checked_sub(items.len())?;
        let in_order = items.iter().enumerate().all(|(k, &v)| {
            let i = match v {
                Val::Event(i) => i,
                Val::Obj(id) => match heap.containers[id as usize] {
                    Container::Event(i) => i,
                    _ => return false,
                },
                _ => return false,
            };
            i as usize == start + k
        });
        if !in_order {
            return None;
        }
        self.take_events_from(start)
    }

    /// The lowered events of run `start..start + len` as one vector, when
    /// they are the tail of the store (as PyTorch writes them) and none was
    /// taken yet; see [`Lowerer::take_event_tail`].
    pub(crate) fn take_event_run(&mut self, start: u32, len: u32) -> Option<Events> {
        let start = start as usize;
        (start + len as usize == self.events.len())
            .then(|| self.take_events_from(start))
            .flatten()
    }

    /// Moves the lowered events from `start` on out of the store, if none
    /// was taken yet.
    fn take_events_from(&mut self, start: usize) -> Option<Events> {
        if self.event_taken[start..].iter().any(|&t| t) {
            return None;
        }
        self.event_taken.truncate(start);
        Some(if start == 0 {
            std::mem::take(&mut self.events)
        } else {
            self.events.split_off(start)
        })
    }

    /// Converts any value to a generic [`Value`], for keys without a schema.
    pub(crate) fn value(&mut self, heap: &Heap, v: Val, depth: usize) -> Result<Value, Failure> {
        if depth > MAX_DEPTH {
            return Err(format!(": values nested deeper than {MAX_DEPTH} levels"));
        }
        self.build_frames(heap);
        self.charge(std::mem::size_of::<Value>())?;
        let value = match v {
            Val::Unset | Val::None => Value::None,
            Val::Bool(b) => Value::Bool(b),
            Val::Int(i) => Value::Int(i.into()),
            Val::Big(b) => Value::Int(heap.bigs[b as usize]),
            Val::Float(f) => Value::Float(f),
            Val::Str(id) => {
                self.charge(heap.str(id).len())?;
                Value::Str(heap.str(id).to_owned())
            }
            Val::Bytes(id) => {
                self.charge(heap.bytes[id as usize].len())?;
                Value::Bytes(heap.bytes[id as usize].to_vec())
            }
            Val::Frame(f) => self.charged(frame_value(&self.frames[f as usize]))?,
            Val::Event(i) => self.charged_event(i)?,
            Val::Block(i) => self.charged_block(i)?,
            Val::Stack(s) => self.charged(self.stack_value(Some(s)))?,
            Val::Obj(id) => match &heap.containers[id as usize] {
                Container::List(items) | Container::Tuple(items) | Container::Set(items) => {
                    let mut out = Vec::with_capacity(items.len());
                    for (i, &item) in items.iter().enumerate() {
                        out.push(self.value(heap, item, depth + 1).map_err(|f| index(i, f))?);
                    }
                    Value::List(out)
                }
                Container::Dict(entries) => {
                    let mut out = Vec::with_capacity(entries.len());
                    for &[k, item] in entries {
                        let key = key_text(heap, k);
                        self.charge(std::mem::size_of::<String>() + key.len())?;
                        let value = self.value(heap, item, depth + 1).map_err(|f| at(&key, f))?;
                        out.push((key, value));
                    }
                    Value::Map(out)
                }
                Container::Frame(f) => self.charged(frame_value(&self.frames[*f as usize]))?,
                Container::Stack(s) => self.charged(self.stack_value(Some(*s)))?,
                Container::Event(i) => self.charged_event(*i)?,
                &Container::Events { start, len } => {
                    let mut out = Vec::with_capacity(len as usize);
                    for (k, i) in (start..start + len).enumerate() {
                        out.push(self.charged_event(i).map_err(|f| index(k, f))?);
                    }
                    Value::List(out)
                }
                Container::Block(i) => self.charged_block(*i)?,
                &Container::Blocks { start, len } => {
                    let mut out = Vec::with_capacity(len as usize);
                    for (k, i) in (start..start + len).enumerate() {
                        out.push(self.charged_block(i).map_err(|f| index(k, f))?);
                    }
                    Value::List(out)
                }
                Container::Segment(i) => self.charged_segment(*i)?,
                Container::Read => {
                    return Err(": the same segment dict or block list appears twice".to_owned());
                }
            },
        };
        Ok(value)
    }

    /// Lowered event `i` back as a generic value, its size taken from the budget.
    fn charged_event(&mut self, i: u32) -> Result<Value, Failure> {
        match self.event_taken.get(i as usize) {
            Some(false) => {
                let event = self.events.get(i as usize).expect("a lowered event");
                self.charged(self.event_value(&event))
            }
            _ => Err(": the same trace event dict appears twice".to_owned()),
        }
    }

    /// Lowered block `i` back as a generic value, its size taken from the budget.
    fn charged_block(&mut self, i: u32) -> Result<Value, Failure> {
        match self.blocks.get(i) {
            Some(b) => self.charged(self.block_value(b)),
            None => Err(": the same block dict appears twice".to_owned()),
        }
    }

    /// Lowered segment `i` back as a generic value, its size taken from the budget.
    fn charged_segment(&mut self, i: u32) -> Result<Value, Failure> {
        match self.segment_taken.get(i as usize) {
            Some(false) => self.charged(self.segment_value(&self.segments[i as usize])),
            _ => Err(": the same segment dict appears twice".to_owned()),
        }
    }

    /// Takes `bytes` from the budget of generic values; see
    /// [`Lowerer::value_budget`].
    fn charge(&mut self, bytes: usize) -> Result<(), Failure> {
        self.value_budget = self.value_budget.checked_sub(bytes).ok_or_else(|| {
            ": the pickle expands to far more values than its size allows (shared containers?)"
                .to_owned()
        })?;
        Ok(())
    }

    /// `value`, a record converted back to a generic value, once its size
    /// is taken from the budget. (One record's value is small; it is a record
    /// shared a million times over that the budget stops.)
    fn charged(&mut self, value: Value) -> Result<Value, Failure> {
        self.charge(value.approx_size() - std::mem::size_of::<Value>())?;
        Ok(value)
    }

    fn stack_value(&self, stack: Option<StackId>) -> Value {
        let ids: &[FrameId] = stack.map_or(&[], |s| self.stacks.get(s));
        Value::List(
            ids.iter()
                .map(|&f| frame_value(&self.frames[f as usize]))
                .collect(),
        )
    }

    /// A lowered event found where the schema has no place for one, back in PyTorch's form.
    fn event_value(&self, ev: &TraceEvent) -> Value {
        let mut m = vec![
            ("action".to_owned(), Value::Str(ev.action.name().to_owned())),
            ("addr".to_owned(), Value::Int(ev.address.into())),
            ("size".to_owned(), Value::Int(ev.size.into())),
            ("stream".to_owned(), Value::Int(ev.stream.into())),
        ];
        if let Some(t) = ev.time_us {
            m.push(("time_us".to_owned(), Value::Int(t.into())));
        }
        if ev.stack.is_some() {
            m.push(("frames".to_owned(), self.stack_value(ev.stack)));
        }
        if let Some(d) = &ev.details {
            m.extend(d.extra.iter().cloned());
        }
        Value::Map(m)
    }

    /// A lowered block found where the schema has no place for one, back in PyTorch's form.
    fn block_value(&self, b: &StoredBlock) -> Value {
        let extra = b.rare.as_ref().map_or(&[][..], |rare| &rare.1[..]);
        let fields = (b.address, b.size, b.requested_size, b.state, b.stack);
        self.block_fields_value(fields, extra)
    }

    /// A block's address, size, requested size, state and stack, and its
    /// keys the model has no field for, in PyTorch's form.
    fn block_fields_value(
        &self,
        (address, size, requested_size, state, stack): (u64, u64, u64, BlockState, Option<StackId>),
        extra: &[(String, Value)],
    ) -> Value {
        let mut m = vec![
            ("address".to_owned(), Value::Int(address.into())),
            ("size".to_owned(), Value::Int(size.into())),
            (
                "requested_size".to_owned(),
                Value::Int(requested_size.into()),
            ),
            ("state".to_owned(), Value::Str(state.name().to_owned())),
            ("frames".to_owned(), self.stack_value(stack)),
        ];
        m.extend(extra.iter().cloned());
        Value::Map(m)
    }

    /// A lowered segment found where the schema has no place for one, back
    /// in PyTorch's form.
    fn segment_value(&self, s: &Segment) -> Value {
        let int = |i: i128| Value::Int(i);
        let blocks = s.blocks.iter().map(|b| {
            let fields = (b.address, b.size, b.requested_size, b.state, b.stack);
            self.block_fields_value(fields, &b.extra)
        });
        let mut m = vec![
            ("device".to_owned(), int(s.device.into())),
            ("address".to_owned(), int(s.address.into())),
            ("total_size".to_owned(), int(s.total_size.into())),
            ("stream".to_owned(), int(s.stream.into())),
            (
                "segment_type".to_owned(),
                Value::Str(s.pool.name().to_owned()),
            ),
            (
                "segment_pool_id".to_owned(),
                Value::List(vec![int(s.pool_id.0.into()), int(s.pool_id.1.into())]),
            ),
            ("is_expandable".to_owned(), Value::Bool(s.is_expandable)),
            ("frames".to_owned(), self.stack_value(s.stack)),
            ("blocks".to_owned(), Value::List(blocks.collect())),
        ];
        for (key, size) in [
            ("allocated_size", s.allocated_size),
            ("active_size", s.active_size),
            ("requested_size", s.requested_size),
        ] {
            m.extend(size.map(|size| (key.to_owned(), int(size.into()))));
        }
        m.extend(s.extra.iter().cloned());
        Value::Map(m)
    }
}

/// A lowered block while it waits in [`BlockStore`] for its segment: 48
/// bytes, where a [`Block`] takes 72 (its sequence number and two list
/// headers). On a file of a million blocks that is 24 MB less at the peak,
/// which comes at the end of the parse with every block in the store.
struct StoredBlock {
    address: u64,
    size: u64,
    requested_size: u64,
    stack: Option<StackId>,
    state: BlockState,
    /// Whether the dict had an `address` (older files leave it out).
    has_address: bool,
    /// An old file's `history` and keys the model has no field for.
    rare: Option<Box<RareBlockFields>>,
}

/// A block's `history` (old files) and the keys the model has no field for.
type RareBlockFields = (ThinVec<HistoryEntry>, ThinVec<(String, Value)>);

impl StoredBlock {
    /// The model's block, and whether the dict had an `address`.
    fn into_block(self) -> (Block, bool) {
        let (history, extra) = self.rare.map(|rare| *rare).unwrap_or_default();
        let block = Block {
            address: self.address,
            size: self.size,
            requested_size: self.requested_size,
            state: self.state,
            stack: self.stack,
            alloc_seq: None,
            history,
            extra,
        };
        (block, self.has_address)
    }
}

/// A chunk of [`BlockStore`]: each block until it is taken.
type BlockChunk = Vec<Option<StoredBlock>>;

/// Blocks in a chunk of [`BlockStore`]: 128 Ki of them, 6 MiB, an allocation
/// large enough that the allocator hands it back to the system when freed.
const BLOCK_CHUNK: usize = 1 << 17;

/// Lowered blocks, by index, in chunks freed once every block in them has
/// been taken. Segments take their blocks in the order the pickle gave them,
/// so while the segments are built each block is held once, in the store or
/// in its segment, rather than twice (on a file of a million blocks, 95 MB
/// of the peak). A segment lowered as the pickle runs takes its blocks at
/// once, and the chunk it empties is kept to be filled again: memory that
/// is touched for the first time costs a page fault every 4 KiB.
#[derive(Default)]
struct BlockStore {
    /// `None` once every block in it has been taken.
    chunks: Vec<Option<BlockChunk>>,
    /// Blocks taken from each chunk.
    taken: Vec<usize>,
    /// A whole chunk emptied, for the next chunk to reuse.
    spare: Option<BlockChunk>,
}

impl BlockStore {
    /// Adds a block; returns its index.
    fn push(&mut self, block: StoredBlock) -> u32 {
        let full = |c: &Option<Vec<_>>| c.as_ref().is_none_or(|c| c.len() == BLOCK_CHUNK);
        if self.chunks.last().is_none_or(full) {
            // The first chunk grows as a small file needs; later ones are
            // whole from the start, so a large file copies none.
            let chunk = match self.spare.take() {
                Some(spare) => spare,
                None if self.chunks.is_empty() => Vec::new(),
                None => Vec::with_capacity(BLOCK_CHUNK),
            };
            self.chunks.push(Some(chunk));
            self.taken.push(0);
        }
        let index = (self.chunks.len() - 1) * BLOCK_CHUNK;
        let chunk = self
            .chunks
            .last_mut()
            .and_then(Option::as_mut)
            .expect("pushed above");
        chunk.push(Some(block));
        (index + chunk.len() - 1) as u32
    }

    /// Block `i`, unless taken.
    fn get(&self, i: u32) -> Option<&StoredBlock> {
        let i = i as usize;
        self.chunks
            .get(i / BLOCK_CHUNK)?
            .as_ref()?
            .get(i % BLOCK_CHUNK)?
            .as_ref()
    }

    /// Takes block `i` (`None` when taken before); frees its chunk when it
    /// was the chunk's last.
    fn take(&mut self, i: u32) -> Option<StoredBlock> {
        let (c, i) = (i as usize / BLOCK_CHUNK, i as usize % BLOCK_CHUNK);
        let chunk = self.chunks.get_mut(c)?.as_mut()?;
        let block = chunk.get_mut(i)?.take()?;
        self.taken[c] += 1;
        if self.taken[c] == BLOCK_CHUNK
            && let Some(mut emptied) = self.chunks[c].take()
            && emptied.capacity() == BLOCK_CHUNK
        {
            emptied.clear();
            self.spare = Some(emptied);
        }
        Some(block)
    }
}

/// The stack that `v` was lowered to, if it is one: the common case of
/// [`Lowerer::stack`], inlined so that its answer need not go through memory.
#[inline(always)]
fn lowered_stack(heap: &Heap, v: Val) -> Option<StackId> {
    match v {
        Val::Stack(stack) => Some(stack),
        Val::Obj(id) => match heap.containers[id as usize] {
            Container::Stack(stack) => Some(stack),
            _ => None,
        },
        _ => None,
    }
}

fn frame_value(f: &Frame) -> Value {
    let mut m = vec![
        ("name".to_owned(), Value::Str(f.name.to_string())),
        ("filename".to_owned(), Value::Str(f.file.to_string())),
        ("line".to_owned(), Value::Int(f.line.into())),
    ];
    m.extend(
        f.extra
            .iter()
            .map(|(k, v)| (k.clone(), Value::Str(v.clone()))),
    );
    Value::Map(m)
}

/// A short text form of a scalar, for frame fields that are not strings.
fn value_text(heap: &Heap, v: Val) -> String {
    match v {
        Val::Str(id) => heap.str(id).to_owned(),
        other => key_text(heap, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the store is for: a block waiting for its segment takes at most
    /// two thirds of the model's block (48 bytes against 72), so the parse's
    /// peak holds a third less.
    #[test]
    fn a_stored_block_takes_at_most_two_thirds_of_a_model_block() {
        let stored = std::mem::size_of::<Option<StoredBlock>>();
        let model = std::mem::size_of::<Block>();
        assert!(stored * 3 <= model * 2, "{stored} bytes against {model}");
    }
}
