//! The values a pickle builds, and reading them as the types a snapshot
//! needs.
//!
//! The machine (`machine.rs`) pushes [`Val`] handles and fills the [`Heap`]
//! behind them; the lowerer (`lower.rs`) and the schema pass (`mod.rs`) read
//! them back through the typed reads here (`u64_of`, `str_of`, `items`, ...),
//! whose failures carry the path to the bad field.

use std::borrow::Cow;

/// A handle to a value on the stack, in the memo or inside a container.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Val {
    /// A memo slot that was never written.
    Unset,
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits: index into [`Heap::bigs`].
    Big(u32),
    Float(f64),
    /// Index into [`Heap::strings`].
    Str(u32),
    /// Index into [`Heap::bytes`].
    Bytes(u32),
    /// Index into [`Heap::containers`]; lists, tuples, sets and dicts.
    Obj(u32),
    /// A frame dict already lowered: the frame's id in the lowerer's table.
    /// Stands in for the dict's [`Val::Obj`] on the stack and in the memo, so
    /// that the frame lists referring to it need not look the dict up.
    Frame(u32),
    /// A trace-event dict already lowered: the event's index in the
    /// lowerer's store. Like the two below, it stands in for the container's
    /// [`Val::Obj`] where the machine can find every handle, so that the
    /// container can be freed: a long trace would otherwise keep one or two
    /// containers per event.
    Event(u32),
    /// A block dict already lowered: the block's index in the lowerer's store.
    Block(u32),
    /// A list of frames that was a record's `frames` when the record was
    /// complete: the interned stack. (Two such lists with the same frames
    /// are the same stand-in; they can no longer change, so they read the
    /// same.)
    Stack(u32),
}

/// A container, or the typed record a completed dict was lowered to.
#[derive(Debug)]
pub(crate) enum Container {
    List(Vec<Val>),
    Tuple(Vec<Val>),
    Set(Vec<Val>),
    Dict(Vec<[Val; 2]>),
    /// A frame dict, now an index into the lowerer's frame table.
    Frame(u32),
    /// A list of frame dicts, now an index into the lowerer's stack table.
    Stack(u32),
    /// A trace-event dict, now an index into the lowerer's event store.
    Event(u32),
    /// A block dict, now an index into the lowerer's block store.
    Block(u32),
    /// A list of `len` lowered trace events, the lowerer's events from
    /// `start` on, in order: a device's trace as PyTorch writes it, held
    /// without a handle per event.
    Events {
        start: u32,
        len: u32,
    },
    /// A list of `len` lowered blocks, the lowerer's blocks from `start` on,
    /// in order: a segment's blocks as PyTorch writes them.
    Blocks {
        start: u32,
        len: u32,
    },
    /// A segment dict, now an index into the lowerer's segment store, its
    /// blocks taken into it.
    Segment(u32),
    /// A container already read into the snapshot through its only handle
    /// and freed (see [`Heap::free_read`]).
    Read,
}

/// A typed record that a container was lowered to; see [`Heap::settle`].
#[derive(Clone, Copy)]
pub(crate) enum Record {
    Frame(u32),
    Stack(u32),
    Event(u32),
    Block(u32),
}

/// The dict keys of PyTorch's schema, recognised once per string so that
/// records are matched by a byte compare rather than a string compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    Other,
    Action,
    Addr,
    Address,
    Blocks,
    CompileContext,
    DeviceFree,
    Filename,
    /// Anomaly mode's forward stacks: kept among the extra keys, joined
    /// to the stacks after the read (`forward.rs`).
    ForwardFrames,
    Frames,
    History,
    Line,
    Name,
    PoolId,
    RealSize,
    RequestedSize,
    Size,
    State,
    Stream,
    TimeUs,
    UserMetadata,
}

impl Key {
    pub(super) fn classify(s: &str) -> Key {
        match s {
            "action" => Key::Action,
            "addr" => Key::Addr,
            "address" => Key::Address,
            "blocks" => Key::Blocks,
            "compile_context" => Key::CompileContext,
            "device_free" => Key::DeviceFree,
            "filename" => Key::Filename,
            "forward_frames" => Key::ForwardFrames,
            "frames" => Key::Frames,
            "history" => Key::History,
            "line" => Key::Line,
            "name" => Key::Name,
            "pool_id" => Key::PoolId,
            "real_size" => Key::RealSize,
            "requested_size" => Key::RequestedSize,
            "size" => Key::Size,
            "state" => Key::State,
            "stream" => Key::Stream,
            "time_us" => Key::TimeUs,
            "user_metadata" => Key::UserMetadata,
            _ => Key::Other,
        }
    }
}

/// The keys of a frame dict, in the order PyTorch writes them.
pub(super) const FRAME_KEYS: [Key; 3] = [Key::Name, Key::Filename, Key::Line];

/// Where the memo holds a container, as far as the machine knows: so that
/// a dict lowered to a record can be freed once the machine has put the
/// record in place of the only handles to it (see `Machine::record_in_place_of`).
///
/// Handles to a container are copied only by memo writes, memo reads and
/// DUP; a container copied by a read or a DUP, or memoized twice, may have
/// handles anywhere and is [`MemoRef::SHARED`] for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoRef(u32);

impl MemoRef {
    /// Never memoized or copied: the one handle is where it was made.
    pub(crate) const NONE: MemoRef = MemoRef(u32::MAX);
    /// Handles may be anywhere.
    pub(crate) const SHARED: MemoRef = MemoRef(u32::MAX - 1);

    /// The memo slot holding the container's only other handle, if that is
    /// all there is.
    pub(crate) fn slot(self) -> Option<usize> {
        (self.0 < MemoRef::SHARED.0).then_some(self.0 as usize)
    }

    /// The reference after the container is memoized in `slot`.
    fn memoized(self, slot: usize) -> MemoRef {
        match u32::try_from(slot) {
            Ok(slot) if self == MemoRef::NONE && slot < MemoRef::SHARED.0 => MemoRef(slot),
            _ => MemoRef::SHARED,
        }
    }
}

/// How many emptied dict and list vectors to keep for reuse.
const MAX_SPARE: usize = 64;

/// Storage behind [`Val`] handles.
#[derive(Default)]
pub(crate) struct Heap<'a> {
    pub(crate) strings: Vec<Cow<'a, str>>,
    /// The schema key each string spells, if any; parallel to `strings`.
    pub(super) keys: Vec<Key>,
    /// Emptied entry vectors of lowered dicts, reused by the next EMPTY_DICT.
    pub(crate) spare_dicts: Vec<Vec<[Val; 2]>>,
    /// Emptied item vectors of lowered lists, reused by the next EMPTY_LIST.
    pub(crate) spare_lists: Vec<Vec<Val>>,
    pub(crate) bytes: Vec<&'a [u8]>,
    pub(crate) bigs: Vec<i128>,
    pub(crate) containers: Vec<Container>,
    /// Where the memo holds each container; parallel to `containers`.
    memo_refs: Vec<MemoRef>,
    /// Strings of the file that were not UTF-8, kept with U+FFFD in place
    /// of their bad bytes.
    pub(crate) not_utf8: usize,
    /// Whether a string of the file spells `forward_frames`: only then can
    /// a record carry forward stacks to join, and the walk over every block
    /// that looks for them (11 ms of a million blocks) is worth making.
    pub(crate) forward_frames: bool,
}

impl<'a> Heap<'a> {
    /// Adds the string `s`, its schema key recognised, and returns its id.
    pub(crate) fn push_str(&mut self, s: Cow<'a, str>) -> u32 {
        let key = Key::classify(&s);
        self.forward_frames |= key == Key::ForwardFrames;
        self.keys.push(key);
        self.strings.push(s);
        self.strings.len() as u32 - 1
    }

    pub(crate) fn str(&self, id: u32) -> &str {
        &self.strings[id as usize]
    }

    /// The schema key that `k` spells, or [`Key::Other`].
    pub(crate) fn key(&self, k: Val) -> Key {
        match k {
            Val::Str(id) => self.keys[id as usize],
            _ => Key::Other,
        }
    }

    /// Puts `record` in place of container `id`, which it was lowered from,
    /// keeping the dict's or list's vector for the next EMPTY_DICT or
    /// EMPTY_LIST.
    ///
    /// Takes the small [`Record`] rather than a [`Container`]: a container
    /// built by the caller and copied in is read back by wide loads from
    /// narrow stores, which stalls store forwarding on every lowered dict
    /// (measured with `perf annotate`: a third of the caller's time).
    pub(crate) fn settle(&mut self, id: u32, record: Record) {
        let slot = &mut self.containers[id as usize];
        match slot {
            Container::Dict(entries) if self.spare_dicts.len() < MAX_SPARE => {
                let mut spare = std::mem::take(entries);
                spare.clear();
                self.spare_dicts.push(spare);
            }
            Container::List(items) if self.spare_lists.len() < MAX_SPARE => {
                let mut spare = std::mem::take(items);
                spare.clear();
                self.spare_lists.push(spare);
            }
            _ => {}
        }
        *slot = match record {
            Record::Frame(i) => Container::Frame(i),
            Record::Stack(i) => Container::Stack(i),
            Record::Event(i) => Container::Event(i),
            Record::Block(i) => Container::Block(i),
        };
    }

    /// Settles empty dict `id` as segment `i` of the lowerer's store.
    pub(crate) fn settle_segment(&mut self, id: u32, i: u32) {
        self.containers[id as usize] = Container::Segment(i);
    }

    /// A new empty dict, on a spare vector when there is one.
    pub(super) fn new_dict(&mut self) -> u32 {
        let entries = self.spare_dicts.pop().unwrap_or_default();
        self.push_with(|| Container::Dict(entries))
    }

    /// A new empty list, on a spare vector when there is one.
    pub(super) fn new_list(&mut self) -> u32 {
        let items = self.spare_lists.pop().unwrap_or_default();
        self.push_with(|| Container::List(items))
    }

    /// Adds the container `make` returns; returns its id.
    ///
    /// Reserves room before the container exists, unlike `Vec::push`, whose
    /// possible call to grow the vector makes the compiler build the
    /// container on the stack with narrow stores and copy it in with wide
    /// loads: a store-forwarding stall on each of the thousands of dicts and
    /// lists in a snapshot (`perf annotate` put a tenth of the machine's time
    /// on that copy).
    #[inline(always)]
    pub(super) fn push_with(&mut self, make: impl FnOnce() -> Container) -> u32 {
        let id = self.containers.len() as u32;
        self.containers.extend(std::iter::once_with(make));
        self.memo_refs.push(MemoRef::NONE);
        id
    }

    /// A heap for a pickle of `len` bytes.
    pub(super) fn for_input(len: usize) -> Heap<'a> {
        // Real snapshots make a container every 20 to 60 bytes; reserving
        // for that many costs address space, not memory, and saves copying
        // the tables as they grow.
        Heap {
            containers: Vec::with_capacity(len / 16),
            memo_refs: Vec::with_capacity(len / 16),
            ..Heap::default()
        }
    }

    /// Whether `v` is a container whose only handle is the one it is read
    /// through: never copied by a memo read or DUP, nor memoized twice. (Once
    /// the machine has run, the memo's handle is gone too.)
    pub(crate) fn unshared(&self, v: Val) -> bool {
        matches!(v, Val::Obj(id) if self.memo_refs[id as usize] != MemoRef::SHARED)
    }

    /// Frees container `v`, read into the snapshot through its only handle
    /// (see [`Heap::unshared`]).
    pub(crate) fn free_read(&mut self, v: Val) {
        if let Val::Obj(id) = v {
            self.containers[id as usize] = Container::Read;
        }
    }

    /// Where the memo holds container `id`.
    pub(super) fn memo_ref(&self, id: u32) -> MemoRef {
        self.memo_refs[id as usize]
    }

    /// Notes that container `id` was memoized in `slot`.
    pub(super) fn memoized(&mut self, id: u32, slot: usize) {
        let r = &mut self.memo_refs[id as usize];
        *r = r.memoized(slot);
    }

    /// Notes that a handle to container `id` was copied (a memo read, DUP,
    /// or a memo slot the machine does not track).
    pub(super) fn shared(&mut self, id: u32) {
        self.memo_refs[id as usize] = MemoRef::SHARED;
    }

    /// Frees the newest container, `id`, which nothing refers to any more.
    pub(super) fn free_newest(&mut self, id: u32) {
        debug_assert_eq!(id as usize + 1, self.containers.len());
        self.containers.pop();
        self.memo_refs.pop();
    }

    /// Adds container `c`, built by the caller (the rarer opcodes).
    pub(super) fn push(&mut self, c: Container) -> Val {
        Val::Obj(self.push_with(|| c))
    }
}

/// A conversion failure: the message, and the path inside the record where
/// it happened, innermost last (joined by the caller).
pub(crate) type Failure = String;

/// Describes a value's type for messages ("expected an integer, found a string").
pub(crate) fn describe(heap: &Heap, v: Val) -> &'static str {
    match v {
        Val::Unset => "nothing",
        Val::None => "None",
        Val::Bool(_) => "a boolean",
        Val::Int(_) | Val::Big(_) => "an integer",
        Val::Float(_) => "a float",
        Val::Str(_) => "a string",
        Val::Bytes(_) => "bytes",
        Val::Frame(_) => "a frame dict",
        Val::Event(_) => "a trace event dict",
        Val::Block(_) => "a block dict",
        Val::Stack(_) => "a list of frames",
        Val::Obj(id) => match heap.containers[id as usize] {
            Container::List(_) => "a list",
            Container::Stack(_) => "a list of frames",
            Container::Tuple(_) => "a tuple",
            Container::Set(_) => "a set",
            Container::Dict(_) => "a dict",
            Container::Frame(_) => "a frame dict",
            Container::Event(_) => "a trace event dict",
            Container::Block(_) => "a block dict",
            Container::Events { .. } => "a list of trace events",
            Container::Blocks { .. } => "a list of blocks",
            Container::Segment(_) => "a segment dict",
            Container::Read => "a value already read",
        },
    }
}

pub(crate) fn int(heap: &Heap, v: Val) -> Result<i128, Failure> {
    match v {
        Val::Int(i) => Ok(i.into()),
        Val::Big(b) => Ok(heap.bigs[b as usize]),
        other => Err(format!(
            "expected an integer, found {}",
            describe(heap, other)
        )),
    }
}

pub(crate) fn u64_of(heap: &Heap, v: Val) -> Result<u64, Failure> {
    if let Val::Int(i @ 0..) = v {
        return Ok(i as u64);
    }
    let i = int(heap, v)?;
    u64::try_from(i).map_err(|_| format!("expected an integer from 0 to 2^64-1, found {i}"))
}

pub(crate) fn i64_of(heap: &Heap, v: Val) -> Result<i64, Failure> {
    if let Val::Int(i) = v {
        return Ok(i);
    }
    let i = int(heap, v)?;
    i64::try_from(i).map_err(|_| format!("integer {i} does not fit in 64 bits"))
}

pub(crate) fn u32_of(heap: &Heap, v: Val) -> Result<u32, Failure> {
    let i = int(heap, v)?;
    u32::try_from(i).map_err(|_| format!("expected an integer from 0 to 2^32-1, found {i}"))
}

pub(crate) fn str_of<'h>(heap: &'h Heap, v: Val) -> Result<&'h str, Failure> {
    match v {
        Val::Str(id) => Ok(heap.str(id)),
        other => Err(format!(
            "expected a string, found {}",
            describe(heap, other)
        )),
    }
}

/// The heap handle of a string value.
pub(crate) fn str_handle(heap: &Heap, v: Val) -> Result<u32, Failure> {
    match v {
        Val::Str(id) => Ok(id),
        other => Err(format!(
            "expected a string, found {}",
            describe(heap, other)
        )),
    }
}

pub(crate) fn bool_of(heap: &Heap, v: Val) -> Result<bool, Failure> {
    match v {
        Val::Bool(b) => Ok(b),
        Val::Int(0) => Ok(false),
        Val::Int(1) => Ok(true),
        other => Err(format!(
            "expected a boolean, found {}",
            describe(heap, other)
        )),
    }
}

/// The items of a list or tuple. A list the machine holds as a run of
/// lowered events or blocks reads as their handles, one each.
pub(crate) fn items<'h>(heap: &'h Heap, v: Val) -> Result<Cow<'h, [Val]>, Failure> {
    match v {
        Val::Obj(id) => match &heap.containers[id as usize] {
            Container::List(items) | Container::Tuple(items) => Ok(Cow::Borrowed(items)),
            &Container::Events { start, len } => Ok((start..start + len).map(Val::Event).collect()),
            &Container::Blocks { start, len } => Ok((start..start + len).map(Val::Block).collect()),
            _ => Err(format!("expected a list, found {}", describe(heap, v))),
        },
        other => Err(format!("expected a list, found {}", describe(heap, other))),
    }
}

/// The entries of a generic dict.
pub(crate) fn entries<'h>(heap: &'h Heap, v: Val) -> Result<&'h [[Val; 2]], Failure> {
    match v {
        Val::Obj(id) => match &heap.containers[id as usize] {
            Container::Dict(entries) => Ok(entries),
            _ => Err(format!("expected a dict, found {}", describe(heap, v))),
        },
        other => Err(format!("expected a dict, found {}", describe(heap, other))),
    }
}

pub(crate) fn pair_of(heap: &Heap, v: Val) -> Result<(i64, i64), Failure> {
    match *items(heap, v)? {
        [a, b] => Ok((i64_of(heap, a)?, i64_of(heap, b)?)),
        ref other => Err(format!(
            "expected a pair of integers, found {} items",
            other.len()
        )),
    }
}

/// The text form of a dict key; snapshots only use string keys.
pub(crate) fn key_text(heap: &Heap, k: Val) -> String {
    match k {
        // A key from the file: quoted and cut short unless plainly a name.
        Val::Str(id) => match heap.str(id) {
            s if s.len() <= 40 && !s.chars().any(crate::visible::is_escaped) => s.to_owned(),
            s => crate::visible::quoted(s),
        },
        Val::Int(i) => i.to_string(),
        Val::Big(b) => heap.bigs[b as usize].to_string(),
        Val::Bool(b) => if b { "True" } else { "False" }.to_owned(),
        Val::None => "None".to_owned(),
        Val::Float(f) => f.to_string(),
        other => format!("<{}>", describe(heap, other)),
    }
}

/// Prefixes a failure with the field it happened in.
pub(crate) fn at(field: &str, f: Failure) -> Failure {
    if f.starts_with(['[', '.', ':']) {
        format!(".{field}{f}")
    } else {
        format!(".{field}: {f}")
    }
}

/// Prefixes a failure with the list index it happened at.
pub(crate) fn index(i: usize, f: Failure) -> Failure {
    if f.starts_with(['[', '.', ':']) {
        format!("[{i}]{f}")
    } else {
        format!("[{i}]: {f}")
    }
}

/// Makes a leaf failure into a path failure at the current position.
pub(crate) fn here(f: Failure) -> Failure {
    if f.starts_with(['[', '.', ':']) {
        f
    } else {
        format!(": {f}")
    }
}

pub(crate) fn missing(field: &str) -> Failure {
    format!(": missing '{field}'")
}
