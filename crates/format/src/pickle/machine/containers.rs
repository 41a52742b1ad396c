//! The opcodes that fill containers and the memo: lists and dicts built
//! item by item, each completed dict lowered into a typed record at once
//! (see [`Lowerer`](crate::pickle::lower::Lowerer)), and the memo's puts
//! and gets.

use hashbrown::HashTable;

use crate::error::{ErrorKind, Result};
use crate::pickle::heap::{Container, MemoRef, Val};
use crate::pickle::machine::{MEMO_SLACK, Machine};
use crate::pickle::opcodes;

impl Machine<'_> {
    /// APPEND: the value on top into the list below it.
    pub(super) fn append(&mut self, op: u8, at: usize) -> Result<()> {
        let item = self.pop(op, at)?;
        let target = self.top_container(op, at)?;
        if !self.lower.fill_list(&mut self.heap, target, &[item]) {
            self.place_one(item, at)?;
            self.extend(target, std::iter::once(item), op, at)?;
        }
        Ok(())
    }

    /// APPENDS (and ADDITEMS): the values above the innermost mark into the
    /// list (or set) below it.
    pub(super) fn appends(&mut self, op: u8, at: usize) -> Result<()> {
        let mark = self.pop_mark(op, at)?;
        let target = self.container_below(mark, op, at)?;
        // A fresh list of frames (the common case): straight to a stack.
        if self
            .lower
            .fill_list(&mut self.heap, target, &self.stack[mark..])
        {
            self.stack.truncate(mark);
            return Ok(());
        }
        self.place(mark, at)?;
        self.lower.unlower_list(&mut self.heap, target);
        match &mut self.heap.containers[target as usize] {
            Container::List(v) | Container::Set(v) => v.extend_from_slice(&self.stack[mark..]),
            _ => return Err(self.not_a(op, at, "list")),
        }
        self.stack.truncate(mark);
        self.lower.lower_list(&mut self.heap, target);
        Ok(())
    }

    /// The container just below `mark` (which was just popped): the target
    /// of APPENDS, SETITEMS and ADDITEMS.
    pub(super) fn container_below(&self, mark: usize, op: u8, at: usize) -> Result<u32> {
        if mark == 0 || mark <= self.fence() {
            return Err(self.underflow(op, at));
        }
        match self.stack[mark - 1] {
            Val::Obj(id) => Ok(id),
            Val::Frame(_) | Val::Event(_) | Val::Block(_) | Val::Stack(_) => {
                Err(self.changed_after_complete(op, at))
            }
            _ => Err(self.not_a(op, at, "container")),
        }
    }

    pub(super) fn top_container(&self, op: u8, at: usize) -> Result<u32> {
        match self.stack.last() {
            Some(Val::Obj(id)) if self.stack.len() > self.fence() => Ok(*id),
            Some(Val::Frame(_) | Val::Event(_) | Val::Block(_) | Val::Stack(_))
                if self.stack.len() > self.fence() =>
            {
                Err(self.changed_after_complete(op, at))
            }
            Some(_) => Err(self.error_at(
                ErrorKind::Malformed,
                format!(
                    "{} at byte {at} on a value that is not a container",
                    opcodes::name(op)
                ),
            )),
            None => Err(self.underflow(op, at)),
        }
    }

    pub(super) fn extend(
        &mut self,
        target: u32,
        items: impl Iterator<Item = Val>,
        op: u8,
        at: usize,
    ) -> Result<()> {
        self.lower.unlower_list(&mut self.heap, target);
        match &mut self.heap.containers[target as usize] {
            Container::List(v) | Container::Set(v) => {
                v.extend(items);
                self.lower.lower_list(&mut self.heap, target);
                Ok(())
            }
            _ => Err(self.error_at(
                ErrorKind::Malformed,
                format!(
                    "{} at byte {at} on a value that is not a list",
                    opcodes::name(op)
                ),
            )),
        }
    }

    pub(super) fn set_items(
        &mut self,
        target: u32,
        items: impl Iterator<Item = [Val; 2]>,
        op: u8,
        at: usize,
    ) -> Result<()> {
        match &mut self.heap.containers[target as usize] {
            Container::Dict(v) => {
                v.extend(items);
                Ok(())
            }
            Container::Frame(_)
            | Container::Event(_)
            | Container::Block(_)
            | Container::Segment(_) => Err(self.changed_after_complete(op, at)),
            _ => Err(self.not_a(op, at, "dict")),
        }
    }

    /// Lowers the dict on top of the stack to a typed record if it is one,
    /// and puts the record in its place; see [`Machine::record_in_place_of`].
    pub(super) fn lower_top(&mut self) {
        let Some(&Val::Obj(id)) = self.stack.last() else {
            return;
        };
        self.lower.lower_dict(&mut self.heap, id);
        self.record_in_place_of(id, None);
    }

    /// If container `id`, on top of the stack, was lowered to a frame, a
    /// trace event or a block, puts its stand-in ([`Val::Frame`],
    /// [`Val::Event`], [`Val::Block`]) in place of its handles, and those of
    /// `list`, the next container, a value of the dict it was lowered from
    /// (its frame list, if lowered to a stack), so that a trace of millions
    /// of events keeps no container for them.
    ///
    /// A record is final, and so is a list it took (a pickler writes a list
    /// whole before the dict that holds it): a stand-in reads the same as
    /// its container, and a change to either is refused.
    pub(super) fn record_in_place_of(&mut self, id: u32, list: Option<u32>) {
        let record = match self.heap.containers[id as usize] {
            Container::Frame(f) => Val::Frame(f),
            Container::Event(i) => Val::Event(i),
            Container::Block(i) => Val::Block(i),
            _ => return,
        };
        *self
            .stack
            .last_mut()
            .expect("the container is on the stack") = record;
        // A list made after the dict, with nothing made since (unless freed):
        // its handles are the dict's value, lowered now, and the memo's.
        if let Some(list) = list
            && let Some(&Container::Stack(stack)) = self.heap.containers.get(list as usize)
        {
            self.stand_in_for(list, Val::Stack(stack));
        }
        self.stand_in_for(id, record);
    }

    /// Puts `stand_in` in place of the memo's handle to container `id`, whose
    /// handle on the stack or in a record is already gone, and frees the
    /// container if it is the newest and no handle to it was copied.
    pub(super) fn stand_in_for(&mut self, id: u32, stand_in: Val) {
        let memo_ref = self.heap.memo_ref(id);
        if memo_ref == MemoRef::SHARED {
            return;
        }
        if let Some(slot) = memo_ref.slot()
            && self.memo.get(slot) == Some(Val::Obj(id))
        {
            self.memo.set(slot, stand_in);
        }
        if id as usize + 1 == self.heap.containers.len() {
            self.heap.free_newest(id);
        }
    }

    /// Frees container `id`, just popped off the stack, if nothing else can
    /// refer to it: it is the newest container, and no handle to it was
    /// memoized or copied. CPython frees such a value at once; without
    /// this, a file of EMPTY_DICT, POP pairs would grow the arena by a
    /// container per two bytes where CPython's memory stays flat.
    pub(super) fn reclaim(&mut self, id: u32) {
        if id as usize + 1 == self.heap.containers.len() && self.heap.memo_ref(id) == MemoRef::NONE
        {
            self.heap.free_newest(id);
        }
    }

    /// Notes that the values from `from` up the stack are being put into a
    /// list; see [`Lowerer::place`].
    pub(super) fn place(&mut self, from: usize, at: usize) -> Result<()> {
        let items = &self.stack[from.min(self.stack.len())..];
        self.lower.place(&self.heap, items).map_err(|what| {
            self.error_at(
                ErrorKind::Malformed,
                format!("the same {what} dict appears twice (at byte {at})"),
            )
        })
    }

    /// Notes that `item` is being put into a list; see [`Lowerer::place`].
    pub(super) fn place_one(&mut self, item: Val, at: usize) -> Result<()> {
        self.lower.place(&self.heap, &[item]).map_err(|what| {
            self.error_at(
                ErrorKind::Malformed,
                format!("the same {what} dict appears twice (at byte {at})"),
            )
        })
    }

    pub(super) fn put(&mut self, i: usize, op: u8, at: usize) -> Result<()> {
        let top = self.peek(op, at)?;
        if self
            .foreign
            .as_ref()
            .is_some_and(|made_at| i < made_at.len())
        {
            return Err(self.error_at(
                ErrorKind::Malformed,
                "the second half rewrites a memo slot of the first",
            ));
        }
        let gap = i.saturating_sub(self.memo.len());
        let written = self.memo.len() - self.memo_gaps;
        if i < self.memo.len() {
            // A rewritten slot may change what known get bytes stand for.
            // (A new table, not `clear`, which would cost the table's whole
            // capacity on every such PUT.)
            self.stacks_by_gets = HashTable::new();
            if self.memo.get(i) == Some(Val::Unset) {
                self.memo_gaps -= 1;
            }
            self.memo.set(i, top);
        } else if self.memo_gaps + gap <= written + MEMO_SLACK {
            self.memo.fill_to(i);
            self.memo.push(top);
            self.memo_gaps += gap;
        } else {
            self.stacks_by_gets = HashTable::new();
            self.far_memo.insert(i, top);
            // Handles out here are not looked for when freeing containers.
            if let Val::Obj(id) = top {
                self.heap.shared(id);
            }
            return Ok(());
        }
        if let Val::Obj(id) = top {
            self.heap.memoized(id, i);
        }
        Ok(())
    }

    pub(super) fn get(&mut self, i: usize, at: usize) -> Result<()> {
        let v = match self.memo.get(i) {
            Some(Val::Unset) | None => self
                .far_memo
                .get(&i)
                .copied()
                .or_else(|| self.resolve_foreign(i)),
            Some(v) => Some(v),
        };
        match v {
            Some(v) => {
                self.stack.push(v);
                if let Val::Obj(id) = v {
                    self.heap.shared(id);
                }
                Ok(())
            }
            None => Err(self.error_at(
                ErrorKind::Malformed,
                format!("memo slot {i} read at byte {at} was never written"),
            )),
        }
    }
}
