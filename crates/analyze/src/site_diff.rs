//! What a comparison says of one site: the types `compare`, the kept
//! blocks of a trend and the moved-site matching share, in a module of
//! their own so that none of those imports another for them.

use serde::Serialize;

use crate::culprit::Culprit;
use crate::group::Site;

/// What happened to a site between the snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// No live blocks before, some after.
    New,
    /// More bytes after.
    Grown,
    /// Fewer bytes after, some left.
    Shrunk,
    /// Live blocks before, none after.
    Freed,
    /// The same blocks and requested bytes, rounded to a different allocated
    /// size (carved from other segments): allocator slack, not growth.
    Rounding,
}

/// One site whose live bytes changed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupDiff {
    /// The site.
    #[serde(flatten)]
    pub site: Site,
    /// What happened.
    pub change: Change,
    /// Live blocks before.
    pub blocks_before: u64,
    /// Live blocks after.
    pub blocks_after: u64,
    /// Live bytes before (requested, see [`SiteTotals`](crate::group::SiteTotals)).
    pub bytes_before: u64,
    /// Live bytes after.
    pub bytes_after: u64,
    /// `bytes_after - bytes_before`.
    pub delta_bytes: i64,
    /// Allocated (rounded) bytes before.
    pub allocated_before: u64,
    /// Allocated bytes after.
    pub allocated_after: u64,
    /// Blocks live in both snapshots (per [`Matching`](crate::Matching); 0 for `site_only`).
    pub blocks_kept: u64,
    /// What kept its blocks alive in AFTER, when the process said
    /// (capture's owners files); left out of JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<crate::held_by::HeldBy>,
    /// Where the site was in the first of two runs, when its code moved
    /// (see `moved.rs`); left out of JSON when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<MovedFrom>,
}

/// How a site was matched to its place in the other run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Moved {
    /// The same frames, lines shifted alike.
    Lines,
    /// The same function names; the file moved or was renamed.
    File,
    /// The same blocks and bytes, through another frame.
    Path,
}

/// Where a site was in the first run, when it moved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MovedFrom {
    /// The site's culprit in the first run.
    pub culprit: Culprit,
    /// How the two were matched.
    pub how: Moved,
}
