//! Finding where a snapshot pickle's trace begins without running it, so
//! that the part before (the segments) and the part from there on (the
//! trace) can be read on two threads, and where the trace ends, so that a
//! reader without events can step over it (see `halves.rs`).
//!
//! The skim steps over the opcodes counting what they push and pop, as the
//! machine would, but makes no value: it keeps only the stack's depth, the
//! open marks, and where the value each memo slot holds was made. It takes
//! a small fraction of a full read (no strings are checked, no containers
//! made), and gives up (`None`) at anything a snapshot written by Python's
//! or PyTorch's pickler would not hold; the file is then read on one thread.

use crate::pickle::opcodes::*;
use crate::progress::{PROGRESS_EVERY, Pages};

/// Where the halves meet: the top dict's `device_traces` key, or a point
/// inside the trace; and what the machine would hold there.
pub(crate) struct Split {
    /// The position of the opcode that writes the key, or of the MARK that
    /// opens a batch of a device's events.
    pub(crate) at: usize,
    /// How many key-value pairs of the top dict are on the stack there,
    /// above its mark (before the key).
    pub(crate) pairs: usize,
    /// For each memo slot written before `at`, the position of the opcode
    /// that made its value (the one just before the MEMOIZE or PUT).
    pub(crate) made_at: Vec<u32>,
    /// Set when the split is inside the trace.
    pub(crate) in_trace: Option<InTrace>,
}

/// A split inside the trace, at the MARK of a batch of events after the
/// first (Python's pickler writes a list 1000 items to an APPENDS): above
/// the top dict's
/// pairs are the key, the list of devices, and the event lists of the
/// devices so far, the last one being filled.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InTrace {
    /// The position of the opcode that writes the key.
    pub(crate) key_at: usize,
    /// How many devices come before the one whose events the split is in.
    pub(crate) devices_before: usize,
    /// Whether the devices are added to their list by one APPENDS (two or
    /// more devices), not one APPEND.
    pub(crate) devices_batched: bool,
}

/// The key the trace is written under.
const TRACE_KEY: &[u8] = b"device_traces";

/// Where a file is split, with the work on each side about the same: at
/// the top dict's `device_traces` key, or, when the trace is long enough
/// that the part after the key would take longer, inside the trace.
///
/// The split is chosen by bytes, weighed by what each costs: reading
/// segments about three times what a trace does, and the skim of the part
/// before the split (which the second thread does first) about 0.4 of it.
/// These are fitted to the real-shaped files of `bench/make_real_shaped.py`,
/// whose halves split at the key end within 10% of each other, and to a
/// 265 MiB trace (`fixtures/make_torch_format.py --large 5000000`), which
/// read fastest split at 60% to 65% of the way through (0.58 – 0.65 s,
/// against 0.65 – 0.93 s at 45% to 55% and 0.66 – 0.73 s at 70%).
///
/// In a file past 4 GiB the split is kept within the skim's reach
/// ([`SKIM_REACH`]): as near the balance as that allows.
pub(crate) fn find_balanced(data: &[u8]) -> Option<Split> {
    // A batch of events starts every few hundred KB at most: a split
    // looked for this far before the reach is found within it.
    let last_from = SKIM_REACH - (16 << 20);
    find(data, |key_at| {
        balanced_split(data.len(), key_at).map(|at| at.min(last_from))
    })
}

/// Where inside the trace to split a file of `len` bytes whose trace key
/// is at `key_at`; `None` to split at the key (see [`find_balanced`]).
fn balanced_split(len: usize, key_at: usize) -> Option<usize> {
    if len < SPLIT_INSIDE_TRACE_FROM {
        return None;
    }
    // In 64 bits: ten times a file of up to 4 GiB.
    let (segments, trace) = (key_at as u64, (len - key_at) as u64);
    // The trace's bytes before the split, `s`, that make the two parts
    // equal: SEGMENT * segments + TRACE * s = SKIM * (segments + s) +
    // TRACE * (trace - s).
    let s = (TRACE * trace).checked_sub((SEGMENT - SKIM) * segments)? / (2 * TRACE - SKIM);
    // A split a little past the key gains less than the skim costs.
    (s > trace / 10).then_some(key_at + s as usize)
}

/// Files from this size may be split inside their trace. Each half keeps
/// a memo slot for every value before the split, so a smaller one would
/// take more memory than it is worth: a 36 MiB trace (the test
/// `a_long_trace_is_held_in_less_memory_than_its_pickle_takes`) read in
/// 0.07 s instead of 0.10 s, but at 1.31x the file, against 1.12x.
const SPLIT_INSIDE_TRACE_FROM: usize = 64 << 20;

/// The cost of reading a byte of segments, of trace, and of skimming a
/// byte, in tenths of a trace byte's (see [`find_balanced`]).
const SEGMENT: u64 = 30;
const TRACE: u64 = 10;
const SKIM: u64 = 4;

/// Finds the top dict's `device_traces` key in `data`, a pickle of a dict
/// written in protocol 2 or later; then, if `inside` gives a position for
/// the key's, the first MARK of a batch of a device's events from there on
/// (the key if there is none). `None` if there is no key, or if the pickle
/// holds anything a snapshot does not (an object, a protocol 0 text
/// opcode, a memo slot written out of order, a key past 4 GiB).
pub(crate) fn find(data: &[u8], inside: impl FnOnce(usize) -> Option<usize>) -> Option<Split> {
    find_within(data, SKIM_REACH, inside)
}

/// How far into a file a skim goes: it keeps positions in 32 bits, so in a
/// file past 4 GiB it gives up there (a split is found before it, or the
/// file is read on one thread).
const SKIM_REACH: usize = u32::MAX as usize;

/// [`find`], the skim going no further than `reach` bytes.
pub(crate) fn find_within(
    data: &[u8],
    reach: usize,
    inside: impl FnOnce(usize) -> Option<usize>,
) -> Option<Split> {
    let reached = &data[..data.len().min(reach)];
    // Reserved for a slot every 16 bytes, as the machine reserves its memo.
    let mut skim = Skim::new(
        reached,
        0,
        0,
        Vec::new(),
        Vec::with_capacity(reached.len() / 16),
    );
    let mut at_key = None;
    match skim.run_to_split(inside, &mut at_key) {
        Some(split) => Some(split),
        // No batch of events where `inside` said: the key.
        None => {
            let (key, slots): (Split, usize) = at_key?;
            let mut made_at = skim.made_at;
            made_at.truncate(slots);
            Some(Split { made_at, ..key })
        }
    }
}

/// A trace stepped over by [`past_trace`].
pub(crate) struct PastTrace {
    /// Where the trace's key is, with the pairs before it (as [`find`] gave
    /// it, without its memo slots).
    pub(crate) key: Split,
    /// How many devices the trace lists.
    pub(crate) devices: usize,
    /// Where the top dict goes on after the trace: its pairs before, the
    /// trace's pair among them, and every memo slot written before.
    pub(crate) after: Split,
}

/// Steps over the value of the trace key that [`find`] found at `key` (a
/// list of devices, each a list of events), counting its devices, so that
/// a reader that needs no events can read the file around it; the trace's
/// `pages` of a mapped file are handed back behind the skim, as a reader's
/// are. `None` if the value is not a list made there, holds anything
/// [`find`] gives up at, or ends past the skim's reach.
pub(crate) fn past_trace(data: &[u8], mut key: Split, pages: Option<Pages>) -> Option<PastTrace> {
    let mut pages = pages.map(|p| p.from(key.at));
    let mut release_at = key.at + PROGRESS_EVERY;
    // The stack's depth at the key: the dict, and two for each pair before.
    let base = 1 + 2 * key.pairs;
    let made_at = std::mem::take(&mut key.made_at);
    let data = &data[..data.len().min(SKIM_REACH)];
    let mut skim = Skim::new(data, key.at, base, vec![1], made_at);
    skim.step()?;
    while data.get(skim.pos) != Some(&EMPTY_LIST) {
        // The key's memo put, or a frame's start.
        matches!(*data.get(skim.pos)?, MEMOIZE | BINPUT | LONG_BINPUT | FRAME).then_some(())?;
        skim.step()?;
    }
    let value = base + 2;
    let mut devices = 0;
    loop {
        let at = skim.pos;
        let op = *data.get(at)?;
        if skim.depth == value && skim.marks.len() == 1 {
            // The list is made, and each device is added to it by an APPEND
            // (a list alone, or a get of one) or in a batch under a MARK;
            // anything else is the top dict's next key, or its SETITEMS.
            let gets_a_device = match op {
                BINGET => data.get(at + 2) == Some(&APPEND),
                LONG_BINGET => data.get(at + 5) == Some(&APPEND),
                _ => false,
            };
            let of_the_list = matches!(
                op,
                MEMOIZE | BINPUT | LONG_BINPUT | FRAME | MARK | EMPTY_LIST
            );
            if !of_the_list && !gets_a_device {
                break;
            }
        }
        if at >= release_at {
            release_at = at + PROGRESS_EVERY;
            if let Some(pages) = &mut pages {
                pages.release_before(at);
            }
        }
        match op {
            APPENDS if skim.marks.len() == 2 && skim.marks[1] == value => {
                devices += skim.depth - value
            }
            APPEND if skim.marks.len() == 1 && skim.depth == value + 1 => devices += 1,
            _ => {}
        }
        skim.step()?;
        // Inside a batch of a device's events (under a mark above the top
        // dict's and the devices' batch's), nothing is counted: stepped
        // over in a loop of its own, the checks above left out.
        let outer_marks = 1 + usize::from(skim.marks.get(1) == Some(&value));
        while skim.marks.len() > outer_marks {
            skim.step()?;
        }
    }
    let after = Split {
        at: skim.pos,
        pairs: key.pairs + 1,
        made_at: skim.made_at,
        in_trace: None,
    };
    Some(PastTrace {
        key,
        devices,
        after,
    })
}

/// A walk over a pickle's opcodes that makes no value: the stack's depth,
/// the open marks, and where each memo slot's value was made.
struct Skim<'a> {
    data: &'a [u8],
    /// The next opcode's position.
    pos: usize,
    depth: usize,
    /// The depth at each open mark.
    marks: Vec<usize>,
    /// The position that made each memo slot's value.
    made_at: Vec<u32>,
    /// The position of the last opcode (that made the last value, when a
    /// memo write follows).
    previous: usize,
    /// That opcode (memo writes and frames left out).
    last_op: u8,
    /// Whether the outermost value is a dict.
    top_is_dict: bool,
}

impl<'a> Skim<'a> {
    fn new(
        data: &'a [u8],
        pos: usize,
        depth: usize,
        marks: Vec<usize>,
        made_at: Vec<u32>,
    ) -> Skim<'a> {
        Skim {
            data,
            pos,
            depth,
            marks,
            made_at,
            previous: 0,
            last_op: 0,
            top_is_dict: depth > 0,
        }
    }

    /// Skims to the trace key (recorded in `at_key` with the memo slots
    /// before it) and, if `inside` gives a position for the key's, on to
    /// the first batch of a device's events from there (see [`find`]).
    fn run_to_split(
        &mut self,
        inside: impl FnOnce(usize) -> Option<usize>,
        at_key: &mut Option<(Split, usize)>,
    ) -> Option<Split> {
        let mut inside = Some(inside);
        // From where a split inside the trace is looked for, once the key is found.
        let mut split_from = usize::MAX;
        // Whether the skim, past the key, has been inside the list of devices.
        let mut in_devices = false;
        loop {
            let at = self.pos;
            let op = *self.data.get(at)?;
            if let Some((key, _)) = at_key {
                // The list of devices is at this depth once made.
                let base = 3 + 2 * key.pairs;
                if self.depth > base {
                    in_devices = true;
                } else if in_devices && self.marks.len() == 1 {
                    // Its last batch is past: no split inside the trace.
                    return None;
                }
                if op == MARK
                    && at >= split_from
                    // Not a list's first MARK: the machine runs that one
                    // with the list's EMPTY_LIST and MEMOIZE, and would not
                    // stop at it.
                    && self.last_op == APPENDS
                {
                    // A batch of events of the list on top: the list of
                    // devices at `base` holds them under its batch's mark,
                    // or, with one device, under none.
                    let marks = &self.marks;
                    let batched = marks.len() == 2 && marks[1] == base && self.depth > base;
                    let single = marks.len() == 1 && self.depth == base + 1;
                    if batched || single {
                        return Some(Split {
                            at,
                            pairs: key.pairs,
                            made_at: std::mem::take(&mut self.made_at),
                            in_trace: Some(InTrace {
                                key_at: key.at,
                                devices_before: self.depth - base - 1,
                                devices_batched: batched,
                            }),
                        });
                    }
                }
            } else if self.top_is_dict
                && self.marks == [1]
                // A key of the top dict: above its one mark, at an even place.
                && (self.depth - 1).is_multiple_of(2)
                && matches!(op, SHORT_BINUNICODE | BINUNICODE | BINUNICODE8)
                && string_at(self.data, at)?.0 == TRACE_KEY
            {
                let split = Split {
                    at,
                    pairs: (self.depth - 1) / 2,
                    made_at: Vec::new(),
                    in_trace: None,
                };
                match inside.take().and_then(|inside| inside(at)) {
                    Some(from) => split_from = from,
                    None => {
                        let made_at = std::mem::take(&mut self.made_at);
                        return Some(Split { made_at, ..split });
                    }
                }
                *at_key = Some((split, self.made_at.len()));
            }
            self.step()?;
        }
    }

    /// Steps over the opcode at `pos` (a run of memo gets at once), keeping
    /// the depth, marks and memo as the machine would; `None` at anything
    /// the machine would fail at or a snapshot does not hold.
    #[inline(always)]
    fn step(&mut self) -> Option<()> {
        let data = self.data;
        let at = self.pos;
        let op = *data.get(at)?;
        let mut pos = at + 1;
        // The length of an argument of `n` little-endian bytes at `pos`.
        let length = |pos: usize, n: usize| -> Option<usize> {
            let b = data.get(pos..pos + n)?;
            let mut word = [0u8; 8];
            word[..n].copy_from_slice(b);
            usize::try_from(u64::from_le_bytes(word)).ok()
        };
        let depth = &mut self.depth;
        let marks = &mut self.marks;
        // Values below the innermost mark are not the opcode's to take.
        let fence = marks.last().copied().unwrap_or(0);
        match op {
            PROTO => pos += 1,
            FRAME => pos += 8,
            MARK => marks.push(*depth),
            POP => *depth = depth.checked_sub(1).filter(|&d| d >= fence)?,
            POP_MARK | APPENDS | SETITEMS | ADDITEMS => *depth = marks.pop()?,
            LIST | TUPLE | DICT | FROZENSET => *depth = marks.pop()? + 1,
            TUPLE1 => {}
            TUPLE2 | APPEND => *depth = depth.checked_sub(1).filter(|&d| d > fence)?,
            TUPLE3 | SETITEM => *depth = depth.checked_sub(2).filter(|&d| d > fence)?,
            DUP | NONE | NEWTRUE | NEWFALSE | EMPTY_LIST | EMPTY_TUPLE | EMPTY_SET => *depth += 1,
            EMPTY_DICT => {
                self.top_is_dict |= *depth == 0;
                *depth += 1;
            }
            BINGET | LONG_BINGET => {
                // Two thirds of a snapshot's opcodes are memo gets, in runs
                // (a frame list is one): stepped over in a loop of their own,
                // whose branches predict far better than the dispatch.
                let mut get = at;
                loop {
                    *depth += 1;
                    let next = get + if data[get] == BINGET { 2 } else { 5 };
                    match data.get(next) {
                        Some(&(BINGET | LONG_BINGET)) => get = next,
                        _ => {
                            pos = next;
                            break;
                        }
                    }
                }
                self.pos = pos;
                self.previous = get;
                self.last_op = BINGET;
                return Some(());
            }
            BININT1 => {
                pos += 1;
                *depth += 1;
            }
            BININT2 => {
                pos += 2;
                *depth += 1;
            }
            BININT => {
                pos += 4;
                *depth += 1;
            }
            BINFLOAT => {
                pos += 8;
                *depth += 1;
            }
            LONG1 | SHORT_BINBYTES => {
                pos += 1 + length(pos, 1)?;
                *depth += 1;
            }
            LONG4 | BINBYTES => {
                pos += 4 + length(pos, 4)?;
                *depth += 1;
            }
            BINBYTES8 | BYTEARRAY8 => {
                pos += 8 + length(pos, 8)?;
                *depth += 1;
            }
            SHORT_BINUNICODE | BINUNICODE | BINUNICODE8 => {
                pos = string_at(data, at)?.1;
                *depth += 1;
            }
            MEMOIZE => self.made_at.push(self.previous as u32),
            BINPUT | LONG_BINPUT => {
                let width = if op == BINPUT { 1 } else { 4 };
                // Python's and PyTorch's picklers number the slots in order.
                if length(pos, width)? != self.made_at.len() {
                    return None;
                }
                self.made_at.push(self.previous as u32);
                pos += width;
            }
            _ => return None,
        }
        self.pos = pos;
        self.previous = at;
        if !matches!(op, MEMOIZE | BINPUT | LONG_BINPUT | FRAME) {
            self.last_op = op;
        }
        Some(())
    }
}

/// The text of the string opcode at `at` (SHORT_BINUNICODE, BINUNICODE or
/// BINUNICODE8), and the position after it.
pub(crate) fn string_at(data: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let width = match data[at] {
        SHORT_BINUNICODE => 1,
        BINUNICODE => 4,
        _ => 8,
    };
    let mut len = [0u8; 8];
    len[..width].copy_from_slice(data.get(at + 1..at + 1 + width)?);
    let start = at + 1 + width;
    let end = start.checked_add(usize::try_from(u64::from_le_bytes(len)).ok()?)?;
    Some((data.get(start..end)?, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's own pickle of `{"segments": [...], "device_traces": [...]}`,
    /// protocol 4 (`pickle.dumps(d, 4)` of
    /// `{"segments": [{"a": "x"}], "device_traces": [["x"]]}`).
    const PYTHON_PICKLE: &[u8] = b"\x80\x04\x95\x36\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94}\x94\x8c\x01a\x94\x8c\x01x\x94sa\x8c\x0ddevice_traces\x94]\x94]\x94h\x05aau.";

    #[test]
    fn the_trace_key_is_found_with_the_memo_before_it() {
        let split = find(PYTHON_PICKLE, |_| None).expect("found");
        assert_eq!(&PYTHON_PICKLE[split.at + 2..split.at + 15], TRACE_KEY);
        assert_eq!(split.pairs, 1);
        // The dict, "segments", the list, the segment dict, "a", "x".
        let made: Vec<u8> = split
            .made_at
            .iter()
            .map(|&p| PYTHON_PICKLE[p as usize])
            .collect();
        assert_eq!(
            made,
            [
                EMPTY_DICT,
                SHORT_BINUNICODE,
                EMPTY_LIST,
                EMPTY_DICT,
                SHORT_BINUNICODE,
                SHORT_BINUNICODE
            ]
        );
    }

    #[test]
    fn only_a_large_file_whose_trace_outweighs_its_segments_splits_inside_it() {
        const MIB: usize = 1 << 20;
        // The real-shaped files: segments before 30%, 27% and 34% of the
        // file, read in about the time of the trace after them.
        assert_eq!(balanced_split(213 * MIB, 64 * MIB), None);
        assert_eq!(balanced_split(584 * MIB, 155 * MIB), None);
        assert_eq!(balanced_split(980 * MIB, 335 * MIB), None);
        // A trace alone: 62.5% of the way through.
        assert_eq!(balanced_split(265 * MIB, 0), Some(265 * MIB * 5 / 8));
        // A short one, split at its key whatever its shape.
        assert_eq!(balanced_split(36 * MIB, 0), None);
        // More trace than segments by weight: inside, where 3 x 40 MiB
        // + 160 MiB = 0.4 x 200 MiB + 200 MiB.
        assert_eq!(balanced_split(400 * MIB, 40 * MIB), Some(200 * MIB));
    }

    #[test]
    fn a_key_inside_a_value_is_not_the_top_dicts() {
        // `{"segments": [{"device_traces": 1}]}`: the key is one level down.
        let data = b"\x80\x04\x95\x27\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x08segments\x94]\x94}\x94\x8c\x0ddevice_traces\x94K\x01sas.";
        assert!(find(data, |_| None).is_none());
    }

    #[test]
    fn objects_and_truncation_give_up() {
        assert!(find(b"\x80\x04}\x94(\x8c\x01a\x94c", |_| None).is_none());
        assert!(find(&PYTHON_PICKLE[..30], |_| None).is_none());
    }
}
