//! Column layouts for the big tables, in binary files only.
//!
//! Trace events, frames and stacks are stored column by column in `.snap` files:
//! all actions, then all addresses, and so on, with times stored as
//! differences from the previous event. Values of one kind side by
//! side compress far better than rows of mixed fields (a third smaller on
//! real snapshots). JSON keeps the plain row form, one object per event.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_bytes::ByteBuf;

use crate::events::{Column, Events, OTHER_ACTION, Optional};
use crate::model::{Action, CompactString, DeviceTrace, EventDetails, Frame};
use crate::value::Extra;

pub(crate) mod segments;

#[derive(Serialize)]
struct TraceRows<'a> {
    device: u32,
    events: &'a Events,
}

#[derive(Deserialize)]
struct TraceRowsOwned {
    device: u32,
    events: Events,
}

/// Appends `v` as a LEB128 varint.
///
/// Hand-written, with its reader below, because decoding a column of plain
/// bytes is many times faster than decoding the same values one MessagePack
/// item at a time.
fn write_u64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends `v` zigzag-encoded as a LEB128 varint.
fn write_i64(out: &mut Vec<u8>, v: i64) {
    write_u64(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// A column that ends early or holds an overlong number.
struct Corrupt;

impl From<Corrupt> for String {
    #[cold]
    fn from(_: Corrupt) -> String {
        "trace column ends early or holds an overlong number".to_owned()
    }
}

/// Reads what [`write_u64`] and [`write_i64`] wrote, failing cleanly on short or overlong input.
struct ColumnReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// The presence bitmap of an optional column (empty for others).
    present: &'a [u8],
}

impl<'a> ColumnReader<'a> {
    /// A column with one value per event.
    fn dense(bytes: &'a [u8]) -> Self {
        ColumnReader {
            bytes,
            pos: 0,
            present: &[],
        }
    }

    /// A column with a presence bitmap for `n` events, then the values present.
    fn sparse(bytes: &'a [u8], n: usize) -> Result<Self, String> {
        let len = n.div_ceil(8);
        let present = bytes.get(..len).ok_or("trace column ends early")?;
        Ok(ColumnReader {
            bytes,
            pos: len,
            present,
        })
    }

    #[inline]
    fn u64(&mut self) -> Result<u64, Corrupt> {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = *self.bytes.get(self.pos).ok_or(Corrupt)?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
            shift += 7;
            if shift >= 64 {
                return Err(Corrupt);
            }
        }
    }

    /// The next byte as it is.
    #[inline]
    fn byte(&mut self) -> Result<u8, Corrupt> {
        let b = *self.bytes.get(self.pos).ok_or(Corrupt)?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn i64(&mut self) -> Result<i64, Corrupt> {
        let z = self.u64()?;
        Ok((z >> 1) as i64 ^ -((z & 1) as i64))
    }

    /// Whether event `i` has a value in this sparse column.
    #[inline]
    fn has(&self, i: usize) -> bool {
        self.present[i / 8] & (1 << (i % 8)) != 0
    }

    fn finish(&self) -> Result<(), String> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err("trace column has extra bytes".to_owned())
        }
    }
}

/// The binary form of a [`DeviceTrace`]: the device, then one byte string
/// per field (see docs/format.md for the layout of each). Written whole;
/// read column by column ([`TraceColumnsVisitor`]).
#[derive(Serialize)]
#[cfg_attr(test, derive(Deserialize))]
struct TraceColumns {
    device: u32,
    #[serde(with = "serde_bytes")]
    actions: Vec<u8>,
    other_actions: Vec<String>,
    #[serde(with = "serde_bytes")]
    address: Vec<u8>,
    #[serde(with = "serde_bytes")]
    size: Vec<u8>,
    #[serde(with = "serde_bytes")]
    stream: Vec<u8>,
    #[serde(with = "serde_bytes")]
    time_deltas: Vec<u8>,
    #[serde(with = "serde_bytes")]
    stack: Vec<u8>,
    #[serde(with = "serde_bytes")]
    device_free: Vec<u8>,
    #[serde(with = "serde_bytes")]
    compile_context: Vec<u8>,
    #[serde(with = "serde_bytes")]
    user_metadata: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pool_id: Vec<u8>,
    #[serde(with = "serde_bytes")]
    alloc_seq: Vec<u8>,
    /// Event index and extra keys, for the few events with any.
    extra: Vec<(u32, Extra)>,
}

impl Serialize for DeviceTrace {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return TraceRows {
                device: self.device,
                events: &self.events,
            }
            .serialize(s);
        }
        let n = self.events.len();
        let mut c = TraceColumns {
            device: self.device,
            actions: Vec::with_capacity(n),
            other_actions: Vec::new(),
            address: Vec::with_capacity(n * 6),
            size: Vec::with_capacity(n * 3),
            stream: Vec::with_capacity(n),
            time_deltas: bitmap(n),
            stack: bitmap(n),
            device_free: bitmap(n),
            compile_context: bitmap(n),
            user_metadata: bitmap(n),
            pool_id: bitmap(n),
            alloc_seq: bitmap(n),
            extra: Vec::new(),
        };
        let mut last_time = 0i64;
        for (i, e) in self.events.indexed() {
            let mark = |column: &mut Vec<u8>| column[i / 8] |= 1 << (i % 8);
            c.actions.push(e.action.code().unwrap_or(OTHER_ACTION));
            if e.action.code().is_none() {
                c.other_actions.push(e.action.name().to_owned());
            }
            // Addresses as they are: a free repeats its allocation's address
            // exactly, which the compressor finds; differences would hide that.
            write_u64(&mut c.address, e.address);
            write_u64(&mut c.size, e.size);
            write_i64(&mut c.stream, e.stream);
            if let Some(t) = e.time_us {
                mark(&mut c.time_deltas);
                write_i64(&mut c.time_deltas, t.wrapping_sub(last_time));
                last_time = t;
            }
            for (column, id) in [
                (&mut c.stack, e.stack),
                (&mut c.compile_context, e.compile_context),
                (&mut c.user_metadata, e.user_metadata),
            ] {
                if let Some(id) = id {
                    mark(column);
                    write_u64(column, id.into());
                }
            }
            if let Some(seq) = e.alloc_seq {
                mark(&mut c.alloc_seq);
                write_u64(&mut c.alloc_seq, seq);
            }
            let Some(details) = e.details else { continue };
            if let Some(free) = details.device_free {
                mark(&mut c.device_free);
                write_u64(&mut c.device_free, free);
            }
            if let Some((a, b)) = details.pool_id {
                mark(&mut c.pool_id);
                write_i64(&mut c.pool_id, a);
                write_i64(&mut c.pool_id, b);
            }
            if !details.extra.is_empty() {
                c.extra.push((i as u32, details.extra));
            }
        }
        c.serialize(s)
    }
}

/// A presence bitmap for `n` events, all clear, that values follow.
fn bitmap(n: usize) -> Vec<u8> {
    vec![0; n.div_ceil(8)]
}

fn u32_of(v: u64) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("table index {v} out of range"))
}

impl<'de> Deserialize<'de> for DeviceTrace {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DeviceTrace, D::Error> {
        if d.is_human_readable() {
            let rows = TraceRowsOwned::deserialize(d)?;
            return Ok(DeviceTrace {
                device: rows.device,
                events: rows.events,
            });
        }
        d.deserialize_seq(TraceColumnsVisitor { head: None })
    }
}

/// The trace events a `.snap` body being decoded on this thread may still
/// declare, the most it may, and its file's frame size; see
/// [`with_event_limit`].
#[derive(Clone, Copy)]
struct EventLimit {
    left: u64,
    most: u64,
    frame_len: usize,
}

thread_local! {
    // A thread-local because serde hands a visitor nothing but the bytes:
    // the limit comes from the file's size, which only the caller knows.
    static EVENT_LIMIT: std::cell::Cell<Option<EventLimit>> = const { std::cell::Cell::new(None) };
}

/// Runs `decode` with the traces it reads limited to `most` events in all
/// (from a zstd frame of `frame_len` bytes): a trace that would go over is
/// refused after its first column, before its events take any memory.
pub(crate) fn with_event_limit<T>(most: u64, frame_len: usize, decode: impl FnOnce() -> T) -> T {
    let limit = EventLimit {
        left: most,
        most,
        frame_len,
    };
    let outer = EVENT_LIMIT.replace(Some(limit));
    let decoded = decode();
    EVENT_LIMIT.set(outer);
    decoded
}

/// Counts `n` more events against the limit of [`with_event_limit`].
fn take_events(n: usize) -> Result<(), String> {
    let Some(mut limit) = EVENT_LIMIT.get() else {
        return Ok(());
    };
    limit.left = limit.left.checked_sub(n as u64).ok_or_else(|| {
        format!(
            "its traces declare more than {} events, the most a {}-byte zstd frame can hold",
            limit.most, limit.frame_len
        )
    })?;
    EVENT_LIMIT.set(Some(limit));
    Ok(())
}

thread_local! {
    // The bytes the column being read may still take, while one is read
    // from a `.snap` file: its reader hands bytes over through
    // [`spend_column_bytes`], so that a column declared longer than its
    // events can be is refused before it is read whole into memory.
    static COLUMN_BYTES_LEFT: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// MessagePack's bytes around a column: its marker and length.
const COLUMN_OVERHEAD: u64 = 16;

/// Counts `n` bytes handed to the MessagePack reader against the length
/// the trace column being read may have; an error once it is over.
pub(crate) fn spend_column_bytes(n: usize) -> std::io::Result<()> {
    let Some(left) = COLUMN_BYTES_LEFT.get() else {
        return Ok(());
    };
    let left = left.checked_sub(n as u64).ok_or_else(|| {
        std::io::Error::other("a trace column is longer than its events can make it")
    })?;
    COLUMN_BYTES_LEFT.set(Some(left));
    Ok(())
}

/// The longest a numeric column of `n` events can be: a presence bitmap
/// and two varints of at most 10 bytes each per event (`pool_id`).
fn most_column_bytes(n: usize) -> u64 {
    (n as u64).div_ceil(8) + 20 * n as u64 + COLUMN_OVERHEAD
}

/// Reads the events frame of a version-3 `.snap` file from `body`: each
/// trace's columns, in the order of the head's `traces`, each with the
/// device and number of events its head declares.
pub(crate) fn read_traces(
    body: impl std::io::Read,
    traces: &[crate::snap::TraceHead],
) -> Result<Vec<DeviceTrace>, rmp_serde::decode::Error> {
    struct Traces<'a>(&'a [crate::snap::TraceHead]);
    impl<'de> Visitor<'de> for Traces<'_> {
        type Value = Vec<DeviceTrace>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "{} traces", self.0.len())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<DeviceTrace>, A::Error> {
            let mut traces = Vec::with_capacity(self.0.len());
            for &head in self.0 {
                let trace = seq
                    .next_element_seed(TraceColumnsVisitor { head: Some(head) })?
                    .ok_or_else(|| A::Error::custom("fewer traces than its head declares"))?;
                traces.push(trace);
            }
            if seq.next_element::<de::IgnoredAny>()?.is_some() {
                return Err(A::Error::custom("more traces than its head declares"));
            }
            Ok(traces)
        }
    }
    let mut d = rmp_serde::Deserializer::new(body);
    d.deserialize_seq(Traces(traces))
}

/// Reads a trace's columns one at a time, each turned into its events'
/// values as the reader hands its bytes over ([`Decoded`]). A `.snap` body
/// is streamed from its zstd frame, so neither the body nor a trace's
/// columns are ever held whole: reading a long trace takes the memory of its
/// events and of its longest column. `head` is the device and number of
/// events the file's head declares for the trace (version 3 on).
struct TraceColumnsVisitor {
    head: Option<crate::snap::TraceHead>,
}

impl<'de> DeserializeSeed<'de> for TraceColumnsVisitor {
    type Value = DeviceTrace;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<DeviceTrace, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for TraceColumnsVisitor {
    type Value = DeviceTrace;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace's columns")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<DeviceTrace, A::Error> {
        let device: u32 = element(&mut seq)?;
        if let Some(head) = self.head
            && head.device != device
        {
            return Err(A::Error::custom(format!(
                "a trace of device {device} where its head says device {}",
                head.device
            )));
        }
        // The most events the actions column (a byte each) may hold.
        let most = match self.head {
            Some(head) => Some(head.events),
            None => EVENT_LIMIT.get().map(|limit| limit.left),
        };
        let actions = column(&mut seq, most.map(|n| n + COLUMN_OVERHEAD), |bytes| {
            take_events(bytes.len())?;
            Ok(bytes.to_vec())
        })?;
        let n = actions.len();
        if let Some(head) = self.head
            && head.events != n as u64
        {
            return Err(A::Error::custom(format!(
                "a trace of {n} events where its head declares {}",
                head.events
            )));
        }
        let names: Vec<String> = element(&mut seq)?;
        let other_actions = other_actions(&actions, names).map_err(A::Error::custom)?;
        let most = Some(most_column_bytes(n));
        let address = column(&mut seq, most, |bytes| dense(bytes, n, |r| r.u64()))?;
        let size = column(&mut seq, most, |bytes| dense(bytes, n, |r| r.u64()))?;
        let stream = column(&mut seq, most, |bytes| {
            let mut r = ColumnReader::dense(bytes);
            let stream = Column::read(n, || r.i64())?;
            r.finish()?;
            Ok(stream)
        })?;
        let time_us = column(&mut seq, most, |bytes| {
            let mut r = ColumnReader::sparse(bytes, n)?;
            let mut last_time = 0i64;
            let time_us = Optional::read(r.present, n, || {
                last_time = last_time.wrapping_add(r.i64()?);
                Ok::<_, Corrupt>(last_time)
            })?;
            r.finish()?;
            Ok(time_us)
        })?;
        let stack = column(&mut seq, most, |bytes| ids(bytes, n))?;
        let device_free = column(&mut seq, most, |bytes| rare(bytes, n, |r| r.u64()))?;
        let compile_context = column(&mut seq, most, |bytes| ids(bytes, n))?;
        let user_metadata = column(&mut seq, most, |bytes| ids(bytes, n))?;
        let pool_id = column(&mut seq, most, |bytes| {
            rare(bytes, n, |r| Ok((r.i64()?, r.i64()?)))
        })?;
        let alloc_seq = column(&mut seq, most, |bytes| rare(bytes, n, |r| r.u64()))?;
        let extra: Vec<(u32, Extra)> = element(&mut seq)?;
        let details = details(n, device_free, pool_id, extra).map_err(A::Error::custom)?;
        Ok(DeviceTrace {
            device,
            events: Events {
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
            },
        })
    }
}

/// Steps over a trace's columns after its device, each read no further
/// than its events allow (the events counted against the file's limit),
/// keeping nothing.
pub(crate) fn skip_columns<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<(), A::Error> {
    let most = EVENT_LIMIT.get().map(|limit| limit.left + COLUMN_OVERHEAD);
    let n = column(seq, most, |bytes| {
        take_events(bytes.len())?;
        Ok(bytes.len())
    })?;
    element::<A, de::IgnoredAny>(seq)?;
    // address, size, stream, time_deltas, stack, device_free,
    // compile_context, user_metadata, pool_id, alloc_seq
    for _ in 0..10 {
        column(seq, Some(most_column_bytes(n)), |_| Ok(()))?;
    }
    while seq.next_element::<de::IgnoredAny>()?.is_some() {}
    Ok(())
}

/// The next element of a trace's columns, which must be there.
fn element<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(seq: &mut A) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| A::Error::custom("a trace ends before its last column"))
}

/// The next column of a trace, of at most `most_bytes` bytes with its
/// MessagePack marker, turned into values by `decode`.
fn column<'de, A: SeqAccess<'de>, T>(
    seq: &mut A,
    most_bytes: Option<u64>,
    decode: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<T, A::Error> {
    COLUMN_BYTES_LEFT.set(most_bytes);
    // Its bytes are limited here, not by what the frame's other tables may hold.
    let column = crate::head_limit::in_bulk_table(|| seq.next_element_seed(Decoded(decode)));
    COLUMN_BYTES_LEFT.set(None);
    column?.ok_or_else(|| A::Error::custom("a trace ends before its last column"))
}

/// Decodes a byte string with its function while the deserializer still
/// holds the bytes, instead of copying them out first.
struct Decoded<F>(F);

impl<'de, T, F: FnOnce(&[u8]) -> Result<T, String>> DeserializeSeed<'de> for Decoded<F> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_bytes(self)
    }
}

impl<'de, T, F: FnOnce(&[u8]) -> Result<T, String>> Visitor<'de> for Decoded<F> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace column of bytes")
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<T, E> {
        (self.0)(bytes).map_err(E::custom)
    }
}

/// The events whose action has no code, with the names given for them in
/// order, after checking every other code.
fn other_actions(actions: &[u8], names: Vec<String>) -> Result<Vec<(usize, Box<str>)>, String> {
    let mut names = names.into_iter();
    let mut other_actions = Vec::new();
    for (i, &code) in actions.iter().enumerate() {
        if code == OTHER_ACTION {
            let name = names.next().ok_or("missing name of an unknown action")?;
            other_actions.push((i, name.into_boxed_str()));
        } else if Action::from_code(code).is_none() {
            return Err(format!("unknown action code {code}"));
        }
    }
    if names.next().is_some() {
        return Err("more names of unknown actions than such actions".to_owned());
    }
    Ok(other_actions)
}

/// A sparse column of table indices (stacks, strings).
fn ids(bytes: &[u8], n: usize) -> Result<Optional<u32>, String> {
    let mut r = ColumnReader::sparse(bytes, n)?;
    let field = Optional::read(r.present, n, || u32_of(r.u64()?))?;
    r.finish()?;
    Ok(field)
}

/// The `n` values of a column with one per event.
fn dense<T>(
    bytes: &[u8],
    n: usize,
    mut read: impl FnMut(&mut ColumnReader) -> Result<T, Corrupt>,
) -> Result<Vec<T>, String> {
    let mut r = ColumnReader::dense(bytes);
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        values.push(read(&mut r)?);
    }
    r.finish()?;
    Ok(values)
}

/// The values of a sparse column that few events have, with their event.
fn rare<T>(
    bytes: &[u8],
    n: usize,
    mut read: impl FnMut(&mut ColumnReader) -> Result<T, Corrupt>,
) -> Result<Vec<(usize, T)>, String> {
    let mut r = ColumnReader::sparse(bytes, n)?;
    // Sized once: a column present on every event (the allocation numbers
    // of snapdiff's own dumps) grown by doubling was copied at each step,
    // into fresh pages.
    let present: u32 = r.present.iter().map(|b| b.count_ones()).sum();
    let mut values = Vec::with_capacity((present as usize).min(n));
    for i in 0..n {
        if r.has(i) {
            values.push((i, read(&mut r)?));
        }
    }
    r.finish()?;
    Ok(values)
}

/// The rare fields of the `n` events that have any, sorted by event.
fn details(
    n: usize,
    device_free: Vec<(usize, u64)>,
    pool_id: Vec<(usize, (i64, i64))>,
    extra: Vec<(u32, Extra)>,
) -> Result<Vec<(usize, Box<EventDetails>)>, String> {
    let mut details: BTreeMap<usize, Box<EventDetails>> = BTreeMap::new();
    for (i, free) in device_free {
        details.entry(i).or_default().device_free = Some(free);
    }
    for (i, pool) in pool_id {
        details.entry(i).or_default().pool_id = Some(pool);
    }
    let mut last = None;
    for (i, keys) in extra {
        let i = i as usize;
        if i >= n || last.is_some_and(|last| i <= last) {
            return Err("extra keys for an event that does not exist, or out of order".to_owned());
        }
        last = Some(i);
        details.entry(i).or_default().extra = keys;
    }
    Ok(details.into_iter().collect())
}

/// The frame table as version 1 wrote it: every name and file in full.
#[derive(Deserialize)]
struct FrameColumnsV1 {
    names: Vec<CompactString>,
    files: Vec<CompactString>,
    /// Line minus the previous frame's line.
    line_deltas: Vec<i64>,
    extra: Vec<Vec<(String, String)>>,
}

/// The frame table since version 2: each distinct name and file once, and
/// columns of numbers (see docs/format.md). Thousands of distinct frames
/// share a few dozen texts in real files; read as texts, one MessagePack
/// item at a time, they made a `.snap` slower to read than its pickle.
#[derive(Serialize)]
struct FrameColumns<'a> {
    texts: Vec<&'a str>,
    /// Per frame, the index of its name in `texts`.
    names: ByteBuf,
    /// Per frame, the index of its file in `texts`.
    files: ByteBuf,
    /// Per frame, its line minus the previous frame's line (small once
    /// frames are sorted; see [`Snapshot::sort_frames`](crate::Snapshot::sort_frames)).
    line_deltas: ByteBuf,
    /// Frame index and extra keys, for the few frames with any.
    extra: Vec<(u32, &'a [(String, String)])>,
}

/// `#[serde(with = "frames")]` for the frame table: columns in binary files,
/// a list of frame objects in JSON.
pub(crate) mod frames {
    use rustc_hash::FxHashMap;
    use serde::de::{SeqAccess, Visitor};

    use super::*;

    pub(crate) fn serialize<S: Serializer>(frames: &[Frame], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return frames.serialize(s);
        }
        let mut texts: Vec<&str> = Vec::new();
        let mut text_ids: FxHashMap<&str, u64> = FxHashMap::default();
        let (mut names, mut files, mut lines) = (Vec::new(), Vec::new(), Vec::new());
        let mut last_line = 0i64;
        for f in frames {
            for (text, column) in [(f.name.as_str(), &mut names), (f.file.as_str(), &mut files)] {
                let id = *text_ids.entry(text).or_insert_with(|| {
                    texts.push(text);
                    texts.len() as u64 - 1
                });
                write_u64(column, id);
            }
            write_i64(&mut lines, i64::from(f.line) - last_line);
            last_line = i64::from(f.line);
        }
        FrameColumns {
            texts,
            names: names.into(),
            files: files.into(),
            line_deltas: lines.into(),
            extra: frames
                .iter()
                .enumerate()
                .filter(|(_, f)| !f.extra.is_empty())
                .map(|(i, f)| (i as u32, f.extra.as_slice()))
                .collect(),
        }
        .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Frame>, D::Error> {
        if d.is_human_readable() {
            return Vec::<Frame>::deserialize(d);
        }
        d.deserialize_seq(FramesVisitor)
    }

    /// Reads either layout, told apart by its number of fields (four in
    /// version 1, five since).
    struct FramesVisitor;

    impl<'de> Visitor<'de> for FramesVisitor {
        type Value = Vec<Frame>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a frame table")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Frame>, A::Error> {
            let missing = || A::Error::custom("frame table has too few fields");
            if seq.size_hint() == Some(4) {
                let v1 = FrameColumnsV1 {
                    names: seq.next_element()?.ok_or_else(missing)?,
                    files: seq.next_element()?.ok_or_else(missing)?,
                    line_deltas: seq.next_element()?.ok_or_else(missing)?,
                    extra: seq.next_element()?.ok_or_else(missing)?,
                };
                return from_v1(v1).map_err(A::Error::custom);
            }
            let texts: Vec<CompactString> = seq.next_element()?.ok_or_else(missing)?;
            let names: ByteBuf = seq.next_element()?.ok_or_else(missing)?;
            let files: ByteBuf = seq.next_element()?.ok_or_else(missing)?;
            let lines: ByteBuf = seq.next_element()?.ok_or_else(missing)?;
            let extra: Vec<(u32, Vec<(String, String)>)> =
                seq.next_element()?.ok_or_else(missing)?;
            if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                return Err(A::Error::custom("frame table has too many fields"));
            }
            from_columns(&texts, &names, &files, &lines, extra).map_err(A::Error::custom)
        }
    }

    fn from_columns(
        texts: &[CompactString],
        names: &[u8],
        files: &[u8],
        lines: &[u8],
        extra: Vec<(u32, Vec<(String, String)>)>,
    ) -> Result<Vec<Frame>, String> {
        let corrupt = |_| "frame column ends early or holds an overlong number".to_owned();
        let text = |r: &mut ColumnReader| -> Result<CompactString, String> {
            let id = r.u64().map_err(corrupt)?;
            let text = usize::try_from(id).ok().and_then(|id| texts.get(id));
            text.cloned()
                .ok_or_else(|| format!("frame text {id} out of range ({} texts)", texts.len()))
        };
        let (mut names, mut files, mut lines) = (
            ColumnReader::dense(names),
            ColumnReader::dense(files),
            ColumnReader::dense(lines),
        );
        let mut frames = Vec::new();
        let mut line = 0i64;
        while names.pos < names.bytes.len() {
            line = line.wrapping_add(lines.i64().map_err(corrupt)?);
            frames.push(Frame {
                name: text(&mut names)?,
                file: text(&mut files)?,
                line: u32::try_from(line).map_err(|_| "frame line out of range".to_owned())?,
                extra: Vec::new(),
            });
        }
        for column in [&files, &lines] {
            if column.pos != column.bytes.len() {
                return Err("frame columns of different lengths".to_owned());
            }
        }
        for (i, keys) in extra {
            let frame = frames
                .get_mut(i as usize)
                .ok_or_else(|| format!("extra keys for frame {i}, past the table"))?;
            frame.extra = keys;
        }
        Ok(frames)
    }

    fn from_v1(c: FrameColumnsV1) -> Result<Vec<Frame>, String> {
        let n = c.names.len();
        if c.files.len() != n || c.line_deltas.len() != n || c.extra.len() != n {
            return Err("frame columns of different lengths".to_owned());
        }
        let mut line = 0i64;
        let mut lines = Vec::with_capacity(n);
        for d in c.line_deltas {
            line = line.wrapping_add(d);
            lines.push(u32::try_from(line).map_err(|_| "frame line out of range".to_owned())?);
        }
        Ok(c.names
            .into_iter()
            .zip(c.files)
            .zip(lines)
            .zip(c.extra)
            .map(|(((name, file), line), extra)| Frame {
                name,
                file,
                line,
                extra,
            })
            .collect())
    }
}

/// `#[serde(with = "stacks")]` for the stack table: in binary files (since
/// version 2) one byte string of varints, the number of stacks, then each
/// stack's length and frame ids; a list of lists in JSON (and in version 1).
pub(crate) mod stacks {
    use serde::de::{SeqAccess, Visitor};

    use super::*;
    use crate::model::FrameId;

    pub(crate) fn serialize<S: Serializer>(
        stacks: &[Vec<FrameId>],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return stacks.serialize(s);
        }
        let mut w = Vec::new();
        write_u64(&mut w, stacks.len() as u64);
        for stack in stacks {
            write_u64(&mut w, stack.len() as u64);
            for &f in stack {
                write_u64(&mut w, u64::from(f));
            }
        }
        s.serialize_bytes(&w)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<Vec<FrameId>>, D::Error> {
        if d.is_human_readable() {
            return Vec::<Vec<FrameId>>::deserialize(d);
        }
        d.deserialize_any(StacksVisitor)
    }

    struct StacksVisitor;

    impl<'de> Visitor<'de> for StacksVisitor {
        type Value = Vec<Vec<FrameId>>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a stack table")
        }

        fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Self::Value, E> {
            from_bytes(bytes).map_err(E::custom)
        }

        /// Version 1: a list of lists of frame ids.
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut stacks = Vec::new();
            while let Some(stack) = seq.next_element()? {
                stacks.push(stack);
            }
            Ok(stacks)
        }
    }

    fn from_bytes(bytes: &[u8]) -> Result<Vec<Vec<FrameId>>, String> {
        let corrupt = |_| "stack table ends early or holds an overlong number".to_owned();
        let mut r = ColumnReader::dense(bytes);
        // Every stack and frame id takes at least a byte: a count larger than
        // what is left is corrupt, and never reserved for.
        let count = r.u64().map_err(corrupt)?;
        let mut stacks = Vec::with_capacity(bytes.len().min(count as usize));
        for _ in 0..count {
            let len = r.u64().map_err(corrupt)?;
            let left = bytes.len() - r.pos;
            let mut stack = Vec::with_capacity(left.min(len as usize));
            for _ in 0..len {
                let id = r.u64().map_err(corrupt)?;
                stack.push(
                    FrameId::try_from(id).map_err(|_| format!("frame id {id} out of range"))?,
                );
            }
            stacks.push(stack);
        }
        r.finish()
            .map_err(|_| "stack table has extra bytes".to_owned())?;
        Ok(stacks)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Serializes through [`serialize`], as the snapshot's field does.
        struct Stacks<'a>(&'a [Vec<FrameId>]);

        impl Serialize for Stacks<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                serialize(self.0, s)
            }
        }

        /// The column `serialize` writes for `stacks`.
        fn encode(stacks: &[Vec<FrameId>]) -> Vec<u8> {
            let msgpack = rmp_serde::to_vec(&Stacks(stacks)).unwrap();
            rmp_serde::from_slice::<ByteBuf>(&msgpack)
                .unwrap()
                .into_vec()
        }

        #[test]
        fn stacks_round_trip_through_their_column() {
            let stacks = vec![vec![0, 1, 2], vec![], vec![300, 70_000]];
            assert_eq!(from_bytes(&encode(&stacks)).unwrap(), stacks);
        }

        /// Counts and lengths are checked against the bytes left, so a
        /// corrupt table is refused without reserving what it claims.
        #[test]
        fn absurd_counts_are_refused_without_reserving_them() {
            let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
            let err = from_bytes(&huge).unwrap_err();
            assert!(err.contains("ends early"), "{err}");
            let mut one_huge_stack = vec![1];
            one_huge_stack.extend(huge);
            let err = from_bytes(&one_huge_stack).unwrap_err();
            assert!(err.contains("ends early"), "{err}");
            let mut extra = encode(&[vec![1]]);
            extra.push(0);
            let err = from_bytes(&extra).unwrap_err();
            assert!(err.contains("extra bytes"), "{err}");
        }
    }
}

#[cfg(test)]
mod trace_tests {
    use super::*;
    use crate::model::TraceEvent;

    /// The columns of a small trace, as a `.snap` file holds them.
    fn columns_of(events: Vec<TraceEvent>) -> Vec<u8> {
        let trace = DeviceTrace {
            device: 0,
            events: events.into(),
        };
        rmp_serde::to_vec(&trace).unwrap()
    }

    fn events() -> Vec<TraceEvent> {
        (0..20)
            .map(|i| TraceEvent {
                action: if i == 7 {
                    Action::Other("future_action".into())
                } else {
                    Action::Alloc
                },
                address: 0x7f00_0000_0000 + i * 512,
                size: 512,
                time_us: Some(1_700_000_000_000_000 + i as i64),
                stack: Some(i as u32 % 3),
                ..TraceEvent::default()
            })
            .collect()
    }

    /// A change to a trace's columns.
    type Tamper = Box<dyn FnOnce(&mut TraceColumns)>;

    /// Decodes `bytes` after `tamper` changed its columns.
    fn decode_with(tamper: impl FnOnce(&mut TraceColumns)) -> Result<DeviceTrace, String> {
        let bytes = columns_of(events());
        let mut c: TraceColumns = rmp_serde::from_slice(&bytes).unwrap();
        tamper(&mut c);
        let tampered = rmp_serde::to_vec(&c).unwrap();
        rmp_serde::from_slice(&tampered).map_err(|e| e.to_string())
    }

    #[test]
    fn varints_of_every_length_read_back_wherever_they_end() {
        // Values of 1 to 10 bytes, each bit pattern's edges.
        let mut values = vec![0, 1, 127, 128, 255, 300, 16_383, 16_384, u64::MAX];
        for bits in 7..64 {
            values.extend([1u64 << bits, (1u64 << bits) - 1, (1u64 << bits) | 0x55]);
        }
        let mut column = Vec::new();
        for &v in &values {
            write_u64(&mut column, v);
        }
        // Read from the start and from each shorter tail, so that values end
        // at every distance from the column's end.
        let mut r = ColumnReader::dense(&column);
        for &v in &values {
            assert_eq!(r.u64().ok(), Some(v));
        }
        assert!(r.finish().is_ok());
        for skip in 1..values.len() {
            let mut head = Vec::new();
            for &v in &values[..skip] {
                write_u64(&mut head, v);
            }
            let mut r = ColumnReader::dense(&column[head.len()..]);
            for &v in &values[skip..] {
                assert_eq!(r.u64().ok(), Some(v), "value {v} after {skip}");
            }
        }
        // Cut short, or eleven bytes long: refused.
        let mut cut = Vec::new();
        write_u64(&mut cut, 1 << 40);
        cut.pop();
        assert!(ColumnReader::dense(&cut).u64().is_err());
        assert!(ColumnReader::dense(&[0xff; 11]).u64().is_err());
        assert!(ColumnReader::dense(&[0xff; 20]).u64().is_err());
    }

    #[test]
    fn trace_columns_read_back_and_corrupt_ones_are_refused() {
        let back = decode_with(|_| {}).unwrap();
        assert_eq!(back.events.iter().collect::<Vec<_>>(), events());

        let cases: [(&str, Tamper); 6] = [
            ("ends early", Box::new(|c| c.address.truncate(10))),
            ("extra bytes", Box::new(|c| c.size.push(1))),
            ("unknown action code", Box::new(|c| c.actions[0] = 200)),
            ("missing name", Box::new(|c| c.other_actions.clear())),
            (
                "out of range",
                Box::new(|c| {
                    // Event 0's stack becomes 2^40.
                    let stack = &mut c.stack;
                    stack.truncate(3);
                    stack.extend([0x80, 0x80, 0x80, 0x80, 0x80, 0x20]);
                    stack.extend(columns_stack_tail());
                }),
            ),
            (
                "extra keys for an event that does not exist",
                Box::new(|c| c.extra.push((99, Extra::default()))),
            ),
        ];
        for (expected, tamper) in cases {
            let err = decode_with(tamper).unwrap_err();
            assert!(err.contains(expected), "{expected}: {err}");
        }
    }

    /// The stack column's values after event 0's.
    fn columns_stack_tail() -> Vec<u8> {
        let bytes = columns_of(events());
        let c: TraceColumns = rmp_serde::from_slice(&bytes).unwrap();
        c.stack[4..].to_vec()
    }
}
