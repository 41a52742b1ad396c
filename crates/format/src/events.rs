//! A device's trace events, stored column by column.
//!
//! Traces run to tens of millions of events. As a vector of [`TraceEvent`]
//! structs they take 112 bytes each, most of it room for options that are
//! rarely set. Stored here as one column per field, with presence bitmaps
//! for the optional ones, side lists for the rare ones, and one value for a
//! column whose events all have the same (the stream of a single-stream
//! program, PyTorch's compile context `N/A` and empty user metadata), they
//! take 25 to 41.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{Action, EventDetails, StackId, StrId, TraceEvent};

/// Code of an action without a code of its own in the action column; its
/// name is kept beside it.
pub(crate) const OTHER_ACTION: u8 = u8::MAX;

/// The recorded events of one device, oldest first, one column per field
/// (see the module documentation). Built by pushing events or collecting
/// them; read by iterating, which yields each event as a [`TraceEvent`].
///
/// ```
/// use snapdiff_format::{Action, Events, TraceEvent};
///
/// let events: Events = (0..3)
///     .map(|i| TraceEvent { action: Action::Alloc, address: 512 * i, size: 512, ..Default::default() })
///     .collect();
/// assert_eq!(events.len(), 3);
/// assert_eq!(events.get(2).map(|e| e.address), Some(1024));
/// assert_eq!(events.iter().map(|e| e.size).sum::<u64>(), 1536);
/// ```
///
/// Every column holds one value per event, and the side lists are sorted by
/// event; the `.snap` reader (`columns.rs`) builds the columns directly and
/// checks both.
#[derive(Clone, Default, PartialEq)]
pub struct Events {
    /// One code per event; [`OTHER_ACTION`] for actions without a code.
    pub(crate) actions: Vec<u8>,
    /// The names of actions without a code, with the index of their event.
    pub(crate) other_actions: Vec<(usize, Box<str>)>,
    pub(crate) address: Vec<u64>,
    pub(crate) size: Vec<u64>,
    pub(crate) stream: Column<i64>,
    pub(crate) time_us: Optional<i64>,
    pub(crate) stack: Optional<StackId>,
    pub(crate) compile_context: Optional<StrId>,
    pub(crate) user_metadata: Optional<StrId>,
    /// Allocation sequence numbers, with the index of their event: only
    /// snapdiff's own allocator records them, and only for allocations.
    pub(crate) alloc_seq: Vec<(usize, u64)>,
    /// The rare fields, with the index of their event.
    pub(crate) details: Vec<(usize, Box<EventDetails>)>,
}

/// A field's values, one per event: a single value while every event has
/// the same, a vector from the first that differs.
#[derive(Clone, Debug)]
pub(crate) enum Column<T> {
    Same { value: T, len: usize },
    Each(Vec<T>),
}

impl<T: Copy + Default> Default for Column<T> {
    fn default() -> Self {
        Column::Same {
            value: T::default(),
            len: 0,
        }
    }
}

impl<T: Copy + Default + PartialEq> Column<T> {
    fn len(&self) -> usize {
        match self {
            Column::Same { len, .. } => *len,
            Column::Each(values) => values.len(),
        }
    }

    /// Adds `v` after the last value, in a column expected to hold about
    /// `room` values (0 if unknown): the first value that differs makes a
    /// vector with that much room, instead of one that doubles as it grows
    /// and copies its values into fresh pages each time (6,000 of the
    /// 75,700 page faults of `summary` of a 213 MiB real-shaped pickle).
    #[inline(always)]
    pub(crate) fn push(&mut self, v: T, room: usize) {
        match self {
            Column::Same { value, len } if *len == 0 || *value == v => {
                *value = v;
                *len += 1;
            }
            Column::Same { len, .. } => {
                let capacity = (*len * 2).max(room);
                self.spread_within(v, capacity);
            }
            Column::Each(values) => values.push(v),
        }
    }

    /// Turns one value for all into a value for each, in room for
    /// `capacity` values, then adds `v`.
    #[cold]
    fn spread_within(&mut self, v: T, capacity: usize) {
        if let Column::Same { value, len } = *self {
            let mut values = Vec::with_capacity(capacity.max(len + 1));
            values.resize(len, value);
            values.push(v);
            *self = Column::Each(values);
        }
    }

    /// The column of `n` values given by `next` in order, in exactly the
    /// room it needs: a reader that knows the count does not leave a
    /// doubled vector behind (a third more memory for a long trace).
    pub(crate) fn read<E>(n: usize, mut next: impl FnMut() -> Result<T, E>) -> Result<Self, E> {
        let mut column = Column::default();
        for _ in 0..n {
            let v = next()?;
            match &mut column {
                Column::Same { value, len } if *len == 0 || *value == v => {
                    *value = v;
                    *len += 1;
                }
                Column::Same { .. } => column.spread_within(v, n),
                Column::Each(values) => values.push(v),
            }
        }
        Ok(column)
    }

    /// The value of event `i` (the default past the end).
    #[inline(always)]
    fn get(&self, i: usize) -> T {
        match self {
            Column::Same { value, .. } => *value,
            Column::Each(values) => values.get(i).copied().unwrap_or_default(),
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            Column::Same { len, .. } => *len = (*len).min(n),
            Column::Each(values) => values.truncate(n),
        }
    }

    /// Adds `other`'s values after these.
    fn append(&mut self, other: Column<T>) {
        let n = other.len();
        match (&mut *self, other) {
            (Column::Same { value, len }, Column::Same { value: v, .. })
                if *len == 0 || n == 0 || *value == v =>
            {
                if *len == 0 {
                    *value = v;
                }
                *len += n;
            }
            (_, other) => {
                if let Column::Same { value, len } = *self {
                    let mut values = Vec::with_capacity(len + n);
                    values.resize(len, value);
                    *self = Column::Each(values);
                }
                let Column::Each(values) = self else {
                    unreachable!("made a vector above")
                };
                values.reserve_exact(n);
                match other {
                    Column::Each(more) => values.extend_from_slice(&more),
                    Column::Same { value, len } => values.resize(values.len() + len, value),
                }
            }
        }
    }
}

/// Equal when the values are, however they are stored.
impl<T: Copy + Default + PartialEq> PartialEq for Column<T> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Column::Each(a), Column::Each(b)) => a == b,
            _ => self.len() == other.len() && (0..self.len()).all(|i| self.get(i) == other.get(i)),
        }
    }
}

/// An optional field: a value per event (the default where it has none)
/// and a bitmap of the events that have one.
#[derive(Clone, Default, PartialEq)]
pub(crate) struct Optional<T: Copy + Default + PartialEq> {
    values: Column<T>,
    present: Vec<u64>,
}

impl<T: Copy + Default + PartialEq> Optional<T> {
    /// The field of `n` events, present where bit `i` of `present` (a
    /// bitmap of bytes, as `.snap` files store it) is set, with the values
    /// present given by `next` in order.
    pub(crate) fn read<E>(
        present: &[u8],
        n: usize,
        mut next: impl FnMut() -> Result<T, E>,
    ) -> Result<Optional<T>, E> {
        let mut bits = vec![0; n.div_ceil(64)];
        let mut i = 0;
        let values = Column::read(n, || {
            let value = if present[i / 8] & (1 << (i % 8)) != 0 {
                bits[i / 64] |= 1 << (i % 64);
                next()?
            } else {
                T::default()
            };
            i += 1;
            Ok(value)
        })?;
        Ok(Optional {
            values,
            present: bits,
        })
    }

    /// Adds `value` after the last, in a field expected to hold about
    /// `room` values (see [`Column::push`]).
    #[inline(always)]
    fn push(&mut self, value: Option<T>, room: usize) {
        let i = self.values.len();
        if i.is_multiple_of(64) {
            self.present.push(0);
        }
        if value.is_some() {
            self.present[i / 64] |= 1 << (i % 64);
        }
        self.values.push(value.unwrap_or_default(), room);
    }

    /// The value of event `i`, if it has one.
    #[inline(always)]
    fn get(&self, i: usize) -> Option<T> {
        has(&self.present, i).then(|| self.values.get(i))
    }

    /// The first event whose value is present and `limit` or more, with
    /// the value: a pass over the column, not over whole events.
    fn first_at_least(&self, limit: T) -> Option<(usize, T)>
    where
        T: PartialOrd,
    {
        match &self.values {
            Column::Same { value, .. } if *value < limit => None,
            Column::Same { value, len } => (0..*len)
                .find(|&i| has(&self.present, i))
                .map(|i| (i, *value)),
            Column::Each(values) => values
                .iter()
                .enumerate()
                .find(|&(i, v)| *v >= limit && has(&self.present, i))
                .map(|(i, &v)| (i, v)),
        }
    }

    /// Puts `value` in place of event `i`'s.
    fn set(&mut self, i: usize, value: Option<T>) {
        match value {
            Some(_) => self.present[i / 64] |= 1 << (i % 64),
            None => self.present[i / 64] &= !(1 << (i % 64)),
        }
        let value = value.unwrap_or_default();
        match &mut self.values {
            Column::Each(values) => values[i] = value,
            Column::Same { value: same, .. } if *same == value => {}
            Column::Same { value: same, len } => {
                let mut values = vec![*same; *len];
                values[i] = value;
                self.values = Column::Each(values);
            }
        }
    }

    fn truncate(&mut self, len: usize) {
        self.values.truncate(len);
        self.present.truncate(len.div_ceil(64));
        if let Some(last) = self.present.last_mut()
            && !len.is_multiple_of(64)
        {
            *last &= (1u64 << (len % 64)) - 1;
        }
    }

    fn reserve(&mut self, n: usize) {
        self.present.reserve(n.div_ceil(64));
    }

    /// Adds `other`'s values after these: its bitmap shifted to follow.
    fn append(&mut self, other: Optional<T>) {
        let (n, m) = (self.values.len(), other.values.len());
        self.present.reserve_exact(other.present.len());
        let shift = n % 64;
        if shift == 0 {
            self.present.extend_from_slice(&other.present);
        } else {
            for word in other.present {
                *self.present.last_mut().expect("a word for the partial one") |= word << shift;
                self.present.push(word >> (64 - shift));
            }
        }
        self.present.truncate((n + m).div_ceil(64));
        self.values.append(other.values);
    }

    /// Puts `f(v)` in place of each value `v` present.
    fn map_present(&mut self, f: impl Fn(T) -> T) {
        let n = self.values.len();
        let Optional { values, present } = self;
        match values {
            Column::Each(values) => {
                // A word of the bitmap at a time: in a real trace nearly
                // every word is all present, mapped without a test a value.
                for (values, &word) in values.chunks_mut(64).zip(present.iter()) {
                    if word == u64::MAX {
                        values.iter_mut().for_each(|v| *v = f(*v));
                    } else {
                        for (i, v) in values.iter_mut().enumerate() {
                            if word & (1 << i) != 0 {
                                *v = f(*v);
                            }
                        }
                    }
                }
            }
            // Counted a word at a time (no bit is set past the last event).
            Column::Same { .. } if present.iter().all(|&word| word == 0) => {}
            Column::Same { value, .. } if present_count(present) == n => *value = f(*value),
            Column::Same { .. } => {
                // Some present and some not: no longer one value for all.
                let mut mapped = Column::default();
                for i in 0..n {
                    mapped.push(self.get(i).map(&f).unwrap_or_default(), n);
                }
                self.values = mapped;
            }
        }
    }
}

/// Where the entries of events from `i` on start in a side list sorted by event.
fn side_start<T>(list: &[(usize, T)], i: usize) -> usize {
    list.partition_point(|&(j, _)| j < i)
}

impl Events {
    /// No events.
    pub fn new() -> Events {
        Events::default()
    }

    /// Gives the events' stacks and strings new ids: `stacks[s]` for stack
    /// `s`, `strings[t]` for string `t` (joining snapshots read in parts).
    /// The first event that refers to a stack of `stacks` or more or a
    /// string of `strings` or more: its index, what it refers to
    /// (`"stack"` or `"string"`) and the id.
    pub(crate) fn first_reference_past(
        &self,
        stacks: usize,
        strings: usize,
    ) -> Option<(usize, &'static str, u32)> {
        let past = |column: &Optional<u32>, limit: usize, what| {
            u32::try_from(limit)
                .ok()
                .and_then(|limit| column.first_at_least(limit))
                .map(|(i, id)| (i, what, id))
        };
        [
            past(&self.stack, stacks, "stack"),
            past(&self.compile_context, strings, "string"),
            past(&self.user_metadata, strings, "string"),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|&(i, _, _)| i)
    }

    pub(crate) fn renumber(&mut self, stacks: &[StackId], strings: &[StrId]) {
        self.stack.map_present(|s| stacks[s as usize]);
        self.compile_context.map_present(|t| strings[t as usize]);
        self.user_metadata.map_present(|t| strings[t as usize]);
    }

    /// No events, with room for `n` before the columns grow.
    pub fn with_capacity(n: usize) -> Events {
        let mut events = Events::default();
        events.actions.reserve(n);
        events.address.reserve(n);
        events.size.reserve(n);
        events.time_us.reserve(n);
        events.stack.reserve(n);
        events.compile_context.reserve(n);
        events.user_metadata.reserve(n);
        events
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.actions.len()
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// Adds `e` after the last event.
    #[inline(always)]
    pub fn push(&mut self, e: TraceEvent) {
        let i = self.len();
        match e.action {
            Action::Other(name) => {
                self.actions.push(OTHER_ACTION);
                self.other_actions.push((i, name));
            }
            known => self
                .actions
                .push(known.code().expect("every action but Other has a code")),
        }
        self.address.push(e.address);
        self.size.push(e.size);
        // The events expected: the room the address column has, which
        // `with_capacity` reserved (or its doubling gave).
        let room = self.address.capacity();
        self.stream.push(e.stream, room);
        self.time_us.push(e.time_us, room);
        self.stack.push(e.stack, room);
        self.compile_context.push(e.compile_context, room);
        self.user_metadata.push(e.user_metadata, room);
        if let Some(seq) = e.alloc_seq {
            self.alloc_seq.push((i, seq));
        }
        if let Some(details) = e.details {
            self.details.push((i, details));
        }
    }

    /// The events in order.
    pub fn iter(&self) -> EventIter<'_> {
        self.iter_from(0)
    }

    /// The events in order, each with its index: `iter().enumerate()`, made
    /// to be inlined into the loops over millions of events, where
    /// `Enumerate` was not.
    pub fn indexed(&self) -> Indexed<'_> {
        Indexed(self.iter())
    }

    /// The events from index `start` on (none if `start` is past the end).
    pub fn iter_from(&self, start: usize) -> EventIter<'_> {
        let next = start.min(self.len());
        EventIter {
            next,
            actions: self.actions[next..].iter(),
            address: self.address[next..].iter(),
            size: self.size[next..].iter(),
            stream: &self.stream,
            time_us: &self.time_us,
            stack: &self.stack,
            compile_context: &self.compile_context,
            user_metadata: &self.user_metadata,
            other_actions: &self.other_actions[side_start(&self.other_actions, next)..],
            alloc_seq: &self.alloc_seq[side_start(&self.alloc_seq, next)..],
            details: &self.details[side_start(&self.details, next)..],
        }
    }

    /// Event `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<TraceEvent> {
        self.iter_from(i).next()
    }

    /// The last event, if any.
    pub fn last(&self) -> Option<TraceEvent> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// Whether any event's action is `action`: a scan of the action
    /// column's bytes, not a decoding of each event's.
    pub fn has_action(&self, action: &Action) -> bool {
        match action.code() {
            Some(code) => self.actions.contains(&code),
            None => self
                .other_actions
                .iter()
                .any(|(_, name)| matches!(action, Action::Other(o) if **o == **name)),
        }
    }

    /// The actions of the events in order: for passes that look at nothing
    /// else.
    pub fn actions(&self) -> impl DoubleEndedIterator<Item = Action> + ExactSizeIterator + '_ {
        self.actions
            .iter()
            .enumerate()
            .map(|(i, &code)| self.action(i, code))
    }

    /// The allocations and frees in order (`alloc`, `free_requested`,
    /// `free_completed`), with only what following blocks takes: for the
    /// passes over every event of a trace (replays, the loop finders),
    /// which read four columns and build no [`TraceEvent`].
    pub fn block_events(&self) -> impl Iterator<Item = BlockEvent> + '_ {
        let moves = self.actions.iter().zip(&self.address).zip(&self.size);
        moves
            .enumerate()
            .filter_map(|(index, ((&code, &address), &size))| {
                Some(BlockEvent {
                    index,
                    action: BlockAction::from_code(code)?,
                    address,
                    size,
                    stack: self.stack.get(index),
                })
            })
    }

    /// Each event's size, in order: with [`Events::actions`], for passes
    /// that read nothing else (reserved memory through segment events).
    pub fn sizes(&self) -> &[u64] {
        &self.size
    }

    /// The events that carry details (a pool id, an `oom`'s free bytes,
    /// keys this model has no field for), each with its index, in order.
    pub fn with_details(&self) -> impl Iterator<Item = (usize, &EventDetails)> + '_ {
        self.details.iter().map(|(i, d)| (*i, &**d))
    }

    /// How many events have each action, in no particular order: counted
    /// by code, where a hash of each of millions of actions took longer.
    pub fn action_counts(&self) -> Vec<(Action, u64)> {
        let mut by_code = [0u64; 256];
        for &code in &self.actions {
            by_code[code as usize] += 1;
        }
        let mut counts: Vec<(Action, u64)> = (0..=u8::MAX)
            .filter(|&code| by_code[code as usize] > 0)
            .filter_map(|code| Some((Action::from_code(code)?, by_code[code as usize])))
            .collect();
        for (_, name) in &self.other_actions {
            match counts
                .iter_mut()
                .find(|(a, _)| matches!(a, Action::Other(o) if **o == **name))
            {
                Some((_, n)) => *n += 1,
                None => counts.push((Action::Other(name.clone()), 1)),
            }
        }
        counts
    }

    #[inline(always)]
    fn action(&self, i: usize, code: u8) -> Action {
        Action::from_code(code).unwrap_or_else(|| self.other_action(i))
    }

    /// The action of event `i`, one without a code.
    #[cold]
    fn other_action(&self, i: usize) -> Action {
        let k = side_start(&self.other_actions, i);
        Action::Other(self.other_actions[k].1.clone())
    }

    /// Whether an event has extra key `key`.
    pub(crate) fn any_extra_key(&self, key: &str) -> bool {
        self.details
            .iter()
            .any(|(_, d)| d.extra.iter().any(|(k, _)| k == key))
    }

    /// Puts `restack(stack, value)` in place of the stack of each event
    /// with extra key `key`, whose value is `value`.
    pub(crate) fn restack_by_extra_key(
        &mut self,
        key: &str,
        mut restack: impl FnMut(Option<StackId>, &crate::Value) -> Option<StackId>,
    ) {
        for (i, details) in &self.details {
            if let Some((_, value)) = details.extra.iter().find(|(k, _)| k == key) {
                let stack = restack(self.stack.get(*i), value);
                self.stack.set(*i, stack);
            }
        }
    }

    /// Keeps the first `len` events and drops the rest.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        self.actions.truncate(len);
        self.other_actions
            .truncate(side_start(&self.other_actions, len));
        self.address.truncate(len);
        self.size.truncate(len);
        self.stream.truncate(len);
        self.time_us.truncate(len);
        self.stack.truncate(len);
        self.compile_context.truncate(len);
        self.user_metadata.truncate(len);
        self.alloc_seq.truncate(side_start(&self.alloc_seq, len));
        self.details.truncate(side_start(&self.details, len));
    }

    /// Adds `other`'s events after these (a trace read in two parts).
    pub(crate) fn append(&mut self, other: Events) {
        let n = self.len();
        // Exactly: the store is whole after this, and doubling it would
        // hold a third more than it needs.
        let more = other.len();
        self.actions.reserve_exact(more);
        self.address.reserve_exact(more);
        self.size.reserve_exact(more);
        let Events {
            actions,
            other_actions,
            address,
            size,
            stream,
            time_us,
            stack,
            compile_context,
            user_metadata,
            alloc_seq,
            details,
        } = other;
        self.actions.extend_from_slice(&actions);
        self.other_actions
            .extend(other_actions.into_iter().map(|(i, a)| (i + n, a)));
        self.address.extend_from_slice(&address);
        self.size.extend_from_slice(&size);
        self.stream.append(stream);
        self.time_us.append(time_us);
        self.stack.append(stack);
        self.compile_context.append(compile_context);
        self.user_metadata.append(user_metadata);
        self.alloc_seq
            .extend(alloc_seq.into_iter().map(|(i, s)| (i + n, s)));
        self.details
            .extend(details.into_iter().map(|(i, d)| (i + n, d)));
    }

    /// Moves the events from index `at` on into a store of their own.
    pub fn split_off(&mut self, at: usize) -> Events {
        let tail = self.iter_from(at).collect();
        self.truncate(at);
        tail
    }
}

/// An allocation or a free, as [`Events::block_events`] gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockEvent {
    /// Index of the event in the trace.
    pub index: usize,
    /// What it did.
    pub action: BlockAction,
    /// The block's address.
    pub address: u64,
    /// Bytes requested.
    pub size: u64,
    /// Stack recorded with the event.
    pub stack: Option<StackId>,
}

/// The actions of [`BlockEvent`]s: those of [`Action`] that allocate or
/// free a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockAction {
    /// [`Action::Alloc`].
    Alloc,
    /// [`Action::FreeRequested`].
    FreeRequested,
    /// [`Action::FreeCompleted`].
    FreeCompleted,
}

impl BlockAction {
    /// The block action of an action's code, if it is one.
    #[inline(always)]
    fn from_code(code: u8) -> Option<BlockAction> {
        match Action::from_code(code)? {
            Action::Alloc => Some(BlockAction::Alloc),
            Action::FreeRequested => Some(BlockAction::FreeRequested),
            Action::FreeCompleted => Some(BlockAction::FreeCompleted),
            _ => None,
        }
    }
}

/// The events of an [`Events`] in order, each built as it is reached.
///
/// It walks every column side by side. Inlined into a loop, the loads of
/// the fields that the loop does not use are dropped by the compiler, so a
/// pass pays only for the columns it reads.
#[derive(Clone)]
pub struct EventIter<'a> {
    /// Index of the next event.
    next: usize,
    actions: std::slice::Iter<'a, u8>,
    address: std::slice::Iter<'a, u64>,
    size: std::slice::Iter<'a, u64>,
    stream: &'a Column<i64>,
    time_us: &'a Optional<i64>,
    stack: &'a Optional<StackId>,
    compile_context: &'a Optional<StrId>,
    user_metadata: &'a Optional<StrId>,
    /// The side lists from the next event's entries on.
    other_actions: &'a [(usize, Box<str>)],
    alloc_seq: &'a [(usize, u64)],
    details: &'a [(usize, Box<EventDetails>)],
}

/// How many bits of `bitmap` are set.
fn present_count(bitmap: &[u64]) -> usize {
    bitmap.iter().map(|word| word.count_ones() as usize).sum()
}

/// Whether bit `i` of `bitmap` is set.
#[inline(always)]
fn has(bitmap: &[u64], i: usize) -> bool {
    bitmap
        .get(i / 64)
        .is_some_and(|word| word & (1 << (i % 64)) != 0)
}

/// The value of event `i` in `list`, a side list whose entries from the
/// next event's on are left; moves past it.
#[inline(always)]
fn take_side<T: Clone>(list: &mut &[(usize, T)], i: usize) -> Option<T> {
    match list.first() {
        Some((j, _)) if *j == i => Some(take_first(list)),
        _ => None,
    }
}

/// The first value of a side list, moving past it: out of line, so that
/// the loops [`EventIter`] is inlined into stay small (few events have
/// entries in side lists).
#[cold]
#[inline(never)]
fn take_first<T: Clone>(list: &mut &[(usize, T)]) -> T {
    let value = list[0].1.clone();
    *list = &list[1..];
    value
}

impl Iterator for EventIter<'_> {
    type Item = TraceEvent;

    #[inline(always)]
    fn next(&mut self) -> Option<TraceEvent> {
        let &code = self.actions.next()?;
        let i = self.next;
        self.next += 1;
        let action = match Action::from_code(code) {
            Some(action) => action,
            None => Action::Other(take_side(&mut self.other_actions, i).unwrap_or_default()),
        };
        Some(TraceEvent {
            action,
            address: self.address.next().copied().unwrap_or_default(),
            size: self.size.next().copied().unwrap_or_default(),
            stream: self.stream.get(i),
            time_us: self.time_us.get(i),
            stack: self.stack.get(i),
            compile_context: self.compile_context.get(i),
            user_metadata: self.user_metadata.get(i),
            alloc_seq: take_side(&mut self.alloc_seq, i),
            details: take_side(&mut self.details, i),
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.actions.size_hint()
    }
}

impl ExactSizeIterator for EventIter<'_> {}

/// The events of an [`Events`] in order, with their indexes; see
/// [`Events::indexed`].
#[derive(Clone)]
pub struct Indexed<'a>(EventIter<'a>);

impl Iterator for Indexed<'_> {
    type Item = (usize, TraceEvent);

    #[inline(always)]
    fn next(&mut self) -> Option<(usize, TraceEvent)> {
        let i = self.0.next;
        self.0.next().map(|e| (i, e))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for Indexed<'_> {}

impl<'a> IntoIterator for &'a Events {
    type Item = TraceEvent;
    type IntoIter = EventIter<'a>;

    fn into_iter(self) -> EventIter<'a> {
        self.iter()
    }
}

impl FromIterator<TraceEvent> for Events {
    fn from_iter<I: IntoIterator<Item = TraceEvent>>(iter: I) -> Events {
        let mut events = Events::new();
        events.extend(iter);
        events
    }
}

impl Extend<TraceEvent> for Events {
    fn extend<I: IntoIterator<Item = TraceEvent>>(&mut self, iter: I) {
        for e in iter {
            self.push(e);
        }
    }
}

impl From<Vec<TraceEvent>> for Events {
    fn from(events: Vec<TraceEvent>) -> Events {
        events.into_iter().collect()
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A list of events, as JSON files hold them.
impl Serialize for Events {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Events {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Events, D::Error> {
        struct EventList;
        impl<'de> Visitor<'de> for EventList {
            type Value = Events;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of trace events")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Events, A::Error> {
                let mut events = Events::new();
                while let Some(e) = seq.next_element()? {
                    events.push(e);
                }
                Ok(events)
            }
        }
        d.deserialize_seq(EventList)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_counts_count_each_action_once_per_event() {
        let actions = [
            Action::Alloc,
            Action::Other("snapshot".into()),
            Action::FreeCompleted,
            Action::Alloc,
            Action::Other("custom".into()),
            Action::Other("snapshot".into()),
        ];
        let events: Events = actions
            .iter()
            .map(|action| TraceEvent {
                action: action.clone(),
                ..TraceEvent::default()
            })
            .collect();
        let mut counts = events.action_counts();
        counts.sort_by_key(|(action, _)| action.name().to_owned());
        let named: Vec<(&str, u64)> = counts.iter().map(|(a, n)| (a.name(), *n)).collect();
        assert_eq!(
            named,
            [
                ("alloc", 2),
                ("custom", 1),
                ("free_completed", 1),
                ("snapshot", 2)
            ]
        );
    }

    #[test]
    fn renumbering_changes_the_ids_present_and_nothing_else() {
        // One stack for all, one for some, one each; a string for some.
        let cases: [&[Option<StackId>]; 4] = [
            &[Some(0), Some(0), Some(0)],
            &[Some(0), None, Some(0)],
            &[Some(1), None, Some(0)],
            &[None, None],
        ];
        for stacks in cases {
            let mut events: Events = stacks
                .iter()
                .enumerate()
                .map(|(i, &stack)| TraceEvent {
                    stack,
                    user_metadata: (i == 0).then_some(0),
                    ..TraceEvent::default()
                })
                .collect();
            events.renumber(&[7, 3], &[9]);
            let renumbered: Vec<_> = events.iter().map(|e| (e.stack, e.user_metadata)).collect();
            let expected: Vec<_> = stacks
                .iter()
                .enumerate()
                .map(|(i, s)| (s.map(|s| [7, 3][s as usize]), (i == 0).then_some(9)))
                .collect();
            assert_eq!(renumbered, expected, "{stacks:?}");
        }
    }

    #[test]
    fn renumbering_long_columns_maps_every_present_value() {
        // Whole words present, words with gaps, and a last partial word;
        // one stack for all but the last event; and strings only on the
        // first event and on the last, past the first words.
        let n = 300;
        let varied = |i: usize| match i {
            0..128 => Some((i % 2) as StackId),
            128..256 => (!i.is_multiple_of(3)).then_some((i % 2) as StackId),
            _ => None,
        };
        let one_but_last = |i: usize| (i + 1 < n).then_some(0);
        let last_only = |i: usize| (i + 1 == n).then_some(0);
        let first_only = |i: usize| (i == 0).then_some(0);
        for stack in [&varied as &dyn Fn(usize) -> Option<StackId>, &one_but_last] {
            let mut events: Events = (0..n)
                .map(|i| TraceEvent {
                    stack: stack(i),
                    user_metadata: last_only(i),
                    compile_context: first_only(i),
                    ..TraceEvent::default()
                })
                .collect();
            events.renumber(&[7, 3], &[9]);
            // As if made with the new ids: values absent stay as absent ones
            // are stored, so that equal events compare equal.
            let renumbered: Events = (0..n)
                .map(|i| TraceEvent {
                    stack: stack(i).map(|s| [7, 3][s as usize]),
                    user_metadata: last_only(i).map(|_| 9),
                    compile_context: first_only(i).map(|_| 9),
                    ..TraceEvent::default()
                })
                .collect();
            assert!(events == renumbered);
        }
    }

    /// Events that exercise every column: other actions, missing and
    /// negative times, details, large numbers.
    fn varied(n: usize) -> Vec<TraceEvent> {
        (0..n)
            .map(|i| {
                let mut e = TraceEvent {
                    action: match i % 7 {
                        0 => Action::Other(format!("custom_{i}").into()),
                        1 | 4 => Action::FreeCompleted,
                        5 => Action::Step,
                        _ => Action::Alloc,
                    },
                    address: 0x7f00_0000_0000 + (i as u64) * 512,
                    size: if i % 11 == 0 { u64::MAX } else { i as u64 * 3 },
                    stream: if i % 5 == 0 { -(i as i64) } else { 7 },
                    time_us: (i % 3 != 0).then_some(1_700_000_000_000_000 - (i as i64 % 13) * 1000),
                    stack: (i % 4 != 0).then_some(i as u32 % 1000),
                    compile_context: (i % 2 == 0).then_some(1),
                    user_metadata: (i % 9 == 0).then_some(u32::MAX),
                    alloc_seq: (i % 6 == 0).then_some(i as u64),
                    details: None,
                };
                if i % 17 == 0 {
                    e.details_mut().device_free = Some(i as u64);
                }
                e
            })
            .collect()
    }

    /// An action is found among the events exactly when one of them has it,
    /// known actions and others alike.
    #[test]
    fn has_action_is_whether_an_event_has_it() {
        let events: Events = varied(20).into_iter().collect();
        for action in [
            Action::Alloc,
            Action::Step,
            Action::Other("custom_14".into()),
        ] {
            assert!(events.has_action(&action), "{action:?}");
        }
        for action in [Action::Annotate, Action::Other("custom_15".into())] {
            assert!(!events.has_action(&action), "{action:?}");
        }
    }

    /// The block events are the allocations and frees of a walk over whole
    /// events, in order, with their fields; no other action among them.
    #[test]
    fn block_events_are_the_allocs_and_frees_of_the_whole_events() {
        let mut rows = varied(1000);
        rows[3].action = Action::FreeRequested;
        rows[10].action = Action::SegmentAlloc;
        let events: Events = rows.iter().cloned().collect();
        let walked: Vec<BlockEvent> = (rows.iter().enumerate())
            .filter_map(|(index, e)| {
                let action = match e.action {
                    Action::Alloc => BlockAction::Alloc,
                    Action::FreeRequested => BlockAction::FreeRequested,
                    Action::FreeCompleted => BlockAction::FreeCompleted,
                    _ => return None,
                };
                Some(BlockEvent {
                    index,
                    action,
                    address: e.address,
                    size: e.size,
                    stack: e.stack,
                })
            })
            .collect();
        assert_eq!(events.block_events().collect::<Vec<_>>(), walked);
        assert!(walked.len() > 500 && walked.len() < 1000);
        assert!(
            walked
                .iter()
                .any(|e| e.action == BlockAction::FreeRequested)
        );
    }

    /// The first reference past the tables, found column by column, is the
    /// one a walk over whole events finds first, stacks before strings.
    #[test]
    fn the_first_reference_past_the_tables_is_the_first_event_with_one() {
        let walked = |events: &[TraceEvent], stacks: usize, strings: usize| {
            events.iter().enumerate().find_map(|(i, e)| {
                let past = |id: Option<u32>, n: usize| id.filter(|&id| id as usize >= n);
                past(e.stack, stacks)
                    .map(|id| (i, "stack", id))
                    .or_else(|| past(e.compile_context, strings).map(|id| (i, "string", id)))
                    .or_else(|| past(e.user_metadata, strings).map(|id| (i, "string", id)))
            })
        };
        let same_stack: Vec<TraceEvent> = (0..100)
            .map(|i| TraceEvent {
                stack: (i >= 40).then_some(5),
                ..TraceEvent::default()
            })
            .collect();
        for rows in [varied(1000), same_stack] {
            let events = Events::from(rows.clone());
            for (stacks, strings) in [(1000, 2), (999, 2), (500, 2), (6, 1), (5, 0), (0, 0)] {
                assert_eq!(
                    events.first_reference_past(stacks, strings),
                    walked(&rows, stacks, strings),
                    "{stacks} stacks, {strings} strings"
                );
            }
        }
    }

    #[test]
    fn events_read_back_as_pushed_from_any_index() {
        let rows = varied(1000);
        let events = Events::from(rows.clone());
        assert_eq!(events.len(), 1000);
        assert_eq!(events.iter().collect::<Vec<_>>(), rows);
        for start in [0, 1, 255, 256, 257, 511, 999, 1000, 5000] {
            let tail: Vec<_> = events.iter_from(start).collect();
            assert_eq!(tail, rows[start.min(1000)..], "from {start}");
        }
        let actions: Vec<Action> = events.actions().collect();
        assert_eq!(
            actions,
            rows.iter().map(|e| e.action.clone()).collect::<Vec<_>>()
        );
        assert_eq!(events.last().as_ref(), rows.last());
    }

    #[test]
    fn split_off_leaves_a_store_that_takes_more_events() {
        let rows = varied(700);
        for at in [0, 3, 256, 300, 512, 699, 700] {
            let mut head = Events::from(rows.clone());
            let tail = head.split_off(at);
            assert_eq!(tail.iter().collect::<Vec<_>>(), rows[at..]);
            assert_eq!(head.iter().collect::<Vec<_>>(), rows[..at]);
            // Pushing after a cut gives the same store as pushing without it.
            head.extend(rows[at..].iter().cloned());
            assert_eq!(head, Events::from(rows.clone()), "cut at {at}");
        }
    }

    #[test]
    fn a_column_holds_one_value_until_one_differs() {
        let mut column = Column::default();
        for _ in 0..5 {
            column.push(7i64, 0);
        }
        assert!(matches!(column, Column::Same { value: 7, len: 5 }));
        column.push(-1, 0);
        assert!(matches!(&column, Column::Each(v) if v == &[7, 7, 7, 7, 7, -1]));
        // The first value that differs makes room for the values expected.
        let mut expecting = Column::default();
        expecting.push(1i64, 1000);
        expecting.push(2, 1000);
        assert!(matches!(&expecting, Column::Each(v) if v == &[1, 2] && v.capacity() >= 1000));
        // Events reserved for take that room in the columns that spread.
        let mut events = Events::with_capacity(1000);
        for t in [1, 2] {
            events.push(TraceEvent {
                time_us: Some(t),
                ..TraceEvent::default()
            });
        }
        let Column::Each(times) = &events.time_us.values else {
            panic!("two times, one column of each");
        };
        assert!(times.capacity() >= 1000, "room for {}", times.capacity());
        // Equal by values, however stored.
        column.truncate(3);
        let mut same = Column::default();
        (0..3).for_each(|_| same.push(7i64, 0));
        assert_eq!(column, same);
        assert_ne!(column, Column::default());

        // A trace of one stream, then a second one.
        let mut rows = varied(300);
        rows.iter_mut().for_each(|e| e.stream = 5);
        rows[299].stream = 6;
        let events = Events::from(rows.clone());
        assert_eq!(events.iter().collect::<Vec<_>>(), rows);
    }
}
