//! The pickle memo, 8 bytes a slot where a [`Val`] takes 16.
//!
//! A snapshot pickle memoizes every dict, list and string it writes, a slot
//! for every 20 to 60 bytes of file, and the memo lives until the pickle
//! ends: on a file of a million blocks and two million events, 3.6 million
//! slots, held at the read's peak. What pickles memoize are strings and
//! containers, whose handles are 32-bit indexes; a wider value (an integer
//! or a float some other writer memoized) is kept aside, and its slot holds
//! its index there.

use super::heap::Val;

/// One memo slot: what kind of value, and its 32-bit index or payload.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot {
    kind: Kind,
    index: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Kind {
    Unset,
    None,
    Bool,
    Big,
    Str,
    Bytes,
    Obj,
    Frame,
    Event,
    Block,
    Stack,
    /// An index into [`Memo::wide`].
    Wide,
}

/// The memo: slot `i` is what PUT or MEMOIZE `i` stored.
pub(crate) struct Memo {
    slots: Vec<Slot>,
    /// Memoized values wider than 32 bits, in the order they were stored.
    wide: Vec<Val>,
}

impl Memo {
    /// A memo with room for `n` slots (address space, not memory, until used).
    pub(crate) fn with_capacity(n: usize) -> Memo {
        Memo {
            slots: Vec::with_capacity(n),
            wide: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slot `i`: [`Val::Unset`] if it lies in a gap never written, `None`
    /// past the end.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> Option<Val> {
        let slot = *self.slots.get(i)?;
        Some(match slot.kind {
            Kind::Unset => Val::Unset,
            Kind::None => Val::None,
            Kind::Bool => Val::Bool(slot.index != 0),
            Kind::Big => Val::Big(slot.index),
            Kind::Str => Val::Str(slot.index),
            Kind::Bytes => Val::Bytes(slot.index),
            Kind::Obj => Val::Obj(slot.index),
            Kind::Frame => Val::Frame(slot.index),
            Kind::Event => Val::Event(slot.index),
            Kind::Block => Val::Block(slot.index),
            Kind::Stack => Val::Stack(slot.index),
            // Past 2^32 wide values the index saturates: such a slot reads
            // as never written (an error naming it), not as another value.
            Kind::Wide => self.wide_value(slot.index),
        })
    }

    /// Stores `v` in the next slot.
    #[inline(always)]
    pub(crate) fn push(&mut self, v: Val) {
        let slot = self.slot(v);
        self.slots.push(slot);
    }

    /// Stores `v` in slot `i`, which exists.
    pub(crate) fn set(&mut self, i: usize, v: Val) {
        self.slots[i] = self.slot(v);
    }

    /// Extends the memo to `len` slots with gaps never written.
    pub(crate) fn fill_to(&mut self, len: usize) {
        let unset = Slot {
            kind: Kind::Unset,
            index: 0,
        };
        self.slots.resize(len, unset);
    }

    #[inline(always)]
    fn slot(&mut self, v: Val) -> Slot {
        let (kind, index) = match v {
            Val::Unset => (Kind::Unset, 0),
            Val::None => (Kind::None, 0),
            Val::Bool(b) => (Kind::Bool, u32::from(b)),
            Val::Big(i) => (Kind::Big, i),
            Val::Str(i) => (Kind::Str, i),
            Val::Bytes(i) => (Kind::Bytes, i),
            Val::Obj(i) => (Kind::Obj, i),
            Val::Frame(i) => (Kind::Frame, i),
            Val::Event(i) => (Kind::Event, i),
            Val::Block(i) => (Kind::Block, i),
            Val::Stack(i) => (Kind::Stack, i),
            Val::Int(_) | Val::Float(_) => return self.wide_slot(v),
        };
        Slot { kind, index }
    }

    #[cold]
    fn wide_value(&self, index: u32) -> Val {
        match self.wide.get(index as usize) {
            Some(&v) if index != u32::MAX => v,
            _ => Val::Unset,
        }
    }

    /// The slot of an integer or float, kept aside.
    #[cold]
    fn wide_slot(&mut self, v: Val) -> Slot {
        self.wide.push(v);
        Slot {
            kind: Kind::Wide,
            index: u32::try_from(self.wide.len() - 1).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_value_reads_back_as_stored() {
        let values = [
            Val::Unset,
            Val::None,
            Val::Bool(true),
            Val::Bool(false),
            Val::Int(-(1 << 60)),
            Val::Big(7),
            Val::Float(0.5),
            Val::Str(u32::MAX),
            Val::Bytes(3),
            Val::Obj(9),
            Val::Frame(1),
            Val::Event(2),
            Val::Block(4),
            Val::Stack(5),
        ];
        let mut memo = Memo::with_capacity(0);
        for v in values {
            memo.push(v);
        }
        memo.set(1, Val::Int(42));
        memo.fill_to(values.len() + 2);
        let read: Vec<Val> = (0..memo.len()).filter_map(|i| memo.get(i)).collect();
        let mut expected = values.to_vec();
        expected[1] = Val::Int(42);
        expected.extend([Val::Unset, Val::Unset]);
        assert_eq!(read, expected);
        assert_eq!(memo.get(memo.len()), None);
        assert_eq!(std::mem::size_of::<Slot>(), 8);
    }
}
