//! `torch.save` files in the legacy format (`_use_new_zipfile_serialization=False`,
//! and every file from PyTorch before 1.6): pickles one after another, a
//! magic number, the protocol version (1001), a dict of system facts, then
//! the saved object, then the keys and bytes of any tensor storages (which
//! a snapshot has none of, and which are not read).

use crate::error::{Error, ErrorKind, Result};
use crate::model::Snapshot;

/// The first pickle of every legacy file: protocol 2, `LONG1` of PyTorch's
/// magic number 0x1950a86a20f9469cfc6c, `STOP`.
pub(crate) const MAGIC: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.";

/// The only protocol version legacy files were written with.
const PROTOCOL_VERSION: &[u8] = b"\x80\x02M\xe9\x03.";

/// Reads the `parts` of the snapshot saved in a legacy `torch.save` file
/// (which starts with [`MAGIC`]).
pub(crate) fn read(data: &[u8], parts: crate::Parts) -> Result<Snapshot> {
    let rest = &data[MAGIC.len()..];
    let Some(rest) = rest.strip_prefix(PROTOCOL_VERSION) else {
        return Err(Error::new(
            ErrorKind::Malformed,
            "a legacy torch.save file whose protocol version is not 1001",
        ));
    };
    let sys_info = super::machine::length(rest).map_err(|e| {
        Error::new(
            e.kind(),
            format!("legacy torch.save file: its system facts: {}", e.message()),
        )
    })?;
    super::read(
        &rest[sys_info..],
        Some("legacy torch.save file"),
        parts,
        crate::read::Threads::Two,
        None,
    )
    .map_err(|e| {
        let message = format!("legacy torch.save file: {}", e.message());
        Error::new(e.kind(), message)
    })
}
