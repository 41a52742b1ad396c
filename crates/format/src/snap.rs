//! The native `.snap` file and its `.json` twin.
//!
//! A `.snap` file is a 20-byte header followed by one zstd frame:
//!
//! ```text
//! offset  size  field
//! 0       8     magic: the ASCII bytes "SNAPDIFF"
//! 8       4     format version, u32 little-endian (currently 2)
//! 12      8     length of the uncompressed body, u64 little-endian
//! 20      ...   zstd frame; uncompressed, the MessagePack encoding of a
//!               `Snapshot`, structs as arrays in field order
//! ```
//!
//! The full layout, field by field, and the versioning rule are in
//! `docs/format.md`. Any change to the model's fields bumps the version;
//! readers refuse versions newer than they know.

use std::io::{BufRead, Read, Write};
use std::path::Path;

use serde::de::DeserializeOwned;
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
pub const FORMAT_VERSION: u32 = 2;
/// Header length in bytes.
const HEADER_LEN: usize = 20;

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

/// Encodes `snap` as a `.snap` file into `out`.
pub fn write_snap<W: Write>(snap: &Snapshot, mut out: W) -> Result<()> {
    let body = rmp_serde::to_vec(snap)
        .map_err(|e| Error::new(ErrorKind::Malformed, format!("cannot encode snapshot: {e}")))?;
    let compressed = zstd::bulk::compress(&body, ZSTD_LEVEL)
        .map_err(|e| Error::io("cannot compress snapshot", e))?;
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..20].copy_from_slice(&(body.len() as u64).to_le_bytes());
    out.write_all(&header)
        .and_then(|()| out.write_all(&compressed))
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
    if data.len() < HEADER_LEN {
        return Err(Error::new(
            ErrorKind::Truncated,
            format!(
                "truncated .snap header ({} of {HEADER_LEN} bytes)",
                data.len()
            ),
        ));
    }
    if &data[..8] != MAGIC {
        return Err(Error::new(
            ErrorKind::Malformed,
            "not a .snap file (bad magic bytes)",
        ));
    }
    let version = u32::from_le_bytes(data[8..12].try_into().unwrap());
    check_version(version, ".snap")?;
    let body_len = u64::from_le_bytes(data[12..20].try_into().unwrap());
    let input = ZstdInput {
        data,
        pos: HEADER_LEN,
        progress,
        next_progress: PROGRESS_EVERY,
    };
    let snap: Snapshot = match parts {
        Parts::All => read_body(input, body_len)?,
        Parts::WithoutEvents => read_body::<WithoutEvents>(input, body_len)?.into(),
    };
    snap.check_references()
        .map_err(|m| Error::new(ErrorKind::Malformed, format!("corrupt .snap body: {m}")))?;
    Ok(snap)
}

/// A [`Snapshot`] as a `.snap` body holds it, with each trace read for its
/// device only: the same fields in the same order (the body is a MessagePack
/// array of them), so the columns of millions of events are stepped over
/// instead of decoded. A test checks it reads what `Snapshot` writes.
#[derive(Deserialize)]
struct WithoutEvents {
    meta: Meta,
    #[serde(with = "crate::columns::frames")]
    frames: Vec<Frame>,
    #[serde(with = "crate::columns::stacks")]
    stacks: Vec<Vec<FrameId>>,
    strings: Vec<String>,
    segments: Vec<Segment>,
    traces: Vec<TraceDevice>,
    annotations: Vec<Annotation>,
    allocator_settings: Value,
    extra: Extra,
}

impl From<WithoutEvents> for Snapshot {
    fn from(w: WithoutEvents) -> Snapshot {
        Snapshot {
            meta: w.meta,
            frames: w.frames,
            stacks: w.stacks,
            strings: w.strings,
            segments: w.segments,
            traces: w
                .traces
                .into_iter()
                .map(|t| DeviceTrace {
                    device: t.0,
                    events: Events::new(),
                })
                .collect(),
            annotations: w.annotations,
            allocator_settings: w.allocator_settings,
            extra: w.extra,
        }
    }
}

/// The device of a trace's columns (their first field); the rest skipped.
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
                use serde::de::{Error as _, IgnoredAny};
                let device = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::custom("a trace without its device"))?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(TraceDevice(device))
            }
        }
        d.deserialize_seq(Columns)
    }
}

/// Decodes the body of a `.snap` file from its zstd frame (the rest of
/// `input`), which must expand to `body_len` bytes, as it is decompressed: the body is
/// never held whole, and a trace's columns are turned into events one at a
/// time as they arrive (`columns.rs`).
///
/// The body must be one zstd frame, as [`write_snap`] writes it: no skippable
/// frames or further frames before or after, whose sizes no header bounds.
/// Decompression stops at `body_len` bytes, so no stream can expand past
/// what the header declared, and the header may declare at most
/// [`MAX_EXPANSION`] times the frame's size or [`ALWAYS_ALLOWED`] bytes;
/// its traces, at most [`EVENTS_PER_BYTE`] events a byte of the frame or
/// [`EVENTS_ALWAYS_ALLOWED`].
fn read_body<T: DeserializeOwned>(input: ZstdInput, body_len: u64) -> Result<T> {
    let compressed = &input.data[input.pos..];
    let corrupt =
        |what: String| Error::new(ErrorKind::Malformed, format!("corrupt .snap body: {what}"));
    if body_len > (compressed.len() as u64).saturating_mul(MAX_EXPANSION)
        && body_len > ALWAYS_ALLOWED
    {
        return Err(Error::new(
            ErrorKind::Malformed,
            format!(
                "corrupt .snap header: a {}-byte body cannot expand to the {body_len} bytes it claims",
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
            "truncated or corrupt .snap body: its zstd frame is incomplete",
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
    let decoder =
        zstd::stream::read::Decoder::with_buffer(input).map_err(|e| corrupt(e.to_string()))?;
    let mut body = Body::new(decoder.take(body_len));
    let most_events = (frame_len as u64)
        .saturating_mul(EVENTS_PER_BYTE)
        .max(EVENTS_ALWAYS_ALLOWED);
    let decoded = crate::columns::with_event_limit(most_events, frame_len, || {
        rmp_serde::from_read(&mut body)
    });
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
            format!("truncated .snap body: {} of {body_len} bytes", body.count),
        ));
    }
    decoded.map_err(|e| corrupt(e.to_string()))
}

/// The zstd frame of a `.snap` file, as the decompressor reads it: the file
/// from `pos` on, telling `progress` how far it has got.
struct ZstdInput<'a> {
    /// The whole file.
    data: &'a [u8],
    /// Where the next unread byte is.
    pos: usize,
    progress: Option<Progress>,
    /// The position at which `progress` is told next.
    next_progress: usize,
}

impl BufRead for ZstdInput<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        Ok(&self.data[self.pos..])
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
                return Ok(n);
            }
            self.refill()?;
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }

    #[inline(always)]
    fn read_exact(&mut self, out: &mut [u8]) -> std::io::Result<()> {
        match self.buf[self.pos..self.end].get(..out.len()) {
            Some(bytes) => {
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
    let mut builder = tempfile::Builder::new();
    builder.prefix(".snapdiff-").suffix(".tmp");
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
