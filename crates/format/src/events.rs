//! A device's trace events, packed column by column.
//!
//! Traces run to tens of millions of events. As [`TraceEvent`] structs they
//! take 112 bytes each; packed here they take about 20: one byte column per
//! field, numbers as LEB128 varints, optional fields behind a presence
//! bitmap, times as differences from the previous time. This is the layout
//! `.snap` files store (docs/format.md), so files are written without
//! re-encoding.
//!
//! Analyses walk a trace in order, decoding one event at a time
//! ([`Events::iter`]); walking 112-byte structs was bound by memory
//! bandwidth, so the decoding costs little. Looking at one event by index
//! starts from the nearest checkpoint, kept every [`CHECKPOINT_EVERY`]
//! events.
//!
//! Hand-written: no crate packs rows of optional fields into this layout.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{Action, EventDetails, TraceEvent};

/// Code of an action without a code of its own in the action column; its
/// name is kept beside it.
pub(crate) const OTHER_ACTION: u8 = u8::MAX;

/// Events between two checkpoints: looking at one event decodes at most this
/// many, and the checkpoints cost a third of a byte per event.
const CHECKPOINT_EVERY: usize = 256;

/// The recorded events of one device, oldest first, packed (see the module
/// documentation). Built by pushing events or collecting them; read by
/// iterating, which yields each event as a [`TraceEvent`].
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
#[derive(Clone, Default, PartialEq)]
pub struct Events {
    /// One code per event; [`OTHER_ACTION`] for actions without a code.
    actions: Vec<u8>,
    /// The names of actions without a code, with the index of their event.
    other_actions: Vec<(usize, Box<str>)>,
    address: Vec<u8>,
    size: Vec<u8>,
    /// Zigzag varints.
    stream: Vec<u8>,
    /// Zigzag differences from the previous time present (from 0 for the first).
    time: Sparse,
    stack: Sparse,
    compile_context: Sparse,
    user_metadata: Sparse,
    alloc_seq: Sparse,
    /// The rare fields, with the index of their event.
    details: Vec<(usize, Box<EventDetails>)>,
    /// Where each column stands before events 0, [`CHECKPOINT_EVERY`], 2 ×
    /// [`CHECKPOINT_EVERY`], ...
    checkpoints: Vec<Position>,
    /// Where each column ends: the position of the next event pushed.
    end: Position,
}

/// An optional field: a presence bitmap, and the values present.
#[derive(Clone, Default, PartialEq)]
pub(crate) struct Sparse {
    pub(crate) present: Vec<u8>,
    pub(crate) values: Vec<u8>,
}

impl Sparse {
    fn push(&mut self, i: usize, value: Option<u64>) {
        if i % 8 == 0 {
            self.present.push(0);
        }
        if let Some(v) = value {
            self.present[i / 8] |= 1 << (i % 8);
            write_u64(&mut self.values, v);
        }
    }

    #[inline]
    fn has(&self, i: usize) -> bool {
        self.present[i / 8] & (1 << (i % 8)) != 0
    }

    /// The value of event `i`, reading it at `pos` if present.
    #[inline]
    fn get(&self, i: usize, pos: &mut usize) -> Option<u64> {
        self.has(i).then(|| read_u64(&self.values, pos))
    }

    /// Keeps the first `len` events, whose values end at `values_end`.
    fn truncate(&mut self, len: usize, values_end: usize) {
        self.present.truncate(len.div_ceil(8));
        if let Some(last) = self.present.last_mut()
            && len % 8 != 0
        {
            *last &= (1u8 << (len % 8)) - 1;
        }
        self.values.truncate(values_end);
    }
}

/// Where each column stands at one event: byte offsets into the varint
/// columns, indexes into the side lists, and the time differences start from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Position {
    address: usize,
    size: usize,
    stream: usize,
    time: usize,
    stack: usize,
    compile_context: usize,
    user_metadata: usize,
    alloc_seq: usize,
    other_actions: usize,
    details: usize,
    last_time: i64,
}

/// Appends `v` as a LEB128 varint.
#[inline]
pub(crate) fn write_u64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends `v` zigzag-encoded as a LEB128 varint.
#[inline]
pub(crate) fn write_i64(out: &mut Vec<u8>, v: i64) {
    write_u64(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads a varint this module wrote at `pos`, moving past it. The columns
/// are only ever filled by [`write_u64`], so they hold whole varints.
#[inline]
fn read_u64(bytes: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    while let Some(&b) = bytes.get(*pos) {
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    v
}

#[inline]
fn read_i64(bytes: &[u8], pos: &mut usize) -> i64 {
    let z = read_u64(bytes, pos);
    (z >> 1) as i64 ^ -((z & 1) as i64)
}

impl Events {
    /// No events.
    pub fn new() -> Events {
        Events::default()
    }

    /// No events, with room for at least `n` before the columns grow.
    pub fn with_capacity(n: usize) -> Events {
        let sparse = || Sparse {
            present: Vec::with_capacity(n.div_ceil(8)),
            values: Vec::new(),
        };
        Events {
            actions: Vec::with_capacity(n),
            address: Vec::with_capacity(n),
            size: Vec::with_capacity(n),
            stream: Vec::with_capacity(n),
            time: sparse(),
            stack: sparse(),
            compile_context: sparse(),
            user_metadata: sparse(),
            alloc_seq: sparse(),
            checkpoints: Vec::with_capacity(n / CHECKPOINT_EVERY + 1),
            ..Events::default()
        }
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
    pub fn push(&mut self, e: TraceEvent) {
        let i = self.len();
        if i % CHECKPOINT_EVERY == 0 {
            self.checkpoints.push(self.end);
        }
        match e.action.code() {
            Some(code) => self.actions.push(code),
            None => {
                self.actions.push(OTHER_ACTION);
                let name = match e.action {
                    Action::Other(name) => name,
                    known => known.name().into(),
                };
                self.other_actions.push((i, name));
            }
        }
        write_u64(&mut self.address, e.address);
        write_u64(&mut self.size, e.size);
        write_i64(&mut self.stream, e.stream);
        let delta = e.time_us.map(|t| {
            let delta = t.wrapping_sub(self.end.last_time);
            self.end.last_time = t;
            ((delta << 1) ^ (delta >> 63)) as u64
        });
        self.time.push(i, delta);
        self.stack.push(i, e.stack.map(u64::from));
        self.compile_context.push(i, e.compile_context.map(u64::from));
        self.user_metadata.push(i, e.user_metadata.map(u64::from));
        self.alloc_seq.push(i, e.alloc_seq);
        if let Some(details) = e.details {
            self.details.push((i, details));
        }
        self.end = Position {
            address: self.address.len(),
            size: self.size.len(),
            stream: self.stream.len(),
            time: self.time.values.len(),
            stack: self.stack.values.len(),
            compile_context: self.compile_context.values.len(),
            user_metadata: self.user_metadata.values.len(),
            alloc_seq: self.alloc_seq.values.len(),
            other_actions: self.other_actions.len(),
            details: self.details.len(),
            last_time: self.end.last_time,
        };
    }

    /// The events in order.
    pub fn iter(&self) -> EventIter<'_> {
        self.iter_from(0)
    }

    /// The events from index `start` on (none if `start` is past the end).
    pub fn iter_from(&self, start: usize) -> EventIter<'_> {
        let start = start.min(self.len());
        let mut iter = EventIter {
            events: self,
            next: start / CHECKPOINT_EVERY * CHECKPOINT_EVERY,
            end: self.len(),
            at: self
                .checkpoints
                .get(start / CHECKPOINT_EVERY)
                .copied()
                .unwrap_or(self.end),
        };
        while iter.next < start {
            iter.next();
        }
        iter
    }

    /// Event `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<TraceEvent> {
        self.iter_from(i).next()
    }

    /// The last event, if any.
    pub fn last(&self) -> Option<TraceEvent> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// The actions of the events in order: for passes that look at nothing
    /// else, without decoding the other fields.
    pub fn actions(&self) -> impl DoubleEndedIterator<Item = Action> + ExactSizeIterator + '_ {
        self.actions
            .iter()
            .enumerate()
            .map(|(i, &code)| self.action(i, code))
    }

    fn action(&self, i: usize, code: u8) -> Action {
        if code == OTHER_ACTION {
            let k = self.other_actions.partition_point(|&(j, _)| j < i);
            return Action::Other(self.other_actions[k].1.clone());
        }
        Action::from_code(code).expect("action codes come from Action::code")
    }

    /// Keeps the first `len` events and drops the rest.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        let at = self.iter_from(len).at;
        self.actions.truncate(len);
        self.other_actions.truncate(at.other_actions);
        self.address.truncate(at.address);
        self.size.truncate(at.size);
        self.stream.truncate(at.stream);
        self.time.truncate(len, at.time);
        self.stack.truncate(len, at.stack);
        self.compile_context.truncate(len, at.compile_context);
        self.user_metadata.truncate(len, at.user_metadata);
        self.alloc_seq.truncate(len, at.alloc_seq);
        self.details.truncate(at.details);
        self.checkpoints.truncate(len.div_ceil(CHECKPOINT_EVERY));
        self.end = at;
    }

    /// Moves the events from index `at` on into a store of their own.
    pub fn split_off(&mut self, at: usize) -> Events {
        let tail = self.iter_from(at).collect();
        self.truncate(at);
        tail
    }

    /// The packed columns, for writing `.snap` files as they are.
    pub(crate) fn columns(&self) -> Columns<'_> {
        Columns {
            actions: &self.actions,
            other_actions: self.other_actions.iter().map(|(_, name)| &**name).collect(),
            address: &self.address,
            size: &self.size,
            stream: &self.stream,
            time: &self.time,
            stack: &self.stack,
            compile_context: &self.compile_context,
            user_metadata: &self.user_metadata,
            alloc_seq: &self.alloc_seq,
            details: &self.details,
        }
    }
}

/// The packed columns of [`Events`], borrowed.
pub(crate) struct Columns<'a> {
    pub(crate) actions: &'a [u8],
    /// Names of the actions coded [`OTHER_ACTION`], in order.
    pub(crate) other_actions: Vec<&'a str>,
    pub(crate) address: &'a [u8],
    pub(crate) size: &'a [u8],
    pub(crate) stream: &'a [u8],
    pub(crate) time: &'a Sparse,
    pub(crate) stack: &'a Sparse,
    pub(crate) compile_context: &'a Sparse,
    pub(crate) user_metadata: &'a Sparse,
    pub(crate) alloc_seq: &'a Sparse,
    pub(crate) details: &'a [(usize, Box<EventDetails>)],
}

/// The events of an [`Events`] in order, each decoded as it is reached.
#[derive(Clone)]
pub struct EventIter<'a> {
    events: &'a Events,
    /// Index of the next event.
    next: usize,
    end: usize,
    /// Where the next event's fields start.
    at: Position,
}

impl Iterator for EventIter<'_> {
    type Item = TraceEvent;

    #[inline]
    fn next(&mut self) -> Option<TraceEvent> {
        if self.next >= self.end {
            return None;
        }
        let (ev, i, at) = (self.events, self.next, &mut self.at);
        self.next += 1;
        let code = ev.actions[i];
        let action = if code == OTHER_ACTION {
            at.other_actions += 1;
            Action::Other(ev.other_actions[at.other_actions - 1].1.clone())
        } else {
            Action::from_code(code).expect("action codes come from Action::code")
        };
        let time_us = ev.time.has(i).then(|| {
            at.last_time = at
                .last_time
                .wrapping_add(read_i64(&ev.time.values, &mut at.time));
            at.last_time
        });
        let details = match ev.details.get(at.details) {
            Some((j, details)) if *j == i => {
                at.details += 1;
                Some(details.clone())
            }
            _ => None,
        };
        Some(TraceEvent {
            action,
            address: read_u64(&ev.address, &mut at.address),
            size: read_u64(&ev.size, &mut at.size),
            stream: read_i64(&ev.stream, &mut at.stream),
            time_us,
            // Ids were pushed from u32 values.
            stack: ev.stack.get(i, &mut at.stack).map(|v| v as u32),
            compile_context: ev
                .compile_context
                .get(i, &mut at.compile_context)
                .map(|v| v as u32),
            user_metadata: ev
                .user_metadata
                .get(i, &mut at.user_metadata)
                .map(|v| v as u32),
            alloc_seq: ev.alloc_seq.get(i, &mut at.alloc_seq),
            details,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for EventIter<'_> {}

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
}
