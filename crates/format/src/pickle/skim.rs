//! Finding where a snapshot pickle's trace begins without running it, so
//! that the part before (the segments) and the part from there on (the
//! trace) can be read on two threads (see `halves.rs`).
//!
//! The skim steps over the opcodes counting what they push and pop, as the
//! machine would, but makes no value: it keeps only the stack's depth, the
//! open marks, and where the value each memo slot holds was made. It takes
//! a small fraction of a full read (no strings are checked, no containers
//! made), and gives up (`None`) at anything a snapshot written by Python's
//! or PyTorch's pickler would not hold; the file is then read on one thread.

use crate::pickle::opcodes::*;

/// Where the top dict's `device_traces` key is written, and what the
/// machine would hold there.
pub(crate) struct Split {
    /// The position of the opcode that writes the key.
    pub(crate) at: usize,
    /// How many key-value pairs of the top dict are on the stack there,
    /// above its mark.
    pub(crate) pairs: usize,
    /// For each memo slot written before `at`, the position of the opcode
    /// that made its value (the one just before the MEMOIZE or PUT).
    pub(crate) made_at: Vec<u32>,
}

/// The key the trace is written under.
const TRACE_KEY: &[u8] = b"device_traces";

/// Finds the top dict's `device_traces` key in `data`, a pickle of a dict
/// written in protocol 2 or later. `None` if there is none, or if the
/// pickle holds anything a snapshot does not (an object, a protocol 0 text
/// opcode, a memo slot written out of order, a file past 4 GiB).
pub(crate) fn find(data: &[u8]) -> Option<Split> {
    // Positions are kept in 32 bits.
    u32::try_from(data.len()).ok()?;
    let mut pos = 0;
    let mut depth = 0usize;
    let mut marks: Vec<usize> = Vec::new();
    // Reserved for a slot every 16 bytes, as the machine reserves its memo.
    let mut made_at: Vec<u32> = Vec::with_capacity(data.len() / 16);
    let mut top_is_dict = false;
    let mut previous = 0usize;
    // The length of an argument of `n` little-endian bytes at `pos`.
    let length = |pos: usize, n: usize| -> Option<usize> {
        let b = data.get(pos..pos + n)?;
        let mut word = [0u8; 8];
        word[..n].copy_from_slice(b);
        usize::try_from(u64::from_le_bytes(word)).ok()
    };
    loop {
        let at = pos;
        let op = *data.get(at)?;
        pos += 1;
        // Values below the innermost mark are not the opcode's to take.
        let fence = || marks.last().copied().unwrap_or(0);
        // The stack depth the opcode leaves, from the depth it finds.
        match op {
            PROTO => pos += 1,
            FRAME => pos += 8,
            MARK => marks.push(depth),
            POP => depth = depth.checked_sub(1).filter(|&d| d >= fence())?,
            POP_MARK | APPENDS | SETITEMS | ADDITEMS => depth = marks.pop()?,
            LIST | TUPLE | DICT | FROZENSET => depth = marks.pop()? + 1,
            TUPLE1 => {}
            TUPLE2 | APPEND => depth = depth.checked_sub(1).filter(|&d| d > fence())?,
            TUPLE3 | SETITEM => depth = depth.checked_sub(2).filter(|&d| d > fence())?,
            DUP | NONE | NEWTRUE | NEWFALSE | EMPTY_LIST | EMPTY_TUPLE | EMPTY_SET => depth += 1,
            EMPTY_DICT => {
                top_is_dict |= depth == 0;
                depth += 1;
            }
            BINGET | LONG_BINGET => {
                // Two thirds of a snapshot's opcodes are memo gets, in runs
                // (a frame list is one): stepped over in a loop of their own,
                // whose branches predict far better than the dispatch.
                let mut get = at;
                loop {
                    depth += 1;
                    let next = get + if data[get] == BINGET { 2 } else { 5 };
                    match data.get(next) {
                        Some(&(BINGET | LONG_BINGET)) => get = next,
                        _ => {
                            pos = next;
                            break;
                        }
                    }
                }
                previous = get;
                continue;
            }
            BININT1 => {
                pos += 1;
                depth += 1;
            }
            BININT2 => {
                pos += 2;
                depth += 1;
            }
            BININT => {
                pos += 4;
                depth += 1;
            }
            BINFLOAT => {
                pos += 8;
                depth += 1;
            }
            LONG1 | SHORT_BINBYTES => {
                pos += 1 + length(pos, 1)?;
                depth += 1;
            }
            LONG4 | BINBYTES => {
                pos += 4 + length(pos, 4)?;
                depth += 1;
            }
            BINBYTES8 | BYTEARRAY8 => {
                pos += 8 + length(pos, 8)?;
                depth += 1;
            }
            SHORT_BINUNICODE | BINUNICODE | BINUNICODE8 => {
                let width = match op {
                    SHORT_BINUNICODE => 1,
                    BINUNICODE => 4,
                    _ => 8,
                };
                let n = length(pos, width)?;
                let text = data.get(pos + width..(pos + width).checked_add(n)?)?;
                // A key of the top dict: above its one mark, at an even place.
                if text == TRACE_KEY && top_is_dict && marks == [1] && (depth - 1).is_multiple_of(2)
                {
                    return Some(Split {
                        at,
                        pairs: (depth - 1) / 2,
                        made_at,
                    });
                }
                pos += width + n;
                depth += 1;
            }
            MEMOIZE => made_at.push(previous as u32),
            BINPUT | LONG_BINPUT => {
                let width = if op == BINPUT { 1 } else { 4 };
                // Python's and PyTorch's picklers number the slots in order.
                if length(pos, width)? != made_at.len() {
                    return None;
                }
                made_at.push(previous as u32);
                pos += width;
            }
            _ => return None,
        }
        previous = at;
    }
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
        let split = find(PYTHON_PICKLE).expect("found");
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
    fn a_key_inside_a_value_is_not_the_top_dicts() {
        // `{"segments": [{"device_traces": 1}]}`: the key is one level down.
        let data = b"\x80\x04\x95\x27\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x08segments\x94]\x94}\x94\x8c\x0ddevice_traces\x94K\x01sas.";
        assert!(find(data).is_none());
    }

    #[test]
    fn objects_and_truncation_give_up() {
        assert!(find(b"\x80\x04}\x94(\x8c\x01a\x94c").is_none());
        assert!(find(&PYTHON_PICKLE[..30]).is_none());
    }
}
