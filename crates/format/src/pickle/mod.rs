//! Reading PyTorch's memory snapshot pickles.
//!
//! Handles what `torch.cuda.memory._dump_snapshot()` writes (protocol 4, or 5
//! on Python 3.14), the C++ `_memory_snapshot_pickled()` (protocol 2), a bare
//! list of segments (`memory_snapshot()`), and `torch.save` files holding
//! those (zip, and the legacy format of sequential pickles). The layout and
//! its variations across PyTorch versions are described
//! in `reference/pytorch-snapshot.md` and `docs/format.md`.
//!
//! # What makes it fast
//!
//! The reader is a pickle machine (`machine.rs`) that never builds the
//! file as generic Python values:
//!
//! - strings are borrowed from the input (a mapped file's pages), and each
//!   pickled string is recognised once as a key of PyTorch's schema or not;
//! - every completed frame, frame list, trace event and block is turned into
//!   its typed, interned record at once (`lower.rs`), so a file of millions
//!   of events never exists as millions of dicts, and the containers those
//!   dicts were made in are freed as they are lowered; a segment is made as
//!   soon as its dict is complete, taking its blocks while they are in cache;
//! - a record whose keys and values are all memo gets and numbers, as
//!   PyTorch writes every event and block, is read straight from its
//!   bytes (`Machine::flat_record`), with no dict made;
//! - a device's events go straight into the column store (25 bytes an event
//!   on PyTorch's traces, against 112 as structs), and a device's event
//!   list and a segment's block list are held as runs of records, not a
//!   handle each;
//! - a file of 8 MiB or more is read on two threads, the segments on one
//!   and the trace on the other, or, for a long trace, split inside it
//!   (`halves.rs`), unless its reader asks for one (`Reader::one_thread`,
//!   for files read beside others);
//! - empty strings are compared without `memcmp`, whose AVX-512 form takes
//!   a microcode assist on an empty allocation's dangling pointer (100 ns,
//!   on every event's empty `user_metadata`).
//!
//! What is left of the memory is the records themselves, blocks in a
//! compact form until their segment takes them, the memo at 4 bytes a slot
//! (`memo.rs`), and the containers not yet read. The figures are in
//! `docs/performance.md`.

mod halves;
mod heap;
pub(crate) mod legacy_torch_save;
mod lower;
mod machine;
mod memo;
mod opcodes;
mod skim;
pub(crate) mod torch_zip;
mod write;

pub use write::write_torch_pickle;

use std::borrow::Cow;

use crate::Parts;
use crate::error::{Error, ErrorKind, Result};
use crate::events::Events;
use crate::model::{Annotation, DeviceTrace, Meta, PINNED_HOST_DEVICE, Segment, Snapshot};
use crate::read::Threads;
use heap::{
    Container, Failure, Heap, Val, at, entries, here, i64_of, index, items, key_text, str_of,
    u32_of,
};
use lower::Lowerer;
use machine::Half;

/// Reads a snapshot pickle. `container` names what held it (e.g. "torch.save zip")
/// for [`Meta::source`].
pub(crate) fn read(
    data: &[u8],
    container: Option<&str>,
    parts: Parts,
    threads: Threads,
    progress: Option<crate::progress::Progress>,
) -> Result<Snapshot> {
    snapshot_read(halves::read(data, parts, threads, progress)?, container)
}

/// The snapshot a pickle holds, from what the machine read.
fn snapshot_read(read: halves::Read, container: Option<&str>) -> Result<Snapshot> {
    let (mut snap, protocol, not_utf8, forward_frames) = match read {
        halves::Read::Whole((top, mut heap, mut lower, protocol)) => {
            let mut snap = Snapshot::default();
            match top {
                // A list of trace events is no list of segments: said so below.
                Val::Obj(id)
                    if !matches!(heap.containers[id as usize], Container::Events { .. })
                        && items(&heap, top).is_ok() =>
                {
                    // `torch.cuda.memory_snapshot()` returns only the segment list.
                    snap.segments = segments(&mut lower, &mut heap, top)
                        .map_err(|f| malformed("segments", f))?;
                }
                Val::Obj(_) if entries(&heap, top).is_ok() => {
                    let pairs = entries(&heap, top).expect("checked").to_vec();
                    if !has_segments(&heap, &pairs) {
                        return Err(not_snapshot("a dict without 'segments'"));
                    }
                    read_pairs(&mut snap, &pairs, &mut lower, &mut heap)?;
                }
                other => return Err(not_snapshot(heap::describe(&heap, other))),
            }
            (snap.frames, snap.stacks, snap.strings) =
                lower.into_tables(&heap).map_err(unplaced)?;
            (snap, protocol, heap.not_utf8, heap.forward_frames)
        }
        halves::Read::Joined(joined) => (
            joined.snap,
            joined.protocol,
            joined.not_utf8,
            joined.forward_frames,
        ),
    };
    if forward_frames {
        crate::forward::join(&mut snap);
    }
    // Said where the file is described: text that was not UTF-8 (Python's
    // lone surrogates, or damage) is shown with U+FFFD.
    let not_utf8 = match not_utf8 {
        0 => String::new(),
        1 => "; 1 string not UTF-8, shown with U+FFFD".to_owned(),
        n => format!("; {n} strings not UTF-8, shown with U+FFFD"),
    };
    snap.meta = Meta {
        producer: Meta::PRODUCER_TORCH.to_owned(),
        source: Some(match container {
            Some(c) => format!("PyTorch pickle (protocol {protocol}{not_utf8}) in a {c}"),
            None => format!("PyTorch pickle (protocol {protocol}{not_utf8})"),
        }),
        ..Meta::default()
    };
    Ok(snap)
}

fn not_snapshot(what: &str) -> Error {
    Error::new(
        ErrorKind::NotASnapshot,
        format!(
            "the pickle holds {what}, not a memory snapshot (expected a dict with \
             'segments', or a list of segments)"
        ),
    )
}

fn malformed(path: &str, f: Failure) -> Error {
    Error::new(
        ErrorKind::NotASnapshot,
        at(path, f).trim_start_matches('.').to_string(),
    )
}

/// [`malformed`] for a failure of the file as a whole, at no key.
fn unplaced(f: Failure) -> Error {
    Error::new(ErrorKind::NotASnapshot, f.trim_start_matches(": "))
}

/// Whether one of the top dict's `pairs` has the key `segments`.
fn has_segments(heap: &Heap, pairs: &[[Val; 2]]) -> bool {
    pairs
        .iter()
        .any(|&[k, _]| matches!(k, Val::Str(id) if heap.str(id) == "segments"))
}

/// The snapshot of what one half of a read in two holds.
fn snapshot_of(mut half: Half) -> Result<Snapshot> {
    let mut snap = Snapshot::default();
    read_pairs(&mut snap, &half.pairs, &mut half.lower, &mut half.heap)?;
    (snap.frames, snap.stacks, snap.strings) =
        half.lower.into_tables(&half.heap).map_err(unplaced)?;
    Ok(snap)
}

/// Reads the top dict's `pairs` (or those of one half of a read in two)
/// into `snap`, in order.
fn read_pairs(
    snap: &mut Snapshot,
    pairs: &[[Val; 2]],
    lower: &mut Lowerer,
    heap: &mut Heap,
) -> Result<()> {
    for &[k, v] in pairs {
        let key = key_text(heap, k);
        match key.as_str() {
            "segments" => {
                snap.segments = segments(lower, heap, v).map_err(|f| malformed("segments", f))?
            }
            "device_traces" => {
                snap.traces = traces(lower, heap, v).map_err(|f| malformed("device_traces", f))?
            }
            "external_annotations" => {
                snap.annotations =
                    annotations(lower, heap, v).map_err(|f| malformed("external_annotations", f))?
            }
            // The pinned host allocator's, in the layout of the
            // device's (PR #182407 built it after the CUDA
            // allocator): a device of its own. A layout this reader
            // cannot follow is kept as it is, never an error.
            "host_segments" => match host_segments(lower, heap, v) {
                Ok(host) => snap.segments.extend(host),
                Err(_) => snap.extra.push((
                    key,
                    lower
                        .value(heap, v, 1)
                        .map_err(|f| malformed("host_segments", f))?,
                )),
            },
            "host_traces" => match host_events(lower, heap, v) {
                Ok(events) => snap.traces.push(DeviceTrace {
                    device: PINNED_HOST_DEVICE,
                    events,
                }),
                Err(_) => snap.extra.push((
                    key,
                    lower
                        .value(heap, v, 1)
                        .map_err(|f| malformed("host_traces", f))?,
                )),
            },
            "allocator_settings" => {
                let value = lower
                    .value(heap, v, 1)
                    .map_err(|f| malformed("allocator_settings", f))?;
                snap.allocator_settings = value;
            }
            _ => {
                let value = lower.value(heap, v, 1).map_err(|f| malformed(&key, f))?;
                snap.extra.push((key, value));
            }
        }
    }
    Ok(())
}

/// The device segments in `v`. Each segment dict and its list of blocks
/// are freed from the heap once read, unless the pickle shares them: on a
/// file of a million blocks they would hold 70 MB to the end of the read.
fn segments(lower: &mut Lowerer, heap: &mut Heap, v: Val) -> Result<Vec<Segment>, Failure> {
    if let Some(all) = lower.take_segment_run(heap, &items(heap, v).map_err(here)?) {
        return Ok(all);
    }
    let n = items(heap, v).map_err(here)?.len();
    let free = heap.unshared(v);
    let mut out = Vec::with_capacity(n);
    let mut seen = Seen::default();
    for i in 0..n {
        let s = items(heap, v).map_err(here)?[i];
        let (seg, blocks) = seen
            .segment(lower, heap, s, false)
            .map_err(|f| index(i, f))?;
        out.push(seg);
        if free && heap.unshared(s) {
            if heap.unshared(blocks) {
                heap.free_read(blocks);
            }
            heap.free_read(s);
        }
    }
    Ok(out)
}

/// The pinned host allocator's segments in `v`. Left in the heap: a layout
/// this reader cannot follow is kept as a generic value instead.
fn host_segments(lower: &mut Lowerer, heap: &Heap, v: Val) -> Result<Vec<Segment>, Failure> {
    let list = items(heap, v).map_err(here)?;
    let mut out = Vec::with_capacity(list.len());
    let mut seen = Seen::default();
    for (i, &s) in list.iter().enumerate() {
        out.push(
            seen.segment(lower, heap, s, true)
                .map_err(|f| index(i, f))?
                .0,
        );
    }
    Ok(out)
}

/// The segment dicts one list of segments has given so far. PyTorch
/// writes each once; given again (a memo reference), a segment that is
/// kept for other readers would be copied at each repeat: 20,000
/// references to one segment of 1,000 blocks, a 69 KB file, took 1.4 GB.
/// (A block dict given twice is refused as its block is taken.)
#[derive(Default)]
struct Seen(rustc_hash::FxHashSet<u32>);

impl Seen {
    /// [`segment`] of `v`, refused where the list gave `v` before.
    fn segment(
        &mut self,
        lower: &mut Lowerer,
        heap: &Heap,
        v: Val,
        host: bool,
    ) -> Result<(Segment, Val), Failure> {
        if let Val::Obj(id) = v
            && !self.0.insert(id)
        {
            return Err(": the same segment dict appears twice".to_owned());
        }
        segment(lower, heap, v, host)
    }
}

/// The segment dict `v`, and the handle of its list of blocks (none for a
/// segment lowered while the pickle ran, which took its blocks then). A
/// lowered one stays for other readers where other keys hold its dict too,
/// or where it is the host allocator's (whose list falls back to a generic
/// value when this reader cannot follow it).
fn segment(
    lower: &mut Lowerer,
    heap: &Heap,
    v: Val,
    host: bool,
) -> Result<(Segment, Val), Failure> {
    if let Val::Obj(id) = v
        && let Container::Segment(i) = heap.containers[id as usize]
    {
        let keep = host || !heap.unshared(v);
        return Ok((lower.lowered_segment(i, host, keep)?, Val::None));
    }
    let (mut seg, blocks, items) =
        lower.segment_fields(heap, entries(heap, v).map_err(here)?, host)?;
    lower.take_segment_blocks(heap, &mut seg, &items)?;
    Ok((seg, blocks))
}

fn traces(lower: &mut Lowerer, heap: &Heap, v: Val) -> Result<Vec<DeviceTrace>, Failure> {
    let devices = items(heap, v).map_err(here)?;
    // One list of events given for two devices (a memo get) is named at its
    // first repeat; read last device first, it would be found at its last.
    let mut seen = rustc_hash::FxHashSet::default();
    for (d, &dev) in devices.iter().enumerate() {
        let Val::Obj(id) = dev else { continue };
        let has_events = match heap.containers[id as usize] {
            Container::Events { len, .. } => len > 0,
            _ => items(heap, dev).is_ok_and(|list| !list.is_empty()),
        };
        if has_events && !seen.insert(id) {
            let repeat = ": the same list of trace events is given for two devices";
            return Err(index(d, repeat.to_owned()));
        }
    }
    let mut out: Vec<DeviceTrace> = Vec::with_capacity(devices.len());
    // Last device first, so that each one's events are the tail of the store.
    for (d, &dev) in devices.iter().enumerate().rev() {
        let events = device_events(lower, heap, dev).map_err(|f| index(d, f))?;
        out.push(DeviceTrace {
            device: d as u32,
            events,
        });
    }
    out.reverse();
    Ok(out)
}

/// The pinned host allocator's events: one list of trace entries, or (read
/// the same) one list per device of which the first with events is taken.
fn host_events(lower: &mut Lowerer, heap: &Heap, v: Val) -> Result<Events, Failure> {
    let is_run = |l: Val| matches!(l, Val::Obj(id) if matches!(heap.containers[id as usize], Container::Events { .. }));
    if is_run(v) {
        return device_events(lower, heap, v);
    }
    let lists = items(heap, v).map_err(here)?;
    match lists.iter().find(|&&l| is_run(l)) {
        Some(&first) => device_events(lower, heap, first),
        None => device_events(lower, heap, v),
    }
}

/// One device's events. As the machine leaves them (a run of lowered events,
/// or a list of handles to them in order) they are the tail of the
/// lowerer's store and move out whole; otherwise they are taken one by one.
fn device_events(lower: &mut Lowerer, heap: &Heap, dev: Val) -> Result<Events, Failure> {
    let run = match dev {
        Val::Obj(id) => match heap.containers[id as usize] {
            Container::Events { start, len } => Some((start, len)),
            _ => None,
        },
        _ => None,
    };
    let handles: Cow<[Val]> = match run {
        Some((start, len)) => match lower.take_event_run(start, len) {
            Some(events) => return Ok(events),
            None => (start..start + len).map(Val::Event).collect(),
        },
        None => {
            let list = items(heap, dev).map_err(here)?;
            match lower.take_event_tail(heap, &list) {
                Some(events) => return Ok(events),
                None => list,
            }
        }
    };
    let mut events = Events::new();
    for (i, &e) in handles.iter().enumerate() {
        events.push(lower.take_event(heap, e).map_err(|f| index(i, f))?);
    }
    Ok(events)
}

fn annotations(lower: &mut Lowerer, heap: &Heap, v: Val) -> Result<Vec<Annotation>, Failure> {
    let list = items(heap, v).map_err(here)?;
    let mut out = Vec::with_capacity(list.len());
    for (i, &a) in list.iter().enumerate() {
        let mut ann = Annotation::default();
        for &[k, v] in entries(heap, a).map_err(|f| index(i, f))? {
            let key = key_text(heap, k);
            let field = key.as_str();
            let wrap = |f: Failure| index(i, at(field, f));
            match field {
                "device" => ann.device = u32_of(heap, v).map_err(wrap)?,
                "time_us" => ann.time_us = Some(i64_of(heap, v).map_err(wrap)?),
                // Charged as generic values' text is: one long string
                // shared by many annotations is copied into each.
                "name" if matches!(v, Val::Str(_)) => {
                    let name = str_of(heap, v).map_err(wrap)?;
                    ann.name = Some(lower.charged_text(name).map_err(wrap)?)
                }
                "stage" if matches!(v, Val::Str(_)) => {
                    let stage = str_of(heap, v).map_err(wrap)?;
                    ann.stage = Some(lower.charged_text(stage).map_err(wrap)?)
                }
                _ => {
                    let value = lower.value(heap, v, 1).map_err(wrap)?;
                    ann.extra.push((key, value));
                }
            }
        }
        out.push(ann);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    //! Pickles in the style of PyTorch's C++ `torch::jit::Pickler` (protocol
    //! 2, `BINUNICODE` strings, `BINPUT` memo, `MARK ... TUPLE` tuples, 8-byte
    //! `LONG1` ints), which CPython's pickler does not write.

    use super::*;
    use crate::model::{Frame, Pool};
    use crate::value::Value;

    /// A tiny emitter of the opcodes the C++ pickler uses; with `memoize`,
    /// it stores values in the memo with MEMOIZE, as protocol 4 does.
    #[derive(Default)]
    struct Cpp {
        out: Vec<u8>,
        memo: u32,
        memoize: bool,
    }

    impl Cpp {
        fn op(&mut self, b: &[u8]) -> &mut Self {
            self.out.extend_from_slice(b);
            self
        }
        fn put(&mut self) -> u32 {
            let id = self.memo;
            self.memo += 1;
            if self.memoize {
                self.op(&[0x94]);
            } else if id < 256 {
                self.op(&[b'q', id as u8]);
            } else {
                self.op(b"r");
                self.op(&id.to_le_bytes());
            }
            id
        }
        fn get(&mut self, id: u32) -> &mut Self {
            if id < 256 {
                self.op(&[b'h', id as u8])
            } else {
                self.op(b"j").op(&id.to_le_bytes())
            }
        }
        fn str(&mut self, s: &str) -> u32 {
            self.op(b"X");
            self.op(&(s.len() as u32).to_le_bytes());
            self.op(s.as_bytes());
            self.put()
        }
        fn int(&mut self, v: i64) -> &mut Self {
            if (0..256).contains(&v) {
                self.op(&[b'K', v as u8])
            } else if i32::try_from(v).is_ok() {
                self.op(b"J").op(&(v as i32).to_le_bytes())
            } else {
                self.op(&[0x8a, 8]).op(&v.to_le_bytes())
            }
        }
    }

    impl Cpp {
        /// The start of a snapshot: protocol 2, the top dict, its MARK, and
        /// the key `segments` with an empty list that items may follow.
        fn snapshot_start(&mut self) {
            let protocol = if self.memoize { 4 } else { 2 };
            self.op(&[0x80, protocol]).op(b"}");
            self.put();
            self.op(b"(");
            self.str("segments");
            self.op(b"]");
            self.put();
        }

        /// A new frame dict `{name, filename, line}`; returns its memo id.
        fn frame(&mut self, name: &str, line: i64) -> u32 {
            self.op(b"}");
            let id = self.put();
            self.op(b"(");
            self.str("name");
            self.str(name);
            self.str("filename");
            self.str("train.py");
            self.str("line");
            self.int(line);
            self.op(b"u");
            id
        }

        /// A trace event dict whose frame list is written by `frames`.
        fn event(&mut self, frames: impl FnOnce(&mut Cpp)) {
            self.op(b"}");
            self.put();
            self.op(b"(");
            self.str("action");
            self.str("alloc");
            self.str("addr");
            self.int(4096);
            self.str("size");
            self.int(512);
            self.str("stream");
            self.int(0);
            self.str("frames");
            self.op(b"]");
            self.put();
            self.op(b"(");
            frames(self);
            self.op(b"e");
            self.op(b"u");
        }

        /// The key `device_traces`, a list of devices, and the opening of the
        /// first device's event list; events may follow.
        fn traces_start(&mut self) {
            self.str("device_traces");
            self.op(b"]");
            self.put();
            self.op(b"(]");
            self.put();
            self.op(b"(");
        }

        /// Two events with the stack [`STACK_A_B`]: the first writes the
        /// frames, the second gets them from the memo. Returns their memo ids.
        fn two_events_with_frames_a_b(&mut self) -> (u32, u32) {
            let (mut a, mut b) = (0, 0);
            self.event(|p| {
                a = p.frame("a", 1);
                b = p.frame("b", 2);
            });
            self.event(|p| {
                p.get(a).get(b);
            });
            (a, b)
        }

        /// Closes the event list and the device list of `traces_start`.
        fn traces_end(&mut self) {
            self.op(b"e"); // the events
            self.op(b"e"); // the device list
        }
    }

    /// The stack of both events of [`Cpp::two_events_with_frames_a_b`].
    const STACK_A_B: [(&str, u32); 2] = [("a", 1), ("b", 2)];

    /// Each event's stack of the first device, as (name, line) pairs.
    fn event_stacks(snap: &Snapshot) -> Vec<Vec<(&str, u32)>> {
        snap.traces[0]
            .events
            .iter()
            .map(|ev| {
                snap.stack_frames(ev.stack)
                    .map(|f| (f.name.as_str(), f.line))
                    .collect()
            })
            .collect()
    }

    /// Frame lists made of memo gets take a fast path in the machine; these
    /// lists mix gets with new frame dicts and with other values, which must
    /// read exactly as if every get had been run one by one.
    #[test]
    fn frame_lists_read_the_same_whichever_way_they_are_written() {
        let mut p = Cpp::default();
        p.snapshot_start();
        p.traces_start();
        let (a, b) = p.two_events_with_frames_a_b();
        p.event(|p| {
            p.get(b);
            p.frame("c", 3);
            p.get(a);
        });
        p.traces_end();
        p.str("mixed");
        p.op(b"]");
        p.put();
        p.op(b"(");
        p.get(a);
        let text = p.str("text");
        p.get(text);
        p.op(b"e");
        p.op(b"u.");

        let snap = read(&p.out, None, Parts::All, Threads::Two, None).unwrap();
        assert_eq!(
            event_stacks(&snap),
            [
                STACK_A_B.to_vec(),
                STACK_A_B.to_vec(),
                vec![("b", 2), ("c", 3), ("a", 1)],
            ]
        );
        assert_eq!(
            snap.traces[0].events.get(0).unwrap().stack,
            snap.traces[0].events.get(1).unwrap().stack,
            "the same frames are one stack"
        );
        let (key, mixed) = &snap.extra[0];
        assert_eq!(key, "mixed");
        let Value::List(items) = mixed else {
            panic!("{mixed:?}")
        };
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].get("name"), Some(&Value::Str("a".into())));
        assert_eq!(items[1], Value::Str("text".into()));
        assert_eq!(items[2], Value::Str("text".into()));
    }

    /// Protocol 4 frame dicts whose keys and strings are all memo gets, and
    /// frame lists of them, take fast paths in the machine; whatever they do
    /// not take (new strings, extra or repeated keys, other values) must
    /// read as it does in Python, including a list left partway.
    #[test]
    fn frame_dicts_read_the_same_whichever_way_they_are_written() {
        let mut p = Cpp {
            memoize: true,
            ..Cpp::default()
        };
        p.snapshot_start();
        p.traces_start();
        let (mut name, mut a, mut file, mut train, mut line) = (0, 0, 0, 0, 0);
        p.event(|p| {
            p.op(b"}");
            p.put();
            p.op(b"(");
            name = p.str("name");
            a = p.str("a");
            file = p.str("filename");
            train = p.str("train.py");
            line = p.str("line");
            p.int(1);
            p.op(b"u");
        });
        // What each frame dict holds: its keys and values, in order.
        let frames: [&dyn Fn(&mut Cpp); 7] = [
            // As the first, from the memo: the fast path.
            &|p| {
                p.get(name).get(a).get(file).get(train).get(line).int(1);
            },
            // Keys in another order, a two-byte line.
            &|p| {
                p.get(line).int(300).get(name).get(a).get(file).get(train);
            },
            // A four-byte negative line, clamped to 0.
            &|p| {
                p.get(file).get(train).get(name).get(a).get(line).int(-5);
            },
            // `name` twice: the last one counts.
            &|p| {
                p.get(name).get(train).get(name).get(a).get(file).get(train);
                p.get(line).int(2);
            },
            // An extra key.
            &|p| {
                p.get(name).get(a).get(file).get(train).get(line).int(1);
                p.str("column");
                p.int(4);
            },
            // A new string for the name.
            &|p| {
                p.get(name);
                p.str("b");
                p.get(file).get(train).get(line).int(1);
            },
            // A line written as an 8-byte LONG1.
            &|p| {
                p.get(name).get(a).get(file).get(train).get(line);
                p.op(&[0x8a, 8]).op(&3i64.to_le_bytes());
            },
        ];
        let mut first = 0;
        p.event(|p| {
            for (i, write) in frames.iter().enumerate() {
                p.op(b"}");
                let id = p.put();
                if i == 0 {
                    first = id;
                }
                p.op(b"(");
                write(p);
                p.op(b"u");
            }
        });
        // A list the fast path reads whole: a frame dict, then a get.
        p.event(|p| {
            p.op(b"}");
            p.put();
            p.op(b"(");
            p.get(name).get(a).get(file).get(train).get(line).int(5);
            p.op(b"u");
            p.get(first);
        });
        p.traces_end();
        p.op(b"u.");

        let snap = read(&p.out, None, Parts::All, Threads::Two, None).unwrap();
        assert_eq!(
            event_stacks(&snap),
            [
                vec![("a", 1)],
                vec![
                    ("a", 1),
                    ("a", 300),
                    ("a", 0),
                    ("a", 2),
                    ("a", 1),
                    ("b", 1),
                    ("a", 3)
                ],
                vec![("a", 5), ("a", 1)],
            ]
        );
        let frames: Vec<&Frame> = snap
            .stack_frames(snap.traces[0].events.get(1).unwrap().stack)
            .collect();
        assert!(frames.iter().all(|f| f.file == "train.py"), "{frames:?}");
        assert!(frames[0].extra.is_empty());
        assert_eq!(frames[4].extra, [("column".to_owned(), "4".to_owned())]);
        assert_eq!(
            snap.traces[0]
                .events
                .get(0)
                .unwrap()
                .stack
                .map(|s| snap.stacks[s as usize][0]),
            snap.traces[0]
                .events
                .get(1)
                .unwrap()
                .stack
                .map(|s| snap.stacks[s as usize][0]),
            "a frame read both ways is one frame"
        );
    }

    /// The machine knows a frame list read before by its memo-get bytes; a
    /// PUT that rewrites one of those slots must change what they read.
    #[test]
    fn a_rewritten_memo_slot_changes_a_frame_list_read_before() {
        let mut p = Cpp::default();
        p.snapshot_start();
        p.traces_start();
        let (a, b) = p.two_events_with_frames_a_b();
        // Frame `c` goes into slot `a`, then off the stack.
        p.frame("c", 3);
        p.op(&[b'q', a as u8]).op(b"0");
        p.event(|p| {
            p.get(a).get(b);
        });
        p.traces_end();
        p.op(b"u.");

        let snap = read(&p.out, None, Parts::All, Threads::Two, None).unwrap();
        assert_eq!(
            event_stacks(&snap),
            [
                STACK_A_B.to_vec(),
                STACK_A_B.to_vec(),
                vec![("c", 3), ("b", 2)],
            ]
        );
    }

    /// APPENDS needs its list above the innermost MARK; the frame-list fast
    /// path must refuse the same pickles as running the opcodes one by one.
    #[test]
    fn a_frame_list_below_an_enclosing_mark_is_refused() {
        let mut p = Cpp::default();
        p.op(&[0x80, 2]).op(b"]");
        p.put();
        p.op(b"(");
        let a = p.frame("a", 1);
        p.op(b"e");
        p.op(b"]");
        p.put();
        p.op(b"((");
        p.get(a);
        p.op(b"e");
        let err = read(&p.out, None, Parts::All, Threads::Two, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("APPENDS") && err.contains("too few values"),
            "{err}"
        );
    }

    #[test]
    fn reads_cpp_pickler_output() {
        let mut p = Cpp::default();
        p.snapshot_start();
        p.op(b"(}");
        p.put();
        p.op(b"(");
        let address = p.str("address");
        p.int(0x7f00_0000_0000);
        p.str("total_size");
        p.int(2 << 20);
        p.str("stream");
        p.int(0);
        p.str("segment_type");
        p.str("small");
        p.str("segment_pool_id");
        p.op(b"(").int(0).int(0).op(b"t");
        p.str("blocks");
        p.op(b"]");
        p.put();
        p.op(b"(}");
        p.put();
        p.op(b"(");
        p.get(address).int(0x7f00_0000_0000);
        p.str("size");
        p.int(2 << 20);
        p.str("requested_size");
        p.int(1000);
        p.str("state");
        p.str("active_allocated");
        p.str("frames");
        p.op(b"]");
        p.put();
        p.op(b"(}");
        let frame = p.put();
        p.op(b"(");
        p.str("name");
        p.str("train_step");
        p.str("filename");
        p.str("train.py");
        p.str("line");
        p.int(12);
        p.op(b"u"); // SETITEMS of the frame
        p.get(frame); // the same frame twice
        p.op(b"e"); // APPENDS to frames
        p.op(b"u"); // SETITEMS of the block
        p.op(b"e"); // APPENDS to blocks
        p.op(b"u"); // SETITEMS of the segment
        p.op(b"e"); // APPENDS to segments
        p.op(b"u."); // SETITEMS of the top dict, STOP

        let snap = read(&p.out, None, Parts::All, Threads::Two, None).unwrap();
        assert_eq!(
            snap.meta.source.as_deref(),
            Some("PyTorch pickle (protocol 2)")
        );
        let seg = &snap.segments[0];
        assert_eq!(
            (seg.address, seg.total_size, seg.pool, seg.pool_id),
            (0x7f00_0000_0000, 2 << 20, Pool::Small, (0, 0))
        );
        let block = &seg.blocks[0];
        assert_eq!((block.size, block.requested_size), (2 << 20, 1000));
        let frames: Vec<_> = snap
            .stack_frames(block.stack)
            .map(|f| (f.name.as_str(), f.file.as_str(), f.line))
            .collect();
        assert_eq!(
            frames,
            [
                ("train_step", "train.py", 12),
                ("train_step", "train.py", 12)
            ]
        );
        assert_eq!(snap.frames.len(), 1, "a shared frame is one frame");
    }
}
