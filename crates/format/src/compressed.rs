//! Compressed snapshot files: gzip, zstd, xz and bzip2, recognised by their
//! first bytes (never by their names), streamed out with progress, and
//! bounded as `.snap` bodies are.
//!
//! A snapshot pickle of 500 MB shrinks several times; users keep them as
//! `.pickle.gz` or `.zst`. The decompressed bytes are read as any file is,
//! so every kind inside (pickle, `.snap`, JSON, `torch.save` zip) works.

use std::io::Read;

use crate::error::{Error, ErrorKind, Result};
use crate::read::{PROGRESS_EVERY, Progress};

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
) -> Result<Vec<u8>> {
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
    let mut out: Vec<u8> = Vec::with_capacity(data.len().saturating_mul(4).min(1 << 30));
    let mut chunk = vec![0u8; 1 << 20];
    let mut told = 0usize;
    let mut sniffed = false;
    loop {
        let n = reader.read(&mut chunk).map_err(corrupt)?;
        if n == 0 {
            break;
        }
        if out.len() as u64 + n as u64 > limit {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{} content expands over {} times its size: refused as a bomb",
                    how.name(),
                    MAX_EXPANSION
                ),
            ));
        }
        out.extend_from_slice(&chunk[..n]);
        if !sniffed && out.len() >= SNIFF_BYTES.min(n) {
            sniffed = true;
            if Compression::detect(&out).is_some() {
                return Err(Error::new(
                    ErrorKind::UnknownFormat,
                    format!(
                        "{} content is compressed again: decompress it first",
                        how.name()
                    ),
                ));
            }
            if !is_snapshot(&out) {
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
        if let Some(tell) = progress.as_mut() {
            let at = consumed.get();
            if at / PROGRESS_EVERY > told / PROGRESS_EVERY {
                told = at;
                tell.done(at);
            }
        }
    }
    if out.is_empty() {
        return Err(Error::new(
            ErrorKind::UnknownFormat,
            format!("{} content is empty, not a snapshot", how.name()),
        ));
    }
    Ok(out)
}
