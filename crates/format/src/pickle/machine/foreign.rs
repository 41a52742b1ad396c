//! The memo slots a second half finds empty: those written before the
//! split, by the first half's part of the file (see `halves.rs`).
//!
//! The second half reads such a slot's value from the file itself the
//! first time a memo get asks for it, starting where the skim saw the value
//! made. A trace refers back to the strings (its keys, actions, frame
//! texts), frame dicts and frame lists of the segments before it; those are
//! read here, each as the machine would have lowered it. Any other value
//! (a block, a generic dict) is not: the get fails, the second half gives
//! up, and the first half reads on alone.

use std::borrow::Cow;

use crate::model::FrameId;
use crate::pickle::heap::{Record, Val};
use crate::pickle::machine::{FLAT_RECORD_ENTRIES, Machine, int_at};
use crate::pickle::opcodes::*;
use crate::pickle::skim;

/// How deep the reading of a value back may go: a frame list, a get of a
/// frame dict in it, the dict, a get of a string in it, the string (a
/// limit, as a pickle may make a list that holds itself).
const MAX_DEPTH: usize = 8;

impl Machine<'_> {
    /// The value of memo slot `i`, written before the split, read from the
    /// file and memoized; `None` outside a second half, for a slot the
    /// first half did not write, or for a value that is not a string, a
    /// frame dict or a frame list.
    pub(super) fn resolve_foreign(&mut self, i: usize) -> Option<Val> {
        self.foreign_slot(i, 0)
    }

    fn foreign_slot(&mut self, i: usize, depth: usize) -> Option<Val> {
        let at = *self.foreign.as_ref()?.get(i)? as usize;
        let (v, _) = self.foreign_value(at, depth + 1)?;
        self.memo.set(i, v);
        Some(v)
    }

    /// The value made at `at`, and the position after it and its memo put.
    pub(super) fn foreign_value(&mut self, at: usize, depth: usize) -> Option<(Val, usize)> {
        if depth > MAX_DEPTH {
            return None;
        }
        let data = self.data;
        let at = past_frames(data, at);
        let (v, next) = match *data.get(at)? {
            SHORT_BINUNICODE | BINUNICODE | BINUNICODE8 => self.foreign_str(at)?,
            EMPTY_DICT => self.foreign_frame(at, depth)?,
            EMPTY_LIST => self.foreign_stack(at, depth)?,
            BINGET | LONG_BINGET => {
                let (i, next) = super::memo_get_at(data, at)?;
                let v = match self.memo.get(i)? {
                    Val::Unset => self.foreign_slot(i, depth)?,
                    v => v,
                };
                (v, next)
            }
            NONE => (Val::None, at + 1),
            _ => {
                let (n, next) = int_at(data, at)?;
                (Val::Int(n), next)
            }
        };
        Some((v, after_put(data, next)))
    }

    /// The string at `at`, added to the heap; `None` if it is not UTF-8
    /// (the first half counts those).
    fn foreign_str(&mut self, at: usize) -> Option<(Val, usize)> {
        let (text, end) = skim::string_at(self.data, at)?;
        let s = std::str::from_utf8(text).ok()?;
        Some((Val::Str(self.heap.push_str(Cow::Borrowed(s))), end))
    }

    /// The frame dict made at `at` (EMPTY_DICT, its memo put, MARK, keys and
    /// values, SETITEMS), lowered.
    fn foreign_frame(&mut self, at: usize, depth: usize) -> Option<(Val, usize)> {
        let data = self.data;
        let mut pos = after_put(data, at + 1);
        if data.get(pos) != Some(&MARK) {
            return None;
        }
        pos = past_frames(data, pos + 1);
        let mut entries = Vec::new();
        while data.get(pos) != Some(&SETITEMS) {
            if entries.len() == FLAT_RECORD_ENTRIES {
                return None;
            }
            let (key, next) = self.foreign_value(pos, depth + 1)?;
            let (value, next) = self.foreign_value(next, depth + 1)?;
            entries.push([key, value]);
            pos = next;
        }
        match self.lower.lower_entries(&self.heap, &entries)? {
            Record::Frame(f) => Some((Val::Frame(f), pos + 1)),
            _ => None,
        }
    }

    /// The frame list made at `at` (EMPTY_LIST, its memo put, then its
    /// frames in MARK ... APPENDS batches, or one frame and APPEND),
    /// interned.
    fn foreign_stack(&mut self, at: usize, depth: usize) -> Option<(Val, usize)> {
        let data = self.data;
        let mut pos = after_put(data, at + 1);
        let mut frames: Vec<FrameId> = Vec::new();
        let frame = |machine: &mut Self, pos: usize| match machine.foreign_value(pos, depth + 1)? {
            (Val::Frame(f), next) => Some((f, next)),
            _ => None,
        };
        loop {
            pos = past_frames(data, pos);
            match data.get(pos) {
                Some(&MARK) => {
                    pos = past_frames(data, pos + 1);
                    while data.get(pos) != Some(&APPENDS) {
                        let (f, next) = frame(self, pos)?;
                        frames.push(f);
                        pos = next;
                    }
                    pos += 1;
                }
                _ if frames.is_empty() => {
                    let (f, next) = frame(self, pos)?;
                    if data.get(next) != Some(&APPEND) {
                        return None;
                    }
                    frames.push(f);
                    pos = next + 1;
                    break;
                }
                _ => break,
            }
        }
        Some((Val::Stack(self.lower.intern_stack(&frames)), pos))
    }
}

/// The position after the memo put (MEMOIZE, BINPUT or LONG_BINPUT) at
/// `pos`, if there is one there, and any FRAMEs around it.
fn after_put(data: &[u8], pos: usize) -> usize {
    let pos = past_frames(data, pos);
    past_frames(
        data,
        match data.get(pos) {
            Some(&MEMOIZE) => pos + 1,
            Some(&BINPUT) => pos + 2,
            Some(&LONG_BINPUT) => pos + 5,
            _ => pos,
        },
    )
}

/// The position after the FRAMEs at `pos`, if any: protocol 4 writes one
/// every 64 KiB, between any two opcodes.
fn past_frames(data: &[u8], mut pos: usize) -> usize {
    while data.get(pos) == Some(&FRAME) {
        pos += 9;
    }
    pos
}
