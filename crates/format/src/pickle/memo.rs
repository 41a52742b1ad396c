//! The pickle memo, 4 bytes a slot where a [`Val`] takes 16.
//!
//! A snapshot pickle memoizes every dict, list and string it writes, a slot
//! for every 20 to 60 bytes of file, and the memo lives until the pickle
//! ends: on a file of a million blocks and two million events, 3.6 million
//! slots, held at the read's peak (`summary`'s peak on that 213 MiB file:
//! 1.31x – 1.33x the file at 8 bytes a slot, 1.18x – 1.21x at 4). What
//! pickles memoize are strings and containers, whose handles are indexes:
//! a slot holds the kind of value in its top 4 bits and the index in the
//! other 28; a value that does not fit (an index past 2^28, an integer or a
//! float some other writer memoized) is kept aside, and its slot holds its
//! index there.

use super::heap::Val;

/// One memo slot: its [`Kind`] in the top [`KIND_BITS`] bits, its index or
/// payload below.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot(u32);

const KIND_BITS: u32 = 4;
const INDEX_BITS: u32 = 32 - KIND_BITS;
/// The largest index a slot holds itself.
const MAX_INDEX: u32 = (1 << INDEX_BITS) - 1;

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

/// Kinds by their number, for reading a slot back.
const KINDS: [Kind; 16] = {
    use Kind::*;
    [
        Unset, None, Bool, Big, Str, Bytes, Obj, Frame, Event, Block, Stack, Wide, Unset, Unset,
        Unset, Unset,
    ]
};

impl Slot {
    const UNSET: Slot = Slot(0);

    fn new(kind: Kind, index: u32) -> Slot {
        debug_assert!(index <= MAX_INDEX);
        Slot(((kind as u32) << INDEX_BITS) | index)
    }

    fn kind(self) -> Kind {
        KINDS[(self.0 >> INDEX_BITS) as usize]
    }

    fn index(self) -> u32 {
        self.0 & MAX_INDEX
    }
}

/// The memo: slot `i` is what PUT or MEMOIZE `i` stored.
pub(crate) struct Memo {
    slots: Vec<Slot>,
    /// Memoized values that do not fit a slot, in the order they were stored.
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
        let index = slot.index();
        Some(match slot.kind() {
            Kind::Unset => Val::Unset,
            Kind::None => Val::None,
            Kind::Bool => Val::Bool(index != 0),
            Kind::Big => Val::Big(index),
            Kind::Str => Val::Str(index),
            Kind::Bytes => Val::Bytes(index),
            Kind::Obj => Val::Obj(index),
            Kind::Frame => Val::Frame(index),
            Kind::Event => Val::Event(index),
            Kind::Block => Val::Block(index),
            Kind::Stack => Val::Stack(index),
            // Past 2^28 wide values the index saturates: such a slot reads
            // as never written (an error naming it), not as another value.
            Kind::Wide => self.wide_value(index),
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
        self.slots.resize(len, Slot::UNSET);
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
        if index > MAX_INDEX {
            return self.wide_slot(v);
        }
        Slot::new(kind, index)
    }

    #[cold]
    fn wide_value(&self, index: u32) -> Val {
        match self.wide.get(index as usize) {
            Some(&v) if index != MAX_INDEX => v,
            _ => Val::Unset,
        }
    }

    /// The slot of a value that does not fit one, kept aside.
    #[cold]
    fn wide_slot(&mut self, v: Val) -> Slot {
        self.wide.push(v);
        let index = u32::try_from(self.wide.len() - 1).map_or(MAX_INDEX, |i| i.min(MAX_INDEX));
        Slot::new(Kind::Wide, index)
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
            Val::Obj(MAX_INDEX),
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
        assert_eq!(std::mem::size_of::<Slot>(), 4);
    }
}
