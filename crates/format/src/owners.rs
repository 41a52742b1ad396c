//! Owners files: what `capture` (and the pytest plugin) write
//! beside a dump, `NAME.owners.json` for `NAME.pickle`: who kept each live
//! block alive, by block address (written by
//! `python/snapdiff/hook/snapdiff_owners.py`; its fields are in
//! `docs/cli.md`). The analyses group them into "held by".

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// An owners file: the owner of each block, keyed by its address.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Owners {
    /// Whether the search ended before its time budget: only then is a
    /// block without an owner known to have none.
    #[serde(default)]
    pub complete: bool,
    /// Each block's owner, by its address in decimal.
    #[serde(default)]
    pub blocks: HashMap<String, Owner>,
}

/// One block's owner.
#[derive(Clone, Debug, Deserialize)]
pub struct Owner {
    /// The full path to the block's tensor (`train.history[39]`).
    pub owner: String,
    /// What the search grouped it under (`train.history`).
    pub group: String,
    /// The type of the container holding it, when it is an element.
    pub container: Option<String>,
    /// `global`, `local`, `autograd`, `cycle` or `native`.
    pub kind: String,
    /// Every container on the block's path, outermost first: (the path
    /// to it, its type).
    #[serde(default)]
    pub groups: Vec<(String, Option<String>)>,
}

impl Owners {
    /// The owner of the block at `address`.
    pub fn of(&self, address: u64) -> Option<&Owner> {
        self.blocks.get(&address.to_string())
    }
}

/// Owners files are small (a line per live block); a larger one is not read.
const MAX_BYTES: u64 = 256 << 20;

/// The owners file of the snapshot at `path`: `NAME.owners.json` beside
/// `NAME.pickle`.
pub fn owners_path(path: &Path) -> PathBuf {
    path.with_extension("owners.json")
}

/// The owners file beside the snapshot at `path`, if there is one that
/// reads (a missing, oversized or unreadable one is none: reports then
/// say nothing of owners).
pub fn read_owners_beside(path: &Path) -> Option<Owners> {
    let owners = crate::read_regular(&owners_path(path), MAX_BYTES).ok()?;
    serde_json::from_slice(&owners).ok()
}
