//! Column layouts for the two big tables, in binary files only.
//!
//! Trace events and frames are stored column by column in `.snap` files:
//! all actions, then all addresses, and so on, with times stored as
//! differences from the previous event. Values of one kind side by
//! side compress far better than rows of mixed fields (a third smaller on
//! real snapshots). JSON keeps the plain row form, one object per event.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{Action, DeviceTrace, EventDetails, Frame, StackId, StrId, TraceEvent};
use crate::value::Extra;

/// Code of an action without a code of its own in the action column; its name
/// is in `other_actions`, in order of appearance.
const OTHER_ACTION: u8 = u8::MAX;

#[derive(Serialize, Deserialize)]
struct TraceColumns {
    device: u32,
    actions: Vec<u8>,
    other_actions: Vec<String>,
    /// Addresses as they are: a free repeats its allocation's address
    /// exactly, which the compressor finds; differences would hide that.
    address: Vec<u64>,
    size: Vec<u64>,
    stream: Vec<i64>,
    /// Time minus the previous event's time that had one.
    time_deltas: Vec<Option<i64>>,
    stack: Vec<Option<StackId>>,
    device_free: Vec<Option<u64>>,
    compile_context: Vec<Option<StrId>>,
    user_metadata: Vec<Option<StrId>>,
    pool_id: Vec<Option<(i64, i64)>>,
    alloc_seq: Vec<Option<u64>>,
    extra: Vec<Extra>,
}

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
            address: Vec::with_capacity(n),
            size: Vec::with_capacity(n),
            stream: Vec::with_capacity(n),
            time_deltas: Vec::with_capacity(n),
            stack: Vec::with_capacity(n),
            device_free: Vec::with_capacity(n),
            compile_context: Vec::with_capacity(n),
            user_metadata: Vec::with_capacity(n),
            pool_id: Vec::with_capacity(n),
            alloc_seq: Vec::with_capacity(n),
            extra: Vec::with_capacity(n),
        };
        let mut last_time = 0i64;
        for ev in &self.events {
            match ev.action.code() {
                Some(code) => c.actions.push(code),
                None => {
                    c.actions.push(OTHER_ACTION);
                    c.other_actions.push(ev.action.name().to_owned());
                }
            }
            c.address.push(ev.address);
            c.size.push(ev.size);
            c.stream.push(ev.stream);
            c.time_deltas.push(ev.time_us.map(|t| {
                let d = t.wrapping_sub(last_time);
                last_time = t;
                d
            }));
            c.stack.push(ev.stack);
            let details = ev.details.as_deref();
            c.device_free.push(details.and_then(|d| d.device_free));
            c.compile_context.push(ev.compile_context);
            c.user_metadata.push(ev.user_metadata);
            c.pool_id.push(details.and_then(|d| d.pool_id));
            c.alloc_seq.push(ev.alloc_seq);
            c.extra
                .push(details.map(|d| d.extra.clone()).unwrap_or_default());
        }
        c.serialize(s)
    }
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
        let n = c.actions.len();
        let lengths = [
            c.address.len(),
            c.size.len(),
            c.stream.len(),
            c.time_deltas.len(),
            c.stack.len(),
            c.device_free.len(),
            c.compile_context.len(),
            c.user_metadata.len(),
            c.pool_id.len(),
            c.alloc_seq.len(),
            c.extra.len(),
        ];
        if lengths.iter().any(|&l| l != n) {
            return Err(D::Error::custom("trace columns of different lengths"));
        }
        let mut others = c.other_actions.into_iter();
        let mut events = Vec::with_capacity(n);
        let mut time = 0i64;
        let mut extras = c.extra.into_iter();
        for i in 0..n {
            let action = match c.actions[i] {
                OTHER_ACTION => Action::Other(
                    others
                        .next()
                        .ok_or_else(|| D::Error::custom("missing name of an unknown action"))?
                        .into(),
                ),
                code => Action::from_code(code)
                    .ok_or_else(|| D::Error::custom(format!("unknown action code {code}")))?,
            };
            let time_us = c.time_deltas[i].map(|d| {
                time = time.wrapping_add(d);
                time
            });
            events.push(TraceEvent {
                action,
                address: c.address[i],
                size: c.size[i],
                stream: c.stream[i],
                time_us,
                stack: c.stack[i],

                compile_context: c.compile_context[i],
                user_metadata: c.user_metadata[i],

                alloc_seq: c.alloc_seq[i],
                details: None,
            });
            let extra = extras.next().unwrap_or_default();
            if c.device_free[i].is_some() || c.pool_id[i].is_some() || !extra.is_empty() {
                let ev = events.last_mut().expect("just pushed");
                ev.details = Some(Box::new(EventDetails {
                    device_free: c.device_free[i],
                    pool_id: c.pool_id[i],
                    extra,
                }));
            }
        }
        Ok(DeviceTrace {
            device: c.device,
            events,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct FrameColumns {
    names: Vec<String>,
    files: Vec<String>,
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
