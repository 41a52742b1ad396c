//! `torch.save` zip files: a folder holding `data.pkl` (the pickled object),
//! `version`, `byteorder` and, when tensors were saved, `data/<n>` storages.
//!
//! The folder is named after the file (`foo.pt` holds `foo/`, or `archive/`
//! for a file object), so the entry is found by its base name, as PyTorch's
//! own reader takes the prefix from the first entry.

use std::io::{Cursor, Read};

use crate::Parts;
use crate::error::{Error, ErrorKind, Result};
use crate::model::Snapshot;
use crate::read::Threads;

/// Compressed entries may expand at most this many times (torch.save stores
/// them uncompressed; this only guards against zip bombs).
const MAX_EXPANSION: u64 = 256;

/// Reads the `parts` of the snapshot pickled in a `torch.save` zip.
pub(crate) fn read(data: &[u8], parts: Parts) -> Result<Snapshot> {
    let bad = |e: zip::result::ZipError| {
        Error::new(ErrorKind::Malformed, format!("broken zip file: {e}"))
    };
    let mut archive = zip::ZipArchive::new(Cursor::new(data)).map_err(bad)?;
    let mut pickles = (0..archive.len()).filter(|&i| {
        archive
            .name_for_index(i)
            .is_some_and(|name| name.is_ok_and(|n| n == "data.pkl" || n.ends_with("/data.pkl")))
    });
    let index = pickles.next().ok_or_else(|| {
        Error::new(
            ErrorKind::NotASnapshot,
            "a zip file without data.pkl, so not a torch.save file",
        )
    })?;
    // torch.save writes one; with two, which one a reader takes is a guess,
    // and two readers could show two different snapshots of one file.
    if pickles.next().is_some() {
        return Err(Error::new(
            ErrorKind::Malformed,
            "the zip holds more than one data.pkl, so which snapshot it is cannot be told",
        ));
    }
    let entry = archive.by_index(index).map_err(bad)?;
    let limit = (data.len() as u64).saturating_mul(MAX_EXPANSION);
    if entry.size() > limit {
        return Err(Error::new(
            ErrorKind::TooLarge,
            format!(
                "data.pkl claims {} bytes, too many for a {}-byte zip",
                entry.size(),
                data.len()
            ),
        ));
    }
    let mut pickle = Vec::with_capacity(entry.size() as usize);
    entry.take(limit).read_to_end(&mut pickle).map_err(|e| {
        Error::new(
            ErrorKind::Malformed,
            format!("broken zip file: data.pkl: {e}"),
        )
    })?;
    if let Some(kind) = crate::FileKind::detect(&pickle).filter(|&k| k != crate::FileKind::Pickle) {
        return Err(Error::new(
            ErrorKind::NotASnapshot,
            format!("data.pkl holds a {kind} file, not a pickle"),
        ));
    }
    crate::pickle::read(&pickle, Some("torch.save zip"), parts, Threads::Two, None).map_err(|e| {
        let message = format!("data.pkl: {}", e.message());
        Error::new(e.kind(), message)
    })
}
