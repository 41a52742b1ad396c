//! The native `.snap` file and its `.json` twin.
//!
//! A `.snap` file is a 36-byte header followed by two zstd frames, the
//! snapshot without its trace events (the *head*) and then the events:
//!
//! ```text
//! offset  size  field
//! 0       8     magic: the ASCII bytes "SNAPDIFF"
//! 8       4     format version, u32 little-endian (currently 3)
//! 12      8     length of the uncompressed head, u64 little-endian
//! 20      8     length of the head's zstd frame, u64 little-endian
//! 28      8     length of the uncompressed events, u64 little-endian
//! 36      ...   zstd frame of the head: the MessagePack encoding of a
//!               `Snapshot`, structs as arrays in field order, each trace
//!               as [device, number of events]
//! ...     ...   zstd frame of the events: each trace's columns, in order
//! ```
//!
//! The events come last and apart so that a reader that needs no events
//! (`fleet`, `summary`) never decompresses them, and so that a reader that
//! does knows how many there are before it reads any. Versions 1 and 2 (a
//! 20-byte header, then one frame holding the whole snapshot) still read.
//! The full layout, field by field, and the versioning rule are in
//! `docs/format.md`. Any change to the model's fields bumps the version;
//! readers refuse versions newer than they know.

use std::io::{BufRead, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Parts;
use crate::error::{Error, ErrorKind, Result};
use crate::events::Events;
use crate::model::{Annotation, DeviceTrace, Frame, FrameId, Meta, Segment, Snapshot};
use crate::progress::{PROGRESS_EVERY, Progress};
use crate::value::{Extra, Value};

/// The first bytes of every `.snap` file.
pub const MAGIC: &[u8; 8] = b"SNAPDIFF";
/// The format version this build writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 3;
/// Header length in bytes since version 3.
const HEADER_LEN: usize = 36;
/// Header length in bytes of versions 1 and 2.
const HEADER_LEN_V2: usize = 20;

/// zstd level: 3 is zstd's default, fast to write and about as small as the
/// slower levels on this data (see docs/performance.md).
const ZSTD_LEVEL: i32 = 3;
/// A body claiming to expand more than this many times, and to more than
/// [`ALWAYS_ALLOWED`] bytes, is refused as corrupt. Bodies of real
/// snapshots compress 8 to 16 times, but a long, regular trace (one loop's
/// events, a few stacks) compresses hundreds to thousands of times: a
/// 10-million-event synthetic trace 592 times, a million identical
/// alloc/free events 10 000 times. zstd itself tops out near 32 000.
const MAX_EXPANSION: u64 = 4096;
/// Bodies up to this size are read whatever their compression ratio.
const ALWAYS_ALLOWED: u64 = 64 << 20;
/// A file may hold at most this many trace events for each byte of its
/// zstd frame, or [`EVENTS_ALWAYS_ALLOWED`]: an event's columns take a byte
/// or more each, so a body of empty varints compresses to almost nothing
/// and would declare tens of millions of events (40 bytes each in memory)
/// in a file of kilobytes. Real traces hold under one event a byte; a
/// regular synthetic trace of 10 million events, 34.
const EVENTS_PER_BYTE: u64 = 64;
/// Trace events any `.snap` file may hold, whatever its size.
const EVENTS_ALWAYS_ALLOWED: u64 = 1 << 20;

/// A [`Snapshot`] without its events, as the head frame holds it: the
/// snapshot's fields in order, each trace as its device and event count.
#[derive(Serialize)]
struct HeadOut<'a> {
    meta: &'a Meta,
    #[serde(serialize_with = "frame_columns")]
    frames: &'a [Frame],
    #[serde(serialize_with = "stack_columns")]
    stacks: &'a [Vec<FrameId>],
    strings: &'a [String],
    #[serde(serialize_with = "segment_table")]
    segments: &'a [Segment],
    traces: Vec<TraceHead>,
    annotations: &'a [Annotation],
    allocator_settings: &'a Value,
    extra: &'a Extra,
}

fn frame_columns<S: serde::Serializer>(frames: &&[Frame], s: S) -> Result<S::Ok, S::Error> {
    crate::columns::frames::serialize(frames, s)
}

fn stack_columns<S: serde::Serializer>(stacks: &&[Vec<FrameId>], s: S) -> Result<S::Ok, S::Error> {
    crate::columns::stacks::serialize(stacks, s)
}

fn segment_table<S: serde::Serializer>(segments: &&[Segment], s: S) -> Result<S::Ok, S::Error> {
    crate::columns::segments::serialize(segments, s)
}

/// A trace in the head: its device and how many events the events frame
/// holds for it.
#[derive(Clone, Copy, Serialize, Deserialize)]
pub(crate) struct TraceHead {
    pub(crate) device: u32,
    pub(crate) events: u64,
}

/// Encodes `snap` as a `.snap` file into `out`.
pub fn write_snap<W: Write>(snap: &Snapshot, mut out: W) -> Result<()> {
    let encode = |e: rmp_serde::encode::Error| {
        Error::new(ErrorKind::Malformed, format!("cannot encode snapshot: {e}"))
    };
    let head = rmp_serde::to_vec(&HeadOut {
        meta: &snap.meta,
        frames: &snap.frames,
        stacks: &snap.stacks,
        strings: &snap.strings,
        segments: &snap.segments,
        traces: snap
            .traces
            .iter()
            .map(|t| TraceHead {
                device: t.device,
                events: t.events.len() as u64,
            })
            .collect(),
        annotations: &snap.annotations,
        allocator_settings: &snap.allocator_settings,
        extra: &snap.extra,
    })
    .map_err(encode)?;
    let events = rmp_serde::to_vec(&snap.traces).map_err(encode)?;
    let compress = |body: &[u8]| {
        zstd::bulk::compress(body, ZSTD_LEVEL).map_err(|e| Error::io("cannot compress snapshot", e))
    };
    let (head_frame, events_frame) = (compress(&head)?, compress(&events)?);
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..20].copy_from_slice(&(head.len() as u64).to_le_bytes());
    header[20..28].copy_from_slice(&(head_frame.len() as u64).to_le_bytes());
    header[28..36].copy_from_slice(&(events.len() as u64).to_le_bytes());
    out.write_all(&header)
        .and_then(|()| out.write_all(&head_frame))
        .and_then(|()| out.write_all(&events_frame))
        .map_err(|e| Error::io("cannot write", e))
}

/// Decodes the `parts` of a `.snap` file held in `data`.
/// `progress`, if given, is told how far into `data` the decompressor has
/// read, every [`PROGRESS_EVERY`] bytes.
pub(crate) fn read_snap_parts(
    data: &[u8],
    parts: Parts,
    progress: Option<Progress>,
) -> Result<Snapshot> {
    if data.len() < HEADER_LEN_V2 {
        return Err(truncated_header(data.len(), HEADER_LEN_V2));
    }
    if &data[..8] != MAGIC {
        return Err(Error::new(
            ErrorKind::Malformed,
            "not a .snap file (bad magic bytes)",
        ));
    }
    let version = u32::from_le_bytes(data[8..12].try_into().unwrap());
    check_version(version, ".snap")?;
    let snap = if version >= 3 {
        read_split(data, parts, progress)?
    } else {
        read_whole(data, parts, progress)?
    };
    snap.check_references()
        .map_err(|m| Error::new(ErrorKind::Malformed, format!("corrupt .snap body: {m}")))?;
    Ok(snap)
}

fn truncated_header(len: usize, header_len: usize) -> Error {
    Error::new(
        ErrorKind::Truncated,
        format!("truncated .snap header ({len} of {header_len} bytes)"),
    )
}

/// Reads a `.snap` file of version 3: the head frame, then the events
/// frame only when `parts` asks for events.
fn read_split(data: &[u8], parts: Parts, progress: Option<Progress>) -> Result<Snapshot> {
    if data.len() < HEADER_LEN {
        return Err(truncated_header(data.len(), HEADER_LEN));
    }
    let field = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    let (head_len, head_frame_len, events_len) = (field(12), field(20), field(28));
    let head_end = usize::try_from(head_frame_len)
        .ok()
        .and_then(|len| HEADER_LEN.checked_add(len))
        .filter(|&end| end <= data.len())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Truncated,
                format!(
                    "truncated .snap file: its head frame of {head_frame_len} bytes runs past its end ({} bytes)",
                    data.len()
                ),
            )
        })?;
    let mut input = ZstdInput {
        data,
        pos: HEADER_LEN,
        end: head_end,
        progress,
        next_progress: PROGRESS_EVERY,
    };
    let head_frame_len = head_end - HEADER_LEN;
    let head: WithoutEvents<TraceHead> = read_frame(&mut input, head_len, "head", |body| {
        crate::head_limit::with_head_limit(head_len, head_frame_len, || rmp_serde::from_read(body))
    })?;
    input.end = data.len();
    let events_frame = &data[head_end..];
    let declared = head
        .traces
        .iter()
        .fold(0u64, |sum, t| sum.saturating_add(t.events));
    let most = most_events(events_frame.len());
    if declared > most {
        return Err(Error::new(
            ErrorKind::Malformed,
            format!(
                "corrupt .snap head: its traces declare more than {most} events, the most a {}-byte zstd frame can hold",
                events_frame.len()
            ),
        ));
    }
    if parts == Parts::WithoutEvents {
        // Not decompressed, but a file whose events are cut or followed by
        // more is refused here too.
        check_frame(events_frame, events_len, "events")?;
        return Ok(head.into_snapshot(|t| t.device));
    }
    let traces = read_frame(&mut input, events_len, "events", |body| {
        // Its other tables (names of unknown actions, events' extra keys)
        // are limited as the head's are.
        crate::head_limit::with_head_limit(events_len, events_frame.len(), || {
            crate::columns::with_event_limit(declared, events_frame.len(), || {
                crate::columns::read_traces(body, &head.traces)
            })
        })
    })?;
    let mut snap = head.into_snapshot(|t| t.device);
    snap.traces = traces;
    Ok(snap)
}

/// Reads a `.snap` file of version 1 or 2: one frame holding the snapshot.
fn read_whole(data: &[u8], parts: Parts, progress: Option<Progress>) -> Result<Snapshot> {
    let body_len = u64::from_le_bytes(data[12..20].try_into().unwrap());
    let mut input = ZstdInput {
        data,
        pos: HEADER_LEN_V2,
        end: data.len(),
        progress,
        next_progress: PROGRESS_EVERY,
    };
    let frame_len = data.len() - HEADER_LEN_V2;
    match parts {
        Parts::All => read_frame(&mut input, body_len, "body", |body| {
            crate::head_limit::with_head_limit(body_len, frame_len, || {
                crate::columns::with_event_limit(most_events(frame_len), frame_len, || {
                    rmp_serde::from_read(body)
                })
            })
        }),
        Parts::WithoutEvents => Ok(read_frame(&mut input, body_len, "body", |body| {
            crate::head_limit::with_head_limit(body_len, frame_len, || {
                crate::columns::with_event_limit(most_events(frame_len), frame_len, || {
                    rmp_serde::from_read::<_, WithoutEvents<TraceDevice>>(body)
                })
            })
        })?
        .into_snapshot(|t| t.0)),
    }
}

/// The most trace events a zstd frame of `frame_len` bytes may declare.
fn most_events(frame_len: usize) -> u64 {
    (frame_len as u64)
        .saturating_mul(EVENTS_PER_BYTE)
        .max(EVENTS_ALWAYS_ALLOWED)
}

/// A [`Snapshot`] as a `.snap` file's head (or, before version 3, its
/// body) holds it, with each trace read as a `T` that gives its device:
/// the same fields in the same order (a MessagePack array of them), so the
/// columns of millions of events are stepped over instead of decoded. A
/// test checks it reads what `Snapshot` writes.
#[derive(Deserialize)]
struct WithoutEvents<T> {
    meta: Meta,
    #[serde(with = "crate::columns::frames")]
    frames: Vec<Frame>,
    #[serde(with = "crate::columns::stacks")]
    stacks: Vec<Vec<FrameId>>,
    strings: Vec<String>,
    #[serde(deserialize_with = "crate::columns::segments::deserialize")]
    segments: Vec<Segment>,
    traces: Vec<T>,
    annotations: Vec<Annotation>,
    allocator_settings: Value,
    extra: Extra,
}

impl<T> WithoutEvents<T> {
    /// The snapshot, each trace without events, on the device `device` finds.
    fn into_snapshot(self, device: impl Fn(&T) -> u32) -> Snapshot {
        Snapshot {
            meta: self.meta,
            frames: self.frames,
            stacks: self.stacks,
            strings: self.strings,
            segments: self.segments,
            traces: self
                .traces
                .iter()
                .map(|t| DeviceTrace {
                    device: device(t),
                    events: Events::new(),
                })
                .collect(),
            annotations: self.annotations,
            allocator_settings: self.allocator_settings,
            extra: self.extra,
        }
    }
}

/// The device of a version-2 trace's columns (their first field); the
/// columns stepped over, each no longer than its events allow.
struct TraceDevice(u32);

impl<'de> Deserialize<'de> for TraceDevice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Columns;
        impl<'de> serde::de::Visitor<'de> for Columns {
            type Value = TraceDevice;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a trace's columns")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<TraceDevice, A::Error> {
                use serde::de::Error as _;
                let device = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::custom("a trace without its device"))?;
                crate::columns::skip_columns(&mut seq)?;
                Ok(TraceDevice(device))
            }
        }
        d.deserialize_seq(Columns)
    }
}

/// Checks that `compressed` is one whole zstd frame, as [`write_snap`]
/// writes it, that may expand to the `body_len` bytes the header declares
/// for it, and returns it. No skippable frames or further frames before or
/// after, whose sizes no header bounds; a frame may declare at most
/// [`MAX_EXPANSION`] times its size or [`ALWAYS_ALLOWED`] bytes.
fn check_frame<'a>(compressed: &'a [u8], body_len: u64, what: &str) -> Result<&'a [u8]> {
    let corrupt =
        |why: String| Error::new(ErrorKind::Malformed, format!("corrupt .snap {what}: {why}"));
    if body_len > (compressed.len() as u64).saturating_mul(MAX_EXPANSION)
        && body_len > ALWAYS_ALLOWED
    {
        return Err(Error::new(
            ErrorKind::Malformed,
            format!(
                "corrupt .snap header: a {}-byte {what} cannot expand to the {body_len} bytes it claims",
                compressed.len()
            ),
        ));
    }
    const ZSTD_MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();
    if compressed.get(..4) != Some(&ZSTD_MAGIC[..]) {
        return Err(corrupt("it does not start with a zstd frame".to_owned()));
    }
    let frame_len = zstd::zstd_safe::find_frame_compressed_size(compressed).map_err(|_| {
        Error::new(
            ErrorKind::Truncated,
            format!("truncated or corrupt .snap {what}: its zstd frame is incomplete"),
        )
    })?;
    if frame_len != compressed.len() {
        return Err(corrupt(format!(
            "{} bytes follow its zstd frame",
            compressed.len() - frame_len
        )));
    }
    if let Ok(Some(declared)) = zstd::zstd_safe::get_frame_content_size(compressed)
        && declared != body_len
    {
        return Err(corrupt(format!(
            "its zstd frame holds {declared} bytes, the header says {body_len}"
        )));
    }
    Ok(compressed)
}

/// Decodes with `decode` the zstd frame of `input` (its bytes up to
/// `input.end`), which must expand to `body_len` bytes (see
/// [`check_frame`]), as it is decompressed: the body is never held whole,
/// and a trace's columns are turned into events one at a time as they
/// arrive (`columns.rs`). Decompression stops at `body_len` bytes, so no
/// stream can expand past what the header declared.
fn read_frame<T>(
    input: &mut ZstdInput,
    body_len: u64,
    what: &str,
    decode: impl FnOnce(&mut Body<&mut dyn Read>) -> std::result::Result<T, rmp_serde::decode::Error>,
) -> Result<T> {
    let frame_end = input.end;
    let frame = check_frame(&input.data[input.pos..frame_end], body_len, what)?;
    let corrupt =
        |why: String| Error::new(ErrorKind::Malformed, format!("corrupt .snap {what}: {why}"));
    if body_len <= WHOLE_UP_TO {
        let mut whole = Vec::with_capacity(body_len as usize);
        DECOMPRESSOR
            .with_borrow_mut(|reused| {
                let decompressor = match reused {
                    Some(d) => d,
                    None => reused.insert(zstd::bulk::Decompressor::new()?),
                };
                decompressor.decompress_to_buffer(frame, &mut whole)
            })
            .map_err(|e| {
                corrupt(format!(
                    "its zstd frame does not expand to the header's {body_len} bytes ({e})"
                ))
            })?;
        if (whole.len() as u64) < body_len {
            return Err(Error::new(
                ErrorKind::Truncated,
                format!(
                    "truncated .snap {what}: {} of {body_len} bytes",
                    whole.len()
                ),
            ));
        }
        input.pos = frame_end;
        let mut nothing = std::io::empty();
        let mut body = Body::whole(whole, &mut nothing as &mut dyn Read);
        return decode(&mut body).map_err(|e| corrupt(decode_error(e)));
    }
    let decoder = zstd::stream::read::Decoder::with_buffer(&mut *input)
        .map_err(|e| corrupt(e.to_string()))?
        .single_frame();
    let mut limited = decoder.take(body_len);
    let mut body = Body::new(&mut limited as &mut dyn Read);
    let decoded = decode(&mut body);
    // Whether the frame ran out before the header's length: the body is
    // cut. The rest of the frame (nothing, in a file snapdiff wrote) is
    // read to find out.
    let cut = match std::io::copy(&mut body, &mut std::io::sink()) {
        Ok(_) => body.count < body_len,
        Err(e) => return Err(corrupt(e.to_string())),
    };
    if cut {
        return Err(Error::new(
            ErrorKind::Truncated,
            format!("truncated .snap {what}: {} of {body_len} bytes", body.count),
        ));
    }
    let decoded = decoded.map_err(|e| corrupt(decode_error(e)))?;
    // The decompressor stops at the body's last byte, which may come before
    // the frame's last block header or checksum: the next frame starts at
    // the end of this one.
    drop(body);
    drop(limited);
    input.pos = frame_end;
    Ok(decoded)
}

/// What went wrong decoding a body: a limit of the file's size, which the
/// body's reader raises as an I/O error, in its own words.
fn decode_error(e: rmp_serde::decode::Error) -> String {
    use rmp_serde::decode::Error::{InvalidDataRead, InvalidMarkerRead};
    match e {
        InvalidMarkerRead(io) | InvalidDataRead(io) if io.kind() == std::io::ErrorKind::Other => {
            io.to_string()
        }
        e => e.to_string(),
    }
}

/// Bodies up to this size are decompressed at once, by a decompressor
/// each thread keeps, instead of streamed: `fleet` reads thousands of small
/// heads, where making a streaming decoder for each took a tenth of its time.
const WHOLE_UP_TO: u64 = 1 << 20;

thread_local! {
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// A zstd frame of a `.snap` file, as the decompressor reads it: the file
/// from `pos` to `end`, telling `progress` how far it has got.
struct ZstdInput<'a> {
    /// The whole file.
    data: &'a [u8],
    /// Where the next unread byte is.
    pos: usize,
    /// Where the frame being read ends.
    end: usize,
    progress: Option<Progress>,
    /// The position at which `progress` is told next.
    next_progress: usize,
}

impl BufRead for ZstdInput<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        Ok(&self.data[self.pos..self.end])
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        if self.pos >= self.next_progress {
            self.next_progress = self.pos + PROGRESS_EVERY;
            if let Some(progress) = &mut self.progress {
                progress.done(self.pos);
            }
        }
    }
}

impl Read for ZstdInput<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.fill_buf()?.read(out)?;
        self.consume(n);
        Ok(n)
    }
}

/// A decompressing stream read through a buffer, counting the bytes it
/// produced. Written instead of wrapping it in `BufReader` because the
/// MessagePack reader reads a few bytes at a time, millions of times, and
/// `BufReader::read_exact` was not inlined into it: reading a `.snap` of a
/// million blocks took a tenth longer than decoding a body held whole.
struct Body<R> {
    inner: R,
    buf: Box<[u8]>,
    /// The bytes of `buf` not yet read: `pos..end`.
    pos: usize,
    end: usize,
    /// Bytes the stream has produced.
    count: u64,
}

impl<R: Read> Body<R> {
    fn new(inner: R) -> Self {
        Body {
            inner,
            buf: vec![0; 1 << 16].into_boxed_slice(),
            pos: 0,
            end: 0,
            count: 0,
        }
    }

    /// A body already decompressed whole, `bytes`; `inner` is never read.
    fn whole(bytes: Vec<u8>, inner: R) -> Self {
        let end = bytes.len();
        Body {
            inner,
            buf: bytes.into_boxed_slice(),
            pos: 0,
            end,
            count: end as u64,
        }
    }

    /// Reads the stream's next bytes into the emptied buffer.
    #[cold]
    fn refill(&mut self) -> std::io::Result<()> {
        let n = self.inner.read(&mut self.buf)?;
        self.count += n as u64;
        (self.pos, self.end) = (0, n);
        Ok(())
    }
}

impl<R: Read> Read for Body<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.end {
            // A large read (a trace column) goes straight from the
            // decompressor into `out`, not through the buffer.
            if out.len() >= self.buf.len() {
                let n = self.inner.read(out)?;
                self.count += n as u64;
                crate::columns::spend_column_bytes(n)?;
                crate::head_limit::spend_head_bytes(n)?;
                return Ok(n);
            }
            self.refill()?;
        }
        let n = out.len().min(self.end - self.pos);
        crate::columns::spend_column_bytes(n)?;
        crate::head_limit::spend_head_bytes(n)?;
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }

    #[inline(always)]
    fn read_exact(&mut self, out: &mut [u8]) -> std::io::Result<()> {
        match self.buf[self.pos..self.end].get(..out.len()) {
            Some(bytes) => {
                crate::head_limit::spend_head_bytes(bytes.len())?;
                out.copy_from_slice(bytes);
                self.pos += out.len();
                Ok(())
            }
            None => self.read_exact_slowly(out),
        }
    }
}

impl<R: Read> Body<R> {
    /// [`Read::read_exact`] across refills of the buffer.
    #[cold]
    fn read_exact_slowly(&mut self, mut out: &mut [u8]) -> std::io::Result<()> {
        while !out.is_empty() {
            match self.read(out)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => out = &mut out[n..],
            }
        }
        Ok(())
    }
}

fn check_version(version: u32, what: &str) -> Result<()> {
    if version > FORMAT_VERSION {
        return Err(Error::new(
            ErrorKind::NewerVersion,
            format!(
                "{what} format version {version} was written by a newer snapdiff; this one reads up to \
                 version {FORMAT_VERSION}"
            ),
        ));
    }
    if version == 0 {
        return Err(Error::new(
            ErrorKind::Malformed,
            format!("{what} format version 0 does not exist"),
        ));
    }
    Ok(())
}

/// The `.json` document: the format version, then the snapshot.
#[derive(Serialize)]
struct JsonOut<'a> {
    snapdiff_format: u32,
    snapshot: &'a Snapshot,
}

#[derive(Deserialize)]
struct JsonIn {
    snapdiff_format: u32,
    snapshot: serde::de::IgnoredAny,
}

#[derive(Deserialize)]
struct JsonBody {
    snapshot: Snapshot,
}

/// Encodes `snap` as a pretty-printed `.json` document into `out`.
pub fn write_json<W: Write>(snap: &Snapshot, out: W) -> Result<()> {
    serde_json::to_writer_pretty(
        out,
        &JsonOut {
            snapdiff_format: FORMAT_VERSION,
            snapshot: snap,
        },
    )
    .map_err(|e| Error::new(ErrorKind::Io, format!("cannot write JSON: {e}")))
}

/// `data` without the UTF-8 byte-order mark some Windows editors save JSON
/// with (JSON itself forbids it; serde_json refuses it).
pub(crate) fn without_bom(data: &[u8]) -> &[u8] {
    data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data)
}

/// Decodes a `.json` document held in `data`, with or without a byte-order
/// mark.
pub(crate) fn read_json(data: &[u8]) -> Result<Snapshot> {
    let bad = |e: serde_json::Error| {
        let kind = if e.is_eof() {
            ErrorKind::Truncated
        } else {
            ErrorKind::Malformed
        };
        Error::new(kind, format!("invalid snapdiff JSON: {e}"))
    };
    let data = without_bom(data);
    // Check the version before trusting the shape of the rest.
    let head: JsonIn = serde_json::from_slice(data).map_err(bad)?;
    let _ = head.snapshot;
    check_version(head.snapdiff_format, "JSON")?;
    let body: JsonBody = serde_json::from_slice(data).map_err(bad)?;
    body.snapshot
        .check_references()
        .map_err(|m| Error::new(ErrorKind::Malformed, format!("invalid snapdiff JSON: {m}")))?;
    Ok(body.snapshot)
}

/// Whether a write may replace a file already at its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Replace it.
    Replace,
    /// Fail with an [`ErrorKind::Io`] error of kind `AlreadyExists`, decided
    /// at the moment the file is put in place, so that of two writers racing
    /// to one path, one fails rather than both succeeding.
    Keep,
}

/// The variable `snapdiff capture` gives its job: the capture's run.
const CAPTURE_RUN: &str = "SNAPDIFF_RUN";

/// The start and end of the hidden temporary name `path` is written under,
/// around its random part: `.{name}.{random}.{run}.{pid}.tmp`, with the run
/// of the capture this process is a job of (`-` for none). `capture`
/// removes such a file of its own run once its process is gone: a job
/// killed mid-dump leaves nothing behind. PyTorch's hook names its own
/// temporaries so too. The name is cut to its first 96 characters, so that
/// the temporary's stays within what file systems allow.
fn temporary_name(path: &Path) -> (String, String) {
    let name: Option<String> = path
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(96).collect());
    let run = std::env::var(CAPTURE_RUN)
        .ok()
        .filter(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric()))
        .unwrap_or_else(|| "-".to_owned());
    (
        format!(".{}.", name.unwrap_or_default()),
        format!(".{run}.{}.tmp", std::process::id()),
    )
}

/// Writes `bytes` produced by `encode` to `path` atomically: into a temporary
/// file in the same folder, then renamed to `path`, so a reader never sees
/// half a file and a failed write leaves any old file intact.
pub fn write_atomically(
    path: &Path,
    existing: Existing,
    encode: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let err = |what: &str, e: std::io::Error| Error::io(what.to_owned(), e).with_path(path);
    // Temporary files are private (0600); a snapshot is as readable as any file.
    #[cfg(unix)]
    let permissions = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::Permissions::from_mode(0o644)
    };
    let (prefix, suffix) = temporary_name(path);
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(&suffix);
    #[cfg(unix)]
    builder.permissions(permissions);
    let mut tmp = builder
        .tempfile_in(dir)
        .map_err(|e| err("cannot create a temporary file", e))?;
    {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file_mut());
        encode(&mut w).map_err(|e| e.with_path(path))?;
        w.flush().map_err(|e| err("cannot write", e))?;
    }
    match existing {
        Existing::Replace => tmp
            .persist(path)
            .map_err(|e| err("cannot rename the temporary file into place", e.error))?,
        Existing::Keep => tmp.persist_noclobber(path).map_err(|e| {
            if e.error.kind() == std::io::ErrorKind::AlreadyExists {
                err("already exists", e.error)
            } else {
                err("cannot rename the temporary file into place", e.error)
            }
        })?,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `snapdiff capture` relies on to remove a killed job's
    /// half-written dump: the temporary is hidden, names the file, and ends
    /// with the capture's run and the writing process.
    #[test]
    fn a_file_is_written_under_a_hidden_name_with_its_run_and_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapdiff-7-dev0-0001-step.snap");
        let mut seen = Vec::new();
        write_atomically(&path, Existing::Keep, |w| {
            seen = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            w.write_all(b"whole").map_err(|e| Error::io("writing", e))
        })
        .unwrap();
        let [name] = &seen[..] else {
            panic!("one temporary expected: {seen:?}");
        };
        // Its run is `-`, or the capture's when the tests run under one.
        let (random, run) = name
            .strip_prefix(".snapdiff-7-dev0-0001-step.snap.")
            .and_then(|n| n.strip_suffix(&format!(".{}.tmp", std::process::id())))
            .and_then(|n| n.split_once('.'))
            .unwrap_or_else(|| panic!("{name}"));
        assert!(
            !random.is_empty() && !run.is_empty() && !run.contains('.'),
            "{name}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A name as long as a file system allows still writes: the
    /// temporary's is cut.
    #[test]
    fn a_file_of_the_longest_name_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{}.snap", "a".repeat(250)));
        write_atomically(&path, Existing::Keep, |w| {
            w.write_all(b"whole").map_err(|e| Error::io("writing", e))
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
    }
}
