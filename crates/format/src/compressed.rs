//! Compressed snapshot files: gzip, zstd, xz and bzip2, recognised by their
//! first bytes (never by their names), streamed out with progress, and
//! bounded as `.snap` bodies are.
//!
//! A snapshot pickle of 500 MB shrinks several times; users keep them as
//! `.pickle.gz` or `.zst`. The decompressed bytes are read as any file is,
//! so every kind inside (pickle, `.snap`, JSON, `torch.save` zip) works.
//!
//! Small content is decompressed into memory. Past [`SPILL_FROM`] it is
//! streamed into an unnamed temporary file (in `TMPDIR`), which is then
//! mapped and read as a large plain file is, its pages handed back behind
//! the parser: the content is never held whole in memory beside what is
//! built from it. (The parsers read a byte slice and look back at earlier
//! bytes, so they cannot take the decoder's stream itself.)

use std::io::{Read, Write};

use crate::error::{Error, ErrorKind, Result};
use crate::progress::{PROGRESS_EVERY, Progress};

/// How a file is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// gzip (`.gz`).
    Gzip,
    /// Zstandard (`.zst`).
    Zstd,
    /// xz (`.xz`).
    Xz,
    /// bzip2 (`.bz2`).
    Bzip2,
}

impl Compression {
    /// Recognises a compressed file from its first bytes.
    pub fn detect(data: &[u8]) -> Option<Compression> {
        match data {
            [0x1f, 0x8b, ..] => Some(Compression::Gzip),
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Some(Compression::Zstd),
            [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => Some(Compression::Xz),
            [b'B', b'Z', b'h', b'1'..=b'9', ..] => Some(Compression::Bzip2),
            _ => None,
        }
    }

    /// Its name, as error messages say it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
            Compression::Xz => "xz",
            Compression::Bzip2 => "bzip2",
        }
    }
}

/// Output this many times the compressed size, and over
/// [`ALWAYS_ALLOWED`], is refused: snapshot pickles compress 3 to 20 times,
/// traces of one repeated loop up to a few hundred.
const MAX_EXPANSION: u64 = 1024;
/// Output up to this size is read whatever the ratio.
const ALWAYS_ALLOWED: u64 = 64 << 20;
/// Bytes decompressed before the content is checked to be a snapshot: a
/// compressed file of something else stops there.
const SNIFF_BYTES: usize = 64;
/// Content past this size goes to a temporary file, not memory.
const SPILL_FROM: usize = 16 << 20;

/// Decompressed content: in memory, or in a mapped temporary file (which
/// is gone from the file system already, and from the disk once unmapped).
pub(crate) enum Decompressed {
    InMemory(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for Decompressed {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Decompressed::InMemory(bytes) => bytes,
            Decompressed::Mapped(map) => map,
        }
    }
}

/// Where decompressed bytes go: memory until [`SPILL_FROM`], then a
/// temporary file.
struct Sink {
    head: Vec<u8>,
    file: Option<std::io::BufWriter<std::fs::File>>,
    len: u64,
}

impl Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.len += bytes.len() as u64;
        if self.file.is_none() && self.head.len() + bytes.len() > SPILL_FROM {
            let mut file = std::io::BufWriter::with_capacity(1 << 20, tempfile::tempfile()?);
            file.write_all(&self.head)?;
            self.head = Vec::new();
            self.file = Some(file);
        }
        match &mut self.file {
            Some(file) => file.write_all(bytes),
            None => {
                self.head.extend_from_slice(bytes);
                Ok(())
            }
        }
    }

    fn finish(self) -> std::io::Result<Decompressed> {
        let Some(file) = self.file else {
            return Ok(Decompressed::InMemory(self.head));
        };
        let file = file.into_inner().map_err(|e| e.into_error())?;
        // SAFETY: the file is this process's own, created new and gone from
        // the file system (O_TMPFILE, or unlinked at once): no other program
        // finds it by name to change it while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Ok(Decompressed::Mapped(map))
    }
}

/// The compressed bytes, counting how many the decoder has read, for
/// progress.
struct Counting<'a> {
    data: &'a [u8],
    at: std::rc::Rc<std::cell::Cell<usize>>,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let at = self.at.get();
        let n = buf.len().min(self.data.len() - at);
        buf[..n].copy_from_slice(&self.data[at..at + n]);
        self.at.set(at + n);
        Ok(n)
    }
}

/// The decompressed content of `data`, compressed as `how`, telling
/// `progress` how many compressed bytes were read now and then. The
/// content must itself be a snapshot (checked on its first bytes by
/// `is_snapshot`), not compressed again, and within the expansion bound.
pub(crate) fn decompress(
    data: &[u8],
    how: Compression,
    is_snapshot: impl Fn(&[u8]) -> bool,
    mut progress: Option<Progress>,
) -> Result<Decompressed> {
    let limit = (data.len() as u64)
        .saturating_mul(MAX_EXPANSION)
        .max(ALWAYS_ALLOWED);
    let consumed = std::rc::Rc::new(std::cell::Cell::new(0));
    let input = Counting {
        data,
        at: consumed.clone(),
    };
    let corrupt = |e: std::io::Error| {
        Error::new(
            ErrorKind::Corrupt,
            format!("not a whole {} stream: {e}", how.name()),
        )
    };
    let mut reader: Box<dyn Read + '_> = match how {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(input).map_err(corrupt)?),
        Compression::Xz => Box::new(liblzma::read::XzDecoder::new_multi_decoder(input)),
        Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(input)),
    };
    let mut out = Sink {
        head: Vec::with_capacity(data.len().saturating_mul(4).min(SPILL_FROM)),
        file: None,
        len: 0,
    };
    let spill_failed = |e: std::io::Error| {
        Error::io(
            "cannot hold the decompressed content in a temporary file (TMPDIR)",
            e,
        )
    };
    let mut chunk = vec![0u8; 1 << 20];
    let mut told = 0usize;
    let mut sniffed = false;
    loop {
        let n = reader.read(&mut chunk).map_err(corrupt)?;
        if n == 0 {
            break;
        }
        if out.len + n as u64 > limit {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{} content expands over {} times its size: refused as a bomb",
                    how.name(),
                    MAX_EXPANSION
                ),
            ));
        }
        if !sniffed {
            // A decoder's first read gives at least the bytes looked at,
            // unless the whole content is shorter.
            sniffed = true;
            let head = &chunk[..n.min(SNIFF_BYTES)];
            if Compression::detect(head).is_some() {
                return Err(Error::new(
                    ErrorKind::UnknownFormat,
                    format!(
                        "{} content is compressed again: decompress it first",
                        how.name()
                    ),
                ));
            }
            if !is_snapshot(head) {
                return Err(Error::new(
                    ErrorKind::UnknownFormat,
                    format!(
                        "{} content is not a snapshot (expected a .snap, .json, PyTorch pickle or \
                         torch.save file inside)",
                        how.name()
                    ),
                ));
            }
        }
        out.write(&chunk[..n]).map_err(spill_failed)?;
        if let Some(tell) = progress.as_mut() {
            let at = consumed.get();
            if at / PROGRESS_EVERY > told / PROGRESS_EVERY {
                told = at;
                tell.done(at);
            }
        }
    }
    if let Some(tell) = progress.as_mut() {
        // A mapped compressed file's last pages go back before its content
        // is parsed.
        tell.done(consumed.get());
    }
    if out.len == 0 {
        return Err(Error::new(
            ErrorKind::UnknownFormat,
            format!("{} content is empty, not a snapshot", how.name()),
        ));
    }
    out.finish().map_err(spill_failed)
}
