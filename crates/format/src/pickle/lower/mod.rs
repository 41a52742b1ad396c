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

mod frames;
mod records;
mod values;

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
    /// Bytes of frame names and files (and extra keys) still allowed to be
    /// made: distinct frames that share one long string through the memo
    /// copy it each, so a small file could make gigabytes of them. Real
    /// files make a tenth of their size or less.
    frame_text_budget: usize,
    /// Text of the frames noted since they were last built, charged to
    /// [`Lowerer::frame_text_budget`] when they are.
    pending_frame_text: usize,
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

/// A snapshot's frame, stack and string tables.
pub(crate) type Tables = (Vec<Frame>, Vec<Vec<FrameId>>, Vec<String>);

impl Lowerer {
    /// The frame, stack and string tables, for the snapshot.
    pub(crate) fn into_tables(mut self, heap: &Heap) -> Result<Tables, Failure> {
        self.build_frames(heap)?;
        // The table was reserved generously. Shrinking copies it, which is
        // worth it only when most of it went unused.
        if self.frames.capacity() > 2 * self.frames.len() {
            self.frames.shrink_to_fit();
        }
        Ok((
            self.frames,
            self.stacks.into_items(),
            self.strings.into_items(),
        ))
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
            frame_text_budget: 16 * len + (4 << 20),
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
