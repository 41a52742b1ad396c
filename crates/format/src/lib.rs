//! The snapdiff snapshot model and its files.
//!
//! Every reader produces the same [`Snapshot`]; nothing downstream knows which
//! file it came from. Readers recognise the kind of file from its bytes,
//! never its name:
//!
//! | kind | recognised by | written by |
//! |---|---|---|
//! | `.snap` | `SNAPDIFF` magic | [`write_path`], `snapdiff-runtime` |
//! | `.json` | a `{` | [`write_path`] |
//! | PyTorch pickle | `\x80` + protocol 2-5 | `torch.cuda.memory._dump_snapshot()`, pickle of `memory_snapshot()` |
//! | `torch.save` zip | `PK\x03\x04` | `torch.save(torch.cuda.memory._snapshot(), f)` |
//!
//! ```
//! use snapdiff_format::{read_bytes, write_snap, Snapshot};
//!
//! let mut file = Vec::new();
//! write_snap(&Snapshot::default(), &mut file)?;
//! let back = read_bytes(&file)?;
//! assert_eq!(back, Snapshot::default());
//! # Ok::<(), snapdiff_format::Error>(())
//! ```

#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod codes;
mod columns;
mod compressed;
mod error;
mod events;
mod forward;
mod head_limit;
mod intern;
mod model;
pub mod names;
mod open;
mod owners;
mod pickle;
mod progress;
mod read;
mod snap;
pub mod units;
mod value;
pub mod visible;

use std::path::Path;

pub use crate::compressed::Compression;
pub use crate::error::{Error, ErrorKind, Result};
pub use crate::events::{BlockAction, BlockEvent, EventIter, Events, Indexed};
pub use crate::model::{
    Action, Annotation, Block, BlockState, CompactString, DeviceInfo, DeviceName, DeviceTrace,
    EventDetails, Frame, FrameId, HistoryEntry, Meta, PINNED_HOST_DEVICE, Pool, Segment, Snapshot,
    StackId, StrId, ThinVec, Totals, TraceEvent,
};
pub use crate::open::{open_regular, prefetch, read_regular};
pub use crate::owners::{Owner, Owners, owners_path, read_owners_beside};
pub use crate::pickle::write_torch_pickle;
pub use crate::read::{Reader, read_path};
pub use crate::snap::{Existing, FORMAT_VERSION, MAGIC, write_atomically, write_json, write_snap};
pub use crate::value::{Extra, Value};

/// The kinds of file snapdiff reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// The native `.snap` file.
    Snap,
    /// The `.json` form of the model.
    Json,
    /// A PyTorch snapshot pickle.
    Pickle,
    /// A `torch.save` zip file.
    TorchZip,
}

impl FileKind {
    /// Recognises a file from its first bytes.
    pub fn detect(data: &[u8]) -> Option<FileKind> {
        match data {
            [b'S', b'N', b'A', b'P', b'D', b'I', b'F', b'F', ..] => Some(FileKind::Snap),
            [0x80, 2..=5, ..] => Some(FileKind::Pickle),
            [b'P', b'K', 3, 4, ..] => Some(FileKind::TorchZip),
            _ if snap::without_bom(data)
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                == Some(&b'{') =>
            {
                Some(FileKind::Json)
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::Snap => ".snap",
            FileKind::Json => "JSON",
            FileKind::Pickle => "pickle",
            FileKind::TorchZip => "zip",
        })
    }
}

/// Which parts of a file a reader needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Parts {
    /// Everything the file holds.
    #[default]
    All,
    /// The state at dump time (segments, blocks, frames, annotations): the
    /// traces come without their events. `.snap` files step over the
    /// events' columns, and PyTorch pickles over their trace's opcodes
    /// (making none of its values, so the frames only events use are not
    /// in the tables, and nothing in the events is checked); other files
    /// are parsed whole and their events dropped after.
    WithoutEvents,
}

/// Reads a snapshot from bytes of any supported kind: the shorthand for
/// `Reader::new().read_bytes(data)`.
pub fn read_bytes(data: &[u8]) -> Result<Snapshot> {
    read_bytes_parts_with(data, Parts::All, read::Threads::Two, None)
}

/// Reads the `parts` of a snapshot from bytes of any supported kind,
/// telling `progress` how far a pickle's parsing (or a `.snap`'s
/// decompression) has got now and then.
fn read_bytes_parts_with(
    data: &[u8],
    parts: Parts,
    threads: read::Threads,
    progress: Option<progress::Progress>,
) -> Result<Snapshot> {
    if let Some(how) = compressed::Compression::detect(data) {
        let inside =
            compressed::decompress(data, how, |head| FileKind::detect(head).is_some(), progress)?;
        // Content spilled to a mapped file is read as a large file is: its
        // pages handed back behind the parser.
        let pages = match &inside {
            compressed::Decompressed::Mapped(map) => Some(progress::Progress::with_pages(
                |_| {},
                Some(progress::Pages::of(map)),
            )),
            compressed::Decompressed::InMemory(_) => None,
        };
        return read_bytes_parts_with(&inside, parts, threads, pages)
            .map_err(|e| e.inside(how.name()));
    }
    let mut snap = match FileKind::detect(data) {
        Some(FileKind::Snap) => return snap::read_snap_parts(data, parts, progress),
        _ => read_bytes_of_kind(data, parts, threads, progress)?,
    };
    if parts == Parts::WithoutEvents {
        for trace in &mut snap.traces {
            trace.events = Events::new();
        }
    }
    Ok(snap)
}

/// Reads a file of any supported kind: everything it holds, or for a
/// PyTorch pickle without events, what is around its trace where the
/// trace can be stepped over (`parts`).
fn read_bytes_of_kind(
    data: &[u8],
    parts: Parts,
    threads: read::Threads,
    progress: Option<progress::Progress>,
) -> Result<Snapshot> {
    match FileKind::detect(data) {
        Some(FileKind::Snap) => snap::read_snap_parts(data, Parts::All, None),
        Some(FileKind::Json) => snap::read_json(data).map(|mut snap| {
            forward::join(&mut snap);
            snap
        }),
        Some(FileKind::Pickle) if data.starts_with(pickle::legacy_torch_save::MAGIC) => {
            pickle::legacy_torch_save::read(data, parts)
        }
        Some(FileKind::Pickle) => pickle::read(data, None, parts, threads, progress),
        Some(FileKind::TorchZip) => pickle::torch_zip::read(data, parts),
        None if data.is_empty() => Err(Error::new(
            ErrorKind::UnknownFormat,
            "empty file, not a snapshot",
        )),
        None if data[0] == 0x80 => Err(Error::new(
            ErrorKind::UnknownFormat,
            format!(
                "pickle protocol {} is not one snapshots use (2 to 5)",
                data.get(1).copied().unwrap_or(0)
            ),
        )),
        None => {
            let head: Vec<String> = data.iter().take(4).map(|b| format!("{b:02x}")).collect();
            Err(Error::new(
                ErrorKind::UnknownFormat,
                format!(
                    "not a snapshot: unrecognised content starting with bytes {} (expected a .snap, \
                     .json, PyTorch pickle or torch.save file)",
                    head.join(" ")
                ),
            ))
        }
    }
}

/// Writes `snap` to `path` atomically, as JSON if the name ends in `.json`,
/// as `.snap` if it ends in `.snap`, and as a PyTorch snapshot pickle if it
/// ends in `.pickle` or `.pkl`; `existing` says whether a file already
/// there may be replaced.
pub fn write_path(path: impl AsRef<Path>, snap: &Snapshot, existing: Existing) -> Result<()> {
    let path = path.as_ref();
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => write_atomically(path, existing, |w| write_json(snap, w)),
        Some("snap") => write_atomically(path, existing, |w| write_snap(snap, w)),
        Some("pickle" | "pkl") => {
            write_atomically(path, existing, |w| pickle::write_torch_pickle(snap, w))
        }
        _ => Err(Error::new(
            ErrorKind::Io,
            "cannot tell the output format: name it .snap, .json or .pickle",
        )
        .with_path(path)),
    }
}
