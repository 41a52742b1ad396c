//! Column layouts for the two big tables, in binary files only.
//!
//! Trace events and frames are stored column by column in `.snap` files:
//! all actions, then all addresses, and so on, with times stored as
//! differences from the previous event. Values of one kind side by
//! side compress far better than rows of mixed fields (a third smaller on
//! real snapshots). JSON keeps the plain row form, one object per event.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{Action, CompactString, DeviceTrace, Frame, TraceEvent};
use crate::value::Extra;

/// Code of an action without a code of its own in the action column; its name
/// is in `other_actions`, in order of appearance.
const OTHER_ACTION: u8 = u8::MAX;

#[derive(Serialize)]
struct TraceRows<'a> {
    device: u32,
    events: &'a [TraceEvent],
}

#[derive(Deserialize)]
struct TraceRowsOwned {
    device: u32,
    events: Vec<TraceEvent>,
}

/// Writes LEB128 varints, zigzag for signed values, and presence bitmaps.
///
/// Hand-written because no crate pairs these with the bitmap layout below,
/// and decoding a column of plain bytes is many times faster than decoding
/// the same values one MessagePack item at a time.
#[derive(Default)]
struct ColumnWriter(Vec<u8>);

impl ColumnWriter {
    fn u64(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn i64(&mut self, v: i64) {
        self.u64(((v << 1) ^ (v >> 63)) as u64);
    }

    /// A bitmap with bit `i` set when `present(i)`, then `write` for each present value.
    fn optional<T: Copy>(
        events: &[TraceEvent],
        get: impl Fn(&TraceEvent) -> Option<T>,
        write: impl Fn(&mut Self, T),
    ) -> Vec<u8> {
        let mut w = ColumnWriter(vec![0; events.len().div_ceil(8)]);
        for (i, e) in events.iter().enumerate() {
            if let Some(v) = get(e) {
                w.0[i / 8] |= 1 << (i % 8);
                write(&mut w, v);
            }
        }
        w.0
    }

    fn all(events: &[TraceEvent], write: impl Fn(&mut Self, &TraceEvent)) -> Vec<u8> {
        let mut w = ColumnWriter(Vec::with_capacity(events.len() * 2));
        for e in events {
            write(&mut w, e);
        }
        w.0
    }
}

/// A column that ends early or holds an overlong number.
struct Corrupt;

impl From<Corrupt> for String {
    #[cold]
    fn from(_: Corrupt) -> String {
        "trace column ends early or holds an overlong number".to_owned()
    }
}

/// Reads what [`ColumnWriter`] wrote, failing cleanly on short or overlong input.
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
/// per field (see docs/format.md for the layout of each).
#[derive(Serialize, Deserialize)]
struct TraceColumns {
    device: u32,
    actions: serde_bytes::ByteBuf,
    other_actions: Vec<String>,
    address: serde_bytes::ByteBuf,
    size: serde_bytes::ByteBuf,
    stream: serde_bytes::ByteBuf,
    time_deltas: serde_bytes::ByteBuf,
    stack: serde_bytes::ByteBuf,
    device_free: serde_bytes::ByteBuf,
    compile_context: serde_bytes::ByteBuf,
    user_metadata: serde_bytes::ByteBuf,
    pool_id: serde_bytes::ByteBuf,
    alloc_seq: serde_bytes::ByteBuf,
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
        let ev = self.events.as_slice();
        let bytes = serde_bytes::ByteBuf::from;
        let mut last_time = 0i64;
        let time_deltas = {
            let mut w = ColumnWriter(vec![0; ev.len().div_ceil(8)]);
            for (i, e) in ev.iter().enumerate() {
                if let Some(t) = e.time_us {
                    w.0[i / 8] |= 1 << (i % 8);
                    w.i64(t.wrapping_sub(last_time));
                    last_time = t;
                }
            }
            w.0
        };
        TraceColumns {
            device: self.device,
            actions: bytes(
                ev.iter()
                    .map(|e| e.action.code().unwrap_or(OTHER_ACTION))
                    .collect(),
            ),
            other_actions: ev
                .iter()
                .filter(|e| e.action.code().is_none())
                .map(|e| e.action.name().to_owned())
                .collect(),
            // Addresses as they are: a free repeats its allocation's address
            // exactly, which the compressor finds; differences would hide that.
            address: bytes(ColumnWriter::all(ev, |w, e| w.u64(e.address))),
            size: bytes(ColumnWriter::all(ev, |w, e| w.u64(e.size))),
            stream: bytes(ColumnWriter::all(ev, |w, e| w.i64(e.stream))),
            time_deltas: bytes(time_deltas),
            stack: bytes(ColumnWriter::optional(
                ev,
                |e| e.stack,
                |w, v| w.u64(v.into()),
            )),
            device_free: bytes(ColumnWriter::optional(
                ev,
                TraceEvent::device_free,
                ColumnWriter::u64,
            )),
            compile_context: bytes(ColumnWriter::optional(
                ev,
                |e| e.compile_context,
                |w, v| w.u64(v.into()),
            )),
            user_metadata: bytes(ColumnWriter::optional(
                ev,
                |e| e.user_metadata,
                |w, v| w.u64(v.into()),
            )),
            pool_id: bytes(ColumnWriter::optional(
                ev,
                |e| e.details.as_ref().and_then(|d| d.pool_id),
                |w, (a, b)| {
                    w.i64(a);
                    w.i64(b);
                },
            )),
            alloc_seq: bytes(ColumnWriter::optional(
                ev,
                |e| e.alloc_seq,
                ColumnWriter::u64,
            )),
            extra: ev
                .iter()
                .enumerate()
                .filter_map(|(i, e)| {
                    e.details
                        .as_ref()
                        .filter(|d| !d.extra.is_empty())
                        .map(|d| (i as u32, d.extra.clone()))
                })
                .collect(),
        }
        .serialize(s)
    }
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
        let c = TraceColumns::deserialize(d)?;
        decode_trace(c).map_err(D::Error::custom)
    }
}

/// Rebuilds the events in one pass, reading every column side by side.
fn decode_trace(c: TraceColumns) -> Result<DeviceTrace, String> {
    let n = c.actions.len();
    let mut others = c.other_actions.into_iter();
    let mut address = ColumnReader::dense(&c.address);
    let mut size = ColumnReader::dense(&c.size);
    let mut stream = ColumnReader::dense(&c.stream);
    let mut time = ColumnReader::sparse(&c.time_deltas, n)?;
    let mut stack = ColumnReader::sparse(&c.stack, n)?;
    let mut device_free = ColumnReader::sparse(&c.device_free, n)?;
    let mut compile_context = ColumnReader::sparse(&c.compile_context, n)?;
    let mut user_metadata = ColumnReader::sparse(&c.user_metadata, n)?;
    let mut pool_id = ColumnReader::sparse(&c.pool_id, n)?;
    let mut alloc_seq = ColumnReader::sparse(&c.alloc_seq, n)?;
    let mut last_time = 0i64;
    let mut events = Vec::with_capacity(n);
    for (i, &code) in c.actions.iter().enumerate() {
        let action = match code {
            OTHER_ACTION => Action::Other(
                others
                    .next()
                    .ok_or("missing name of an unknown action")?
                    .into(),
            ),
            code => Action::from_code(code).ok_or_else(|| format!("unknown action code {code}"))?,
        };
        let mut e = TraceEvent {
            action,
            address: address.u64()?,
            size: size.u64()?,
            stream: stream.i64()?,
            time_us: None,
            stack: if stack.has(i) {
                Some(u32_of(stack.u64()?)?)
            } else {
                None
            },
            compile_context: if compile_context.has(i) {
                Some(u32_of(compile_context.u64()?)?)
            } else {
                None
            },
            user_metadata: if user_metadata.has(i) {
                Some(u32_of(user_metadata.u64()?)?)
            } else {
                None
            },
            alloc_seq: if alloc_seq.has(i) {
                Some(alloc_seq.u64()?)
            } else {
                None
            },
            details: None,
        };
        if time.has(i) {
            last_time = last_time.wrapping_add(time.i64()?);
            e.time_us = Some(last_time);
        }
        if device_free.has(i) {
            e.details_mut().device_free = Some(device_free.u64()?);
        }
        if pool_id.has(i) {
            e.details_mut().pool_id = Some((pool_id.i64()?, pool_id.i64()?));
        }
        events.push(e);
    }
    for column in [
        &address,
        &size,
        &stream,
        &time,
        &stack,
        &device_free,
        &compile_context,
        &user_metadata,
        &pool_id,
        &alloc_seq,
    ] {
        column.finish()?;
    }
    for (i, extra) in c.extra {
        events
            .get_mut(i as usize)
            .ok_or("extra keys for an event that does not exist")?
            .details_mut()
            .extra = extra;
    }
    Ok(DeviceTrace {
        device: c.device,
        events,
    })
}

#[derive(Serialize, Deserialize)]
struct FrameColumns {
    names: Vec<CompactString>,
    files: Vec<CompactString>,
    /// Line minus the previous frame's line: small once frames are sorted
    /// (see [`Snapshot::sort_frames`](crate::Snapshot::sort_frames)).
    line_deltas: Vec<i64>,
    extra: Vec<Vec<(String, String)>>,
}

/// `#[serde(with = "frames")]` for the frame table: columns in binary files,
/// a list of frame objects in JSON.
pub(crate) mod frames {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(frames: &[Frame], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return frames.serialize(s);
        }
        FrameColumns {
            names: frames.iter().map(|f| f.name.clone()).collect(),
            files: frames.iter().map(|f| f.file.clone()).collect(),
            line_deltas: frames
                .iter()
                .scan(0i64, |last, f| {
                    let d = i64::from(f.line) - *last;
                    *last = i64::from(f.line);
                    Some(d)
                })
                .collect(),
            extra: frames.iter().map(|f| f.extra.clone()).collect(),
        }
        .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Frame>, D::Error> {
        if d.is_human_readable() {
            return Vec::<Frame>::deserialize(d);
        }
        let c = FrameColumns::deserialize(d)?;
        let n = c.names.len();
        if c.files.len() != n || c.line_deltas.len() != n || c.extra.len() != n {
            return Err(D::Error::custom("frame columns of different lengths"));
        }
        let mut line = 0i64;
        let mut lines = Vec::with_capacity(n);
        for d in c.line_deltas {
            line = line.wrapping_add(d);
            lines.push(
                u32::try_from(line).map_err(|_| D::Error::custom("frame line out of range"))?,
            );
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
