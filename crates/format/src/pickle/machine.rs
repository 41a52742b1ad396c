//! The pickle virtual machine: opcodes in, a graph of values out.
//!
//! Written by hand because general pickle crates cannot read real snapshots:
//! they reject or silently drop objects that the pickle memo shares, and
//! PyTorch shares every frame list and frame dict that way (see
//! `reference/rust-ecosystem.md` §4). This one runs the ~40 data opcodes of
//! protocols 2 to 5 over an explicit stack; it never recurses and never
//! executes anything: opcodes that would import or call Python code are
//! refused with an error that says what the file is.
//!
//! Values are small `Copy` handles ([`Val`]); strings borrow the input and
//! containers live in an arena, so a list or dict referenced twice through
//! the memo is the same arena slot, as it is in Python. As each dict is
//! completed, [`Lowerer`] turns frames, trace events and blocks into typed
//! records right away, so a file of millions of events never exists as
//! millions of generic dicts.

use std::borrow::Cow;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use crate::error::{ErrorKind, Result};
use crate::model::{FrameId, StackId};
use crate::pickle::halves::SplitPoint;
use crate::pickle::heap::{Container, FRAME_KEYS, Heap, Key, Record, Val};
use crate::pickle::lower::Lowerer;
use crate::pickle::memo::Memo;
use crate::pickle::opcodes::{self, *};
use crate::pickle::skim::{InTrace, Split};
use crate::progress::{PROGRESS_EVERY, Progress};

mod containers;
mod errors;
mod fast;
mod foreign;
mod split;

pub(crate) use split::{FirstHalf, Half, run_first_half, run_second_half};

/// The memo index of the BINGET or LONG_BINGET at `pos`, and the position
/// after it; `None` for any other opcode or a truncated one.
fn memo_get_at(data: &[u8], pos: usize) -> Option<(usize, usize)> {
    match *data.get(pos)? {
        BINGET => Some((usize::from(*data.get(pos + 1)?), pos + 2)),
        LONG_BINGET => {
            let index = data.get(pos + 1..pos + 5)?;
            let index = u32::from_le_bytes(index.try_into().expect("4 bytes"));
            Some((index as usize, pos + 5))
        }
        _ => None,
    }
}

/// Pushes the value `make` returns onto `stack`.
///
/// Not `Vec::push(value)`: across its possible call to grow the vector the
/// compiler keeps a fresh value on the stack, written by narrow stores and
/// copied by a wide load, which stalls store forwarding (`perf annotate` put
/// a seventh of the machine's time on one such push). Here the value is made
/// after room is reserved, and written straight to its place.
#[inline(always)]
fn push_new(stack: &mut Vec<Val>, make: impl FnOnce() -> Val) {
    stack.extend(std::iter::once_with(make));
}

/// The integer written at `pos` by a BININT1, BININT2, BININT or LONG1 of
/// up to 8 bytes, and the position after it; `None` for any other opcode
/// or a truncated one.
fn int_at(data: &[u8], pos: usize) -> Option<(i64, usize)> {
    match *data.get(pos)? {
        BININT1 => Some((i64::from(*data.get(pos + 1)?), pos + 2)),
        BININT2 => {
            let b = data.get(pos + 1..pos + 3)?;
            Some((i64::from(u16::from_le_bytes([b[0], b[1]])), pos + 3))
        }
        BININT => {
            let b = data.get(pos + 1..pos + 5)?;
            let n = i32::from_le_bytes(b.try_into().expect("4 bytes"));
            Some((i64::from(n), pos + 5))
        }
        LONG1 => {
            let n = usize::from(*data.get(pos + 1)?);
            if !(1..=8).contains(&n) {
                return None;
            }
            let mut word = [0; 8];
            word[..n].copy_from_slice(data.get(pos + 2..pos + 2 + n)?);
            let shift = 64 - 8 * n as u32;
            Some(((i64::from_le_bytes(word) << shift) >> shift, pos + 2 + n))
        }
        _ => None,
    }
}

/// The line number written at `pos` (see [`int_at`]), and the position
/// after it. A negative line is clamped to 0 and a huge one to `u32::MAX`,
/// as [`Lowerer`] does for frames it converts.
fn line_at(data: &[u8], pos: usize) -> Option<(u32, usize)> {
    let (n, next) = int_at(data, pos)?;
    Some((u32::try_from(n.max(0)).unwrap_or(u32::MAX), next))
}

/// Where the run of BINGETs and LONG_BINGETs from `pos` ends.
fn memo_gets_end(data: &[u8], pos: usize) -> usize {
    let mut rest = &data[pos..];
    loop {
        match rest {
            [LONG_BINGET, _, _, _, _, tail @ ..] | [BINGET, _, tail @ ..] => rest = tail,
            _ => return data.len() - rest.len(),
        }
    }
}

/// A value of a flat record (see [`Machine::flat_record`]) written at
/// `pos`, and the position after it: a memo get of anything but a
/// container, an integer of up to 8 bytes, None or a boolean. `None` for
/// anything else, or a get that would fail (which `execute` then reports).
#[inline(always)]
fn flat_value(data: &[u8], memo: &Memo, pos: usize) -> Option<(Val, usize)> {
    match *data.get(pos)? {
        BINGET | LONG_BINGET => {
            let (i, next) = memo_get_at(data, pos)?;
            match memo.get(i)? {
                Val::Unset | Val::Obj(_) => None,
                v => Some((v, next)),
            }
        }
        NONE => Some((Val::None, pos + 1)),
        NEWTRUE => Some((Val::Bool(true), pos + 1)),
        NEWFALSE => Some((Val::Bool(false), pos + 1)),
        _ => int_at(data, pos).map(|(n, next)| (Val::Int(n), next)),
    }
}

/// The most entries a dict read by [`Machine::flat_record`] may have;
/// PyTorch's records have a dozen at most.
const FLAT_RECORD_ENTRIES: usize = 32;

/// How many never-written slots the dense memo table may hold beyond one per
/// written slot. Memo indices may skip ahead (PUT writes any index); a slot
/// that would take the table past this goes to [`Machine::far_memo`], so the
/// memo costs memory in proportion to the slots actually written, whatever
/// the indices.
pub(super) const MEMO_SLACK: usize = 1 << 12;

/// How often, in bytes, a first half looks whether the skim has found the
/// split yet.
const SPLIT_POLL_EVERY: usize = 1 << 20;

/// The deepest value stack and the most open MARKs a file may build. PyTorch's
/// pickler writes lists and dicts in batches of 1000 items and snapshots nest
/// a few levels deep, so real files stay in the low thousands; these caps stop
/// a file of repeated pushes (EMPTY_LIST, memo gets, MARK) from growing the
/// stack with every byte before it is refused.
pub(super) const MAX_STACK: usize = 1 << 20;
pub(super) const MAX_MARKS: usize = 1 << 12;

/// What a run of a pickle leaves: the value, the heap behind it, the
/// lowered records, and the protocol the pickle declared.
pub(crate) type Ran<'a> = (Val, Heap<'a>, Lowerer, u8);

/// Runs the pickle in `data`.
pub(crate) fn run(data: &[u8], progress: Option<Progress>) -> Result<Ran<'_>> {
    let mut m = Machine::new(data);
    m.progress = progress;
    m.run_whole()
}

/// Runs the pickle at the start of `data` and returns its length in bytes:
/// where the next pickle of a file of several starts.
pub(crate) fn length(data: &[u8]) -> Result<usize> {
    let mut m = Machine::new(data);
    m.execute_whole()?;
    Ok(m.pos)
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: Memo,
    /// How many slots of `memo` are [`Val::Unset`] gaps left by PUTs that
    /// skipped ahead.
    memo_gaps: usize,
    /// Memo slots written too far past the dense table to extend it; never
    /// used by files a pickler wrote, which number their slots in order.
    far_memo: rustc_hash::FxHashMap<usize, Val>,
    heap: Heap<'a>,
    lower: Lowerer,
    /// Frame ids of the frame list being read by [`Machine::frame_list`].
    frame_run: Vec<FrameId>,
    /// The entries of the dict being read by [`Machine::flat_record`].
    flat_entries: Vec<[Val; 2]>,
    /// The stacks of frame lists read so far, by the position and length of
    /// their memo gets in `data`.
    stacks_by_gets: HashTable<(usize, usize, StackId)>,
    /// Hashes the get bytes for `stacks_by_gets`: foldhash (hashbrown's
    /// default) reads long byte strings several times faster than FxHash.
    gets_hasher: hashbrown::DefaultHashBuilder,
    protocol: u8,
    /// Told the position every [`PROGRESS_EVERY`] bytes, if given.
    progress: Option<Progress>,
    /// The position at which `progress` is told next.
    next_progress: usize,
    /// Where the halves of a read in two meet, in either half.
    split: Option<Arc<SplitPoint>>,
    /// In the second half: where the value of each memo slot written before
    /// the split was made.
    foreign: Option<Vec<u32>>,
    /// The position at which `progress` or `split` is looked at next.
    next_check: usize,
}

impl<'a> Machine<'a> {
    fn new(data: &'a [u8]) -> Machine<'a> {
        Machine {
            data,
            pos: 0,
            stack: Vec::with_capacity(1024),
            marks: Vec::with_capacity(64),
            // Real snapshots memoize a container or string every 20 to 60 bytes,
            // and make a container as often; sizing the tables up front avoids
            // copying them as they grow (untouched capacity costs address space,
            // not memory).
            memo: Memo::with_capacity(data.len() / 16),
            memo_gaps: 0,
            far_memo: rustc_hash::FxHashMap::default(),
            heap: Heap::for_input(data.len()),
            lower: Lowerer::for_input(data.len()),
            frame_run: Vec::new(),
            flat_entries: Vec::with_capacity(FLAT_RECORD_ENTRIES),
            stacks_by_gets: HashTable::new(),
            gets_hasher: hashbrown::DefaultHashBuilder::default(),
            protocol: 0,
            progress: None,
            next_progress: PROGRESS_EVERY,
            split: None,
            foreign: None,
            next_check: PROGRESS_EVERY,
        }
    }

    /// Runs the whole pickle.
    fn run_whole(mut self) -> Result<Ran<'a>> {
        let top = self.execute_whole()?;
        Ok((top, self.heap, self.lower, self.protocol))
    }

    /// Runs the pickle to its end (or the end of a second half).
    fn execute_whole(&mut self) -> Result<Val> {
        // Only a first half pauses, and only while it knows of a split.
        Ok(self
            .execute()?
            .expect("a machine pauses only as a first half"))
    }

    /// Tells `progress` and looks at `split` at `at`, when due; says whether
    /// a first half has reached the split and pauses there.
    #[cold]
    fn checkpoint(&mut self, at: usize) -> Result<bool> {
        if at >= self.next_progress {
            self.report_progress(at);
        }
        self.next_check = self.next_progress;
        let Some(split) = self.split.clone() else {
            return Ok(false);
        };
        if self.foreign.is_some() {
            if split.abandoned() {
                return Err(self.error_at(ErrorKind::Malformed, "the first half went on alone"));
            }
            return Ok(false);
        }
        if split.abandoned() {
            // The second half gave up: read on alone.
            self.split = None;
            return Ok(false);
        }
        match split.position() {
            Err(()) => self.next_check = self.next_check.min(at + SPLIT_POLL_EVERY),
            Ok(None) => self.split = None,
            Ok(Some(p)) if p == at => {
                self.split = None;
                return Ok(true);
            }
            Ok(Some(p)) if p > at => self.next_check = self.next_check.min(p),
            Ok(Some(_)) => {
                split.abandon();
                self.split = None;
            }
        }
        Ok(false)
    }

    /// Tells `progress` that the opcodes before `at` are done.
    #[cold]
    fn report_progress(&mut self, at: usize) {
        self.next_progress = at + PROGRESS_EVERY;
        if let Some(progress) = &mut self.progress {
            progress.done(at);
        }
    }

    /// Runs opcodes to the STOP and returns the value left; `None` if a
    /// first half paused at the split instead.
    fn execute(&mut self) -> Result<Option<Val>> {
        let data = self.data;
        loop {
            let at = self.pos;
            if self.stack.len() > MAX_STACK || self.marks.len() > MAX_MARKS {
                return Err(self.too_deep(at));
            }
            if at >= self.next_check && self.checkpoint(at)? {
                return Ok(None);
            }
            let op = *data.get(at).ok_or_else(|| {
                self.error_at(
                    ErrorKind::Truncated,
                    format!("truncated at byte {at}: the pickle ends before its STOP opcode"),
                )
            })?;
            self.pos += 1;
            match op {
                PROTO => {
                    let p = self.u8(op)?;
                    if p > 5 {
                        return Err(self.error_at(
                            ErrorKind::Malformed,
                            format!("pickle protocol {p} is newer than this reader (2 to 5)"),
                        ));
                    }
                    self.protocol = p;
                }
                FRAME => {
                    // FRAME: a length hint for buffered readers; all bytes are here already.
                    self.take(8, op)?;
                }
                STOP => {
                    let top = self.pop(op, at)?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return Err(self
                            .error_at(ErrorKind::Malformed, "STOP with values left on the stack"));
                    }
                    return Ok(Some(top));
                }
                MARK => {
                    self.marks.push(self.stack.len());
                    self.frame_list();
                }
                POP => {
                    if let Val::Obj(id) = self.pop(op, at)? {
                        self.reclaim(id);
                    }
                }
                POP_MARK => {
                    let mark = self.pop_mark(op, at)?;
                    self.stack.truncate(mark);
                }
                DUP => {
                    let top = self.peek(op, at)?;
                    self.stack.push(top);
                    if let Val::Obj(id) = top {
                        self.heap.shared(id);
                    }
                }
                NONE => push_new(&mut self.stack, || Val::None),
                NEWTRUE => push_new(&mut self.stack, || Val::Bool(true)),
                NEWFALSE => push_new(&mut self.stack, || Val::Bool(false)),
                BININT => {
                    let b = self.take(4, op)?;
                    let v = i32::from_le_bytes(b.try_into().unwrap()).into();
                    push_new(&mut self.stack, || Val::Int(v));
                    self.more_gets();
                }
                BININT1 => {
                    let v = self.u8(op)?.into();
                    push_new(&mut self.stack, || Val::Int(v));
                    self.more_gets();
                }
                BININT2 => {
                    let b = self.take(2, op)?;
                    let v = u16::from_le_bytes([b[0], b[1]]).into();
                    push_new(&mut self.stack, || Val::Int(v));
                    self.more_gets();
                }
                LONG1 => {
                    let n = self.u8(op)? as usize;
                    let start = self.pos;
                    let b = self.take(n, op)?;
                    match self.data.get(start..start + 8) {
                        // Addresses and times: one load, then sign-extend the n bytes.
                        Some(word) if (1..=8).contains(&n) => {
                            let shift = 64 - 8 * n as u32;
                            let word = i64::from_le_bytes(word.try_into().expect("8 bytes"));
                            let v = (word << shift) >> shift;
                            push_new(&mut self.stack, || Val::Int(v));
                        }
                        _ => {
                            let v = self.long(b, at)?;
                            self.stack.push(v);
                        }
                    }
                    self.more_gets();
                }
                LONG4 => {
                    let n = self.len4(op)?;
                    let b = self.take(n, op)?;
                    let v = self.long(b, at)?;
                    self.stack.push(v);
                }
                BINFLOAT => {
                    let b = self.take(8, op)?;
                    self.stack
                        .push(Val::Float(f64::from_be_bytes(b.try_into().unwrap())));
                }
                SHORT_BINUNICODE => {
                    let n = self.u8(op)? as usize;
                    self.push_str(n, op)?;
                }
                BINUNICODE => {
                    let n = self.len4(op)?;
                    self.push_str(n, op)?;
                }
                BINUNICODE8 => {
                    let n = self.len8(op)?;
                    self.push_str(n, op)?;
                }
                SHORT_BINBYTES => {
                    let n = self.u8(op)? as usize;
                    self.push_bytes(n, op)?;
                }
                BINBYTES => {
                    let n = self.len4(op)?;
                    self.push_bytes(n, op)?;
                }
                BINBYTES8 | BYTEARRAY8 => {
                    let n = self.len8(op)?;
                    self.push_bytes(n, op)?;
                }
                EMPTY_DICT => {
                    if self.flat_record() {
                        continue;
                    }
                    let id = self.heap.new_dict();
                    push_new(&mut self.stack, || Val::Obj(id));
                    self.memoize_and_mark(id);
                }
                EMPTY_LIST => {
                    let id = self.heap.new_list();
                    push_new(&mut self.stack, || Val::Obj(id));
                    if self.memoize_and_mark(id) {
                        self.frame_list();
                    }
                }
                EMPTY_TUPLE => {
                    let v = self.heap.push(Container::Tuple(Vec::new()));
                    self.stack.push(v);
                }
                EMPTY_SET => {
                    let v = self.heap.push(Container::Set(Vec::new()));
                    self.stack.push(v);
                }
                LIST | TUPLE | FROZENSET => {
                    let mark = self.pop_mark(op, at)?;
                    self.place(mark, at)?;
                    let items = self.stack.split_off(mark);
                    let c = match op {
                        LIST => Container::List(items),
                        TUPLE => Container::Tuple(items),
                        _ => Container::Set(items),
                    };
                    let v = self.heap.push(c);
                    self.stack.push(v);
                    if let Val::Obj(id) = v {
                        self.lower.lower_list(&mut self.heap, id);
                    }
                }
                TUPLE1..=TUPLE3 => {
                    let n = (op - TUPLE1 + 1) as usize;
                    if self.stack.len() < n + self.fence() {
                        return Err(self.underflow(op, at));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let v = self.heap.push(Container::Tuple(items));
                    self.stack.push(v);
                }
                DICT => {
                    let mark = self.pop_mark(op, at)?;
                    let items = self.stack.split_off(mark);
                    if !items.len().is_multiple_of(2) {
                        return Err(
                            self.error_at(ErrorKind::Malformed, "DICT with an odd number of items")
                        );
                    }
                    let pairs = items.chunks_exact(2).map(|p| [p[0], p[1]]).collect();
                    let v = self.heap.push(Container::Dict(pairs));
                    self.stack.push(v);
                    self.lower_top();
                }
                APPEND => self.append(op, at)?,
                APPENDS | ADDITEMS => self.appends(op, at)?,
                SETITEM => {
                    let value = self.pop(op, at)?;
                    let key = self.pop(op, at)?;
                    let target = self.top_container(op, at)?;
                    self.set_items(target, [[key, value]].into_iter(), op, at)?;
                    self.lower_top();
                }
                SETITEMS => {
                    let mark = self.pop_mark(op, at)?;
                    if !(self.stack.len() - mark).is_multiple_of(2) {
                        return Err(self.error_at(
                            ErrorKind::Malformed,
                            "SETITEMS with an odd number of items",
                        ));
                    }
                    let target = self.container_below(mark, op, at)?;
                    let (pairs, _) = self.stack[mark..].as_chunks::<2>();
                    if matches!(&self.heap.containers[target as usize], Container::Dict(v) if v.is_empty())
                    {
                        // A whole dict, as PyTorch writes each record: lowered
                        // straight from the stack, never copied into the dict.
                        if let Some(record) = self.lower.lower_entries(&self.heap, pairs) {
                            // Its frame list, when made right after it.
                            let child = Val::Obj(target + 1);
                            let list = pairs.iter().any(|&[_, v]| v == child).then_some(target + 1);
                            self.heap.settle(target, record);
                            self.stack.truncate(mark);
                            self.record_in_place_of(target, list);
                            continue;
                        }
                        if let Some(segment) = self.lower.lower_segment(&self.heap, pairs) {
                            // Its list of blocks stays: a handle to it may
                            // come later, and must find its blocks taken.
                            self.heap.settle_segment(target, segment);
                            self.stack.truncate(mark);
                            continue;
                        }
                    }
                    match &mut self.heap.containers[target as usize] {
                        Container::Dict(v) => v.extend_from_slice(pairs),
                        Container::Frame(_)
                        | Container::Event(_)
                        | Container::Block(_)
                        | Container::Segment(_) => {
                            return Err(self.changed_after_complete(op, at));
                        }
                        _ => return Err(self.not_a(op, at, "dict")),
                    }
                    self.stack.truncate(mark);
                    self.lower_top();
                }
                MEMOIZE => {
                    let top = self.peek(op, at)?;
                    self.memo.push(top);
                    if let Val::Obj(id) = top {
                        self.heap.memoized(id, self.memo.len() - 1);
                    }
                }
                BINPUT => {
                    let i = self.u8(op)? as usize;
                    self.put(i, op, at)?;
                }
                LONG_BINPUT => {
                    let i = self.len4(op)?;
                    self.put(i, op, at)?;
                }
                BINGET => {
                    let i = self.u8(op)? as usize;
                    self.get(i, at)?;
                    self.more_gets();
                }
                LONG_BINGET => {
                    let i = self.len4(op)?;
                    self.get(i, at)?;
                    self.more_gets();
                }
                GLOBAL => return Err(self.refuse_global(at)),
                STACK_GLOBAL => {
                    let name = self.pop(op, at).ok().and_then(|v| self.text(v));
                    let module = self.pop(op, at).ok().and_then(|v| self.text(v));
                    let what = match (module, name) {
                        (Some(m), Some(n)) => format!("{m}.{n}"),
                        _ => String::new(),
                    };
                    return Err(self.refuse_object(&what, op, at));
                }
                PERSID | BINPERSID => {
                    return Err(self.error_at(
                        ErrorKind::Refused,
                        format!(
                            "pickle refers to tensor storage ({} at byte {at}): this is a \
                             torch.save of tensors or a model, not a memory snapshot",
                            opcodes::name(op)
                        ),
                    ));
                }
                REDUCE | BUILD | INST | OBJ | NEWOBJ | NEWOBJ_EX | EXT1..=EXT4 => {
                    return Err(self.error_at(
                        ErrorKind::Refused,
                        format!(
                            "pickle builds Python objects ({} at byte {at}); a memory snapshot \
                             holds only dicts, lists, numbers and strings, and snapdiff never \
                             runs code from a file",
                            opcodes::name(op)
                        ),
                    ));
                }
                NEXT_BUFFER | READONLY_BUFFER => {
                    return Err(self.error_at(
                        ErrorKind::Malformed,
                        format!("pickle uses out-of-band buffers ({})", opcodes::name(op)),
                    ));
                }
                FLOAT | INT | LONG | STRING | BINSTRING | SHORT_BINSTRING | UNICODE | GET | PUT => {
                    return Err(self.error_at(
                        ErrorKind::Malformed,
                        format!(
                            "unsupported opcode {} at byte {at} (a protocol 0/1 text pickle; \
                             snapshots are written with protocol 2 or later)",
                            opcodes::name(op)
                        ),
                    ));
                }
                _ => {
                    return Err(self.error_at(
                        ErrorKind::Malformed,
                        format!("unknown opcode 0x{op:02x} at byte {at}"),
                    ));
                }
            }
        }
    }

    fn take(&mut self, n: usize, op: u8) -> Result<&'a [u8]> {
        let data: &'a [u8] = self.data;
        match self.pos.checked_add(n).filter(|&end| end <= data.len()) {
            Some(end) => {
                let s = &data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.truncated(op)),
        }
    }

    fn u8(&mut self, op: u8) -> Result<u8> {
        Ok(self.take(1, op)?[0])
    }

    fn len4(&mut self, op: u8) -> Result<usize> {
        let b = self.take(4, op)?;
        Ok(u32::from_le_bytes(b.try_into().unwrap()) as usize)
    }

    fn len8(&mut self, op: u8) -> Result<usize> {
        let b = self.take(8, op)?;
        // A length beyond the input is caught by `take` as truncation.
        Ok(usize::try_from(u64::from_le_bytes(b.try_into().unwrap())).unwrap_or(usize::MAX))
    }

    /// Decodes a little-endian two's-complement integer (LONG1, LONG4).
    fn long(&mut self, b: &[u8], at: usize) -> Result<Val> {
        let negative = b.last().is_some_and(|&x| x & 0x80 != 0);
        if b.len() > 16 {
            return Err(self.error_at(
                ErrorKind::TooLarge,
                format!(
                    "integer of {} bytes at byte {at} is wider than 128 bits",
                    b.len()
                ),
            ));
        }
        let mut buf = if negative { [0xff; 16] } else { [0; 16] };
        buf[..b.len()].copy_from_slice(b);
        let v = i128::from_le_bytes(buf);
        Ok(match i64::try_from(v) {
            Ok(small) => Val::Int(small),
            Err(_) => {
                self.heap.bigs.push(v);
                Val::Big(self.heap.bigs.len() as u32 - 1)
            }
        })
    }

    fn push_str(&mut self, n: usize, op: u8) -> Result<()> {
        let b = self.take(n, op)?;
        // Python writes lone surrogates with "surrogatepass"; keep such strings,
        // lossily. (Plain validation first: it is much faster than the lossy pass.)
        let s = match std::str::from_utf8(b) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => self.not_utf8(b),
        };
        let id = self.heap.push_str(s);
        push_new(&mut self.stack, || Val::Str(id));
        // Protocol 4 memoizes each string; done here, the MEMOIZE needs no
        // dispatch, nor a read of the value just pushed.
        if self.data.get(self.pos) == Some(&MEMOIZE) {
            self.pos += 1;
            self.memo.push(Val::Str(id));
        }
        Ok(())
    }

    /// `b`, a string that is not UTF-8, with U+FFFD for its bad bytes;
    /// counted for the file's description. Out of line: the hot path of
    /// [`Machine::push_str`] stays as small as it was.
    #[cold]
    #[inline(never)]
    fn not_utf8(&mut self, b: &'a [u8]) -> Cow<'a, str> {
        self.heap.not_utf8 += 1;
        String::from_utf8_lossy(b)
    }

    fn push_bytes(&mut self, n: usize, op: u8) -> Result<()> {
        let b = self.take(n, op)?;
        self.heap.bytes.push(b);
        self.stack
            .push(Val::Bytes(self.heap.bytes.len() as u32 - 1));
        Ok(())
    }

    /// The innermost mark: values below it belong to an enclosing MARK.
    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self, op: u8, at: usize) -> Result<Val> {
        if self.stack.len() <= self.fence() {
            return Err(self.underflow(op, at));
        }
        Ok(self.stack.pop().expect("stack is above the fence"))
    }

    fn peek(&self, op: u8, at: usize) -> Result<Val> {
        if self.stack.len() <= self.fence() {
            return Err(self.underflow(op, at));
        }
        Ok(*self.stack.last().expect("stack is above the fence"))
    }

    fn pop_mark(&mut self, op: u8, at: usize) -> Result<usize> {
        self.marks.pop().ok_or_else(|| {
            self.error_at(
                ErrorKind::Malformed,
                format!("{} at byte {at} without a MARK", opcodes::name(op)),
            )
        })
    }

    fn text(&self, v: Val) -> Option<String> {
        match v {
            Val::Str(id) => Some(self.heap.str(id).to_owned()),
            _ => None,
        }
    }
}
