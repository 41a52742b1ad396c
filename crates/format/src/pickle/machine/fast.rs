//! The machine's fast paths for what PyTorch's snapshots are made of:
//! frame lists of memo gets, frame dicts, and flat records (trace events,
//! blocks) read straight into typed records instead of opcode by opcode.

use super::*;

impl<'a> Machine<'a> {
    /// Reads a frame list as pickles write it, when a MARK has just been put
    /// above an empty list: memo gets of frame dicts already lowered, then
    /// APPENDS. This is the commonest construct in a snapshot; here it goes
    /// straight into an interned stack without its values going through the
    /// stack. Anything else (a new frame dict, any other value) leaves the
    /// opcodes to `execute`, which runs them one by one.
    ///
    /// PyTorch writes each distinct stack many times over (the inference
    /// fixture: 2561 frame lists, 116 stacks), so a list whose get bytes were
    /// read before is known by them alone: the same gets read the same memo
    /// slots, which hold the same frames as long as no PUT rewrites a slot
    /// (`put` forgets them all when one does).
    pub(super) fn frame_list(&mut self) {
        // The list must be above any enclosing MARK, as APPENDS requires.
        let enclosing = self.marks.iter().rev().nth(1).copied().unwrap_or(0);
        if self.stack.len() <= enclosing {
            return;
        }
        let Some(&Val::Obj(list)) = self.stack.last() else {
            return;
        };
        if !matches!(&self.heap.containers[list as usize], Container::List(items) if items.is_empty())
        {
            return;
        }
        let data = self.data;
        let start = self.pos;
        let end = memo_gets_end(data, start);
        if end == start || data.get(end) != Some(&APPENDS) {
            self.written_frame_list(list);
            return;
        }
        let gets = &data[start..end];
        let hasher = &self.gets_hasher;
        let hash = hasher.hash_one(gets);
        let known = self
            .stacks_by_gets
            .find(hash, |&(at, len, _)| &data[at..at + len] == gets);
        let stack = match known {
            Some(&(_, _, stack)) => stack,
            None => {
                let memo = &self.memo;
                let frames = &mut self.frame_run;
                frames.clear();
                let mut pos = start;
                while let Some((i, next)) = memo_get_at(data, pos).filter(|_| pos < end) {
                    match memo.get(i) {
                        Some(Val::Frame(f)) => frames.push(f),
                        _ => return,
                    }
                    pos = next;
                }
                let stack = self.lower.intern_stack(&self.frame_run);
                self.stacks_by_gets.insert_unique(
                    hash,
                    (start, gets.len(), stack),
                    |&(at, len, _)| hasher.hash_one(&data[at..at + len]),
                );
                stack
            }
        };
        self.marks.pop();
        self.pos = end + 1;
        self.heap.settle(list, Record::Stack(stack));
    }

    /// Reads frame list `list` (just MARKed) when it is not all memo gets,
    /// as in files that write frames out in full: frame dicts as
    /// [`Machine::frame_dict`] reads them and memo gets of lowered frames,
    /// then APPENDS; the frames go straight into an interned stack, never
    /// onto the stack. At anything else it stops, leaving the frames read so
    /// far on the stack, as `execute` would have, for it to go on from there.
    fn written_frame_list(&mut self, list: u32) {
        let data = self.data;
        let mut frames = std::mem::take(&mut self.frame_run);
        frames.clear();
        let complete = loop {
            match data.get(self.pos).copied() {
                Some(EMPTY_DICT) => {
                    self.pos += 1;
                    let Some(frame) = self.frame_dict() else {
                        self.pos -= 1;
                        break false;
                    };
                    self.memo.push(Val::Frame(frame));
                    frames.push(frame);
                }
                Some(APPENDS) if !frames.is_empty() => {
                    self.pos += 1;
                    break true;
                }
                _ => match memo_get_at(data, self.pos) {
                    Some((i, next)) => match self.memo.get(i) {
                        Some(Val::Frame(frame)) => {
                            frames.push(frame);
                            self.pos = next;
                        }
                        _ => break false,
                    },
                    None => break false,
                },
            }
        };
        if complete {
            let stack = self.lower.intern_stack(&frames);
            self.marks.pop();
            self.heap.settle(list, Record::Stack(stack));
        } else {
            self.stack.extend(frames.iter().map(|&f| Val::Frame(f)));
        }
        self.frame_run = frames;
    }

    /// Reads a frame dict as protocol 4 pickles write one whose keys and
    /// strings are already in the memo, straight from the bytes after its
    /// EMPTY_DICT: MEMOIZE, MARK, the gets of `name`, `filename` and `line`
    /// (in any order) with a get of a string or a small integer after each,
    /// then SETITEMS. Returns the frame's id, and moves past the SETITEMS;
    /// the caller memoizes the frame. Anything else returns `None` with
    /// nothing consumed, for `execute` to run opcode by opcode.
    ///
    /// Files that write each frame out in full rather than sharing it through
    /// the memo (the snapviewer sample: 3682 frame dicts in 115 KB) are mostly
    /// this; it makes no dict, and costs no dispatch per opcode.
    fn frame_dict(&mut self) -> Option<FrameId> {
        let data = self.data;
        let mut pos = self.pos;
        if let Some((name, file, line, next)) = self.short_frame_dict(pos) {
            self.pos = next;
            return Some(self.lower.plain_frame(&self.heap, name, file, line));
        }
        if data.get(pos..pos + 2)? != [MEMOIZE, MARK] {
            return None;
        }
        pos += 2;
        let memo = &self.memo;
        let string_at = |pos: usize| {
            let (i, next) = memo_get_at(data, pos)?;
            match memo.get(i)? {
                Val::Str(s) => Some((s, next)),
                _ => None,
            }
        };
        let (mut name, mut file, mut line) = (None, None, None);
        for _ in 0..3 {
            let (key, next) = string_at(pos)?;
            pos = next;
            match self.heap.keys[key as usize] {
                Key::Name if name.is_none() => {
                    let (s, next) = string_at(pos)?;
                    (name, pos) = (Some(s), next);
                }
                Key::Filename if file.is_none() => {
                    let (s, next) = string_at(pos)?;
                    (file, pos) = (Some(s), next);
                }
                Key::Line if line.is_none() => {
                    let (n, next) = line_at(data, pos)?;
                    (line, pos) = (Some(n), next);
                }
                _ => return None,
            }
        }
        if data.get(pos) != Some(&SETITEMS) {
            return None;
        }
        self.pos = pos + 1;
        let (name, file, line) = (name?, file?, line?);
        Some(self.lower.plain_frame(&self.heap, name, file, line))
    }

    /// [`Machine::frame_dict`] for its commonest layout, in fewer steps:
    /// keys in PyTorch's order (`name`, `filename`, `line`) and every get a
    /// two-byte BINGET, so that each sits at a fixed offset from `pos`.
    /// Returns the name and file (heap string ids), the line, and the
    /// position after the SETITEMS.
    fn short_frame_dict(&self, pos: usize) -> Option<(u32, u32, u32, usize)> {
        let b = self.data.get(pos..pos + 12)?;
        if b[..3] != [MEMOIZE, MARK, BINGET] || [b[4], b[6], b[8], b[10]] != [BINGET; 4] {
            return None;
        }
        let string = |i: u8| match self.memo.get(usize::from(i)) {
            Some(Val::Str(s)) => Some(s),
            _ => None,
        };
        let key = |i: u8| string(i).map(|s| self.heap.keys[s as usize]);
        if [key(b[3])?, key(b[7])?, key(b[11])?] != FRAME_KEYS {
            return None;
        }
        let (name, file) = (string(b[5])?, string(b[9])?);
        let (line, next) = line_at(self.data, pos + 12)?;
        if self.data.get(next) != Some(&SETITEMS) {
            return None;
        }
        Some((name, file, line, next + 1))
    }

    /// Reads the dict begun by the EMPTY_DICT just run straight from its
    /// bytes, when it is a flat record as protocol 4 writes one: MEMOIZE,
    /// MARK, keys and values that are each a [`flat_value`], SETITEMS, and
    /// keys that make it a trace event, a block or a frame. Its record goes
    /// on the stack and into its memo slot, as when `execute` lowers the
    /// dict, but with no dict made and no opcode dispatched: PyTorch writes
    /// a record like this for every event and block. Anything else returns
    /// false with nothing consumed, for `execute` to run opcode by opcode.
    pub(super) fn flat_record(&mut self) -> bool {
        let data = self.data;
        if data.get(self.pos..self.pos + 2) != Some(&[MEMOIZE, MARK]) {
            return false;
        }
        let mut pos = self.pos + 2;
        let entries = &mut self.flat_entries;
        entries.clear();
        while data.get(pos) != Some(&SETITEMS) {
            if entries.len() == FLAT_RECORD_ENTRIES {
                return false;
            }
            let Some((key, next)) = flat_value(data, &self.memo, pos) else {
                return false;
            };
            let Some((value, next)) = flat_value(data, &self.memo, next) else {
                return false;
            };
            entries.push([key, value]);
            pos = next;
        }
        let Some(record) = self.lower.lower_entries(&self.heap, entries) else {
            return false;
        };
        let stand_in = match record {
            Record::Frame(f) => Val::Frame(f),
            Record::Stack(s) => Val::Stack(s),
            Record::Event(i) => Val::Event(i),
            Record::Block(i) => Val::Block(i),
        };
        self.memo.push(stand_in);
        push_new(&mut self.stack, || stand_in);
        self.pos = pos + 1;
        true
    }

    /// Runs the MEMOIZE and MARK that follow new container `id` (just pushed)
    /// in protocol 4 pickles, without a trip through `execute`'s dispatch for
    /// each: a dispatch costs most when its target is hard to predict, and
    /// this pair follows nearly every dict and list. Says whether it ran the
    /// MARK (after which a new list may be a frame list).
    pub(super) fn memoize_and_mark(&mut self, id: u32) -> bool {
        if self.data.get(self.pos) != Some(&MEMOIZE) {
            return false;
        }
        self.pos += 1;
        self.memo.push(Val::Obj(id));
        self.heap.memoized(id, self.memo.len() - 1);
        if self.data.get(self.pos) != Some(&MARK) {
            return false;
        }
        self.pos += 1;
        self.marks.push(self.stack.len());
        true
    }

    /// Runs the BINGETs and LONG_BINGETs that follow, in one tight loop: they
    /// are two thirds of a snapshot's opcodes (a frame list is a run of them),
    /// and going back through `execute`'s dispatch for each costs more than
    /// the get itself. Also run after integers, which in a snapshot are dict
    /// values followed by the get of the next key. Stops, without consuming it, at anything else or at a
    /// get that would fail, which `execute` then runs and reports as usual.
    pub(super) fn more_gets(&mut self) {
        let data = self.data;
        let mut pos = self.pos;
        // Locals, so that the loop keeps them in registers.
        let memo = &self.memo;
        let stack = &mut self.stack;
        while stack.len() <= MAX_STACK
            && let Some((i, next)) = memo_get_at(data, pos)
        {
            match memo.get(i) {
                // A container's handle is copied by `get`, which notes it.
                Some(v) if !matches!(v, Val::Unset | Val::Obj(_)) => stack.push(v),
                _ => break,
            }
            pos = next;
        }
        self.pos = pos;
    }
}
