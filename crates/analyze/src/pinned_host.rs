//! Pinned host memory: the page-locked RAM PyTorch's host allocator hands
//! to `pin_memory()` and non-blocking copies (a file's `host_segments`).
//! It is never a device's memory: reports give it its own lines and
//! totals, say what its cache holds, and judge its growth on its own.
//!
//! The host allocator never splits a block and keeps every block it frees
//! for a later request of the same power-of-two size, until
//! `empty_cache()`: a process that pins buffers of ever new sizes (images
//! of many shapes, say) holds more pinned RAM at every step while nothing
//! it uses grows.

use serde::Serialize;
use snapdiff_format::{BlockState, Snapshot};

use crate::rising::Rising;

/// Pinned host memory at one snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PinnedHost {
    /// Bytes pinned from the system: every block, in use or cached.
    pub reserved_bytes: u64,
    /// Bytes of the blocks in use (allocated, or freed while a stream's
    /// copy is still running).
    pub in_use_bytes: u64,
    /// Blocks in use.
    pub in_use_blocks: u64,
    /// Bytes of the free blocks the allocator keeps for reuse.
    pub cached_bytes: u64,
    /// Free blocks it keeps.
    pub cached_blocks: u64,
    /// Distinct sizes among the free blocks: each serves only requests
    /// that round up to its size.
    pub cached_sizes: u64,
}

/// The pinned host memory `snap` records, when it recorded any
/// (`record_pinned_host_memory=True`).
pub fn pinned_host(snap: &Snapshot) -> Option<PinnedHost> {
    let mut host = PinnedHost::default();
    let mut sizes = Vec::new();
    let mut any = false;
    for block in snap.pinned_host_segments().flat_map(|s| &s.blocks) {
        any = true;
        host.reserved_bytes += block.size;
        if block.state == BlockState::Inactive {
            host.cached_bytes += block.size;
            host.cached_blocks += 1;
            sizes.push(block.size);
        } else {
            host.in_use_bytes += block.size;
            host.in_use_blocks += 1;
        }
    }
    sizes.sort_unstable();
    sizes.dedup();
    host.cached_sizes = sizes.len() as u64;
    any.then_some(host)
}

/// Pinned host memory between two snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PinnedHostChange {
    /// Before (zeros when that snapshot recorded none).
    pub before: PinnedHost,
    /// After.
    pub after: PinnedHost,
}

impl PinnedHostChange {
    /// The change between `before` and `after`, when either recorded
    /// pinned host memory.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Option<PinnedHostChange> {
        match (pinned_host(before), pinned_host(after)) {
            (None, None) => None,
            (b, a) => Some(PinnedHostChange {
                before: b.unwrap_or_default(),
                after: a.unwrap_or_default(),
            }),
        }
    }
}

/// Pinned host memory over a run of checkpoints, judged on its own by the
/// pinned bytes (see [`Rising`]; growth under 1 MiB never counts).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PinnedHostTrend {
    /// At the end of warm-up.
    pub first: PinnedHost,
    /// At the last checkpoint.
    pub last: PinnedHost,
    /// The pinned bytes, judged.
    #[serde(flatten)]
    pub rising: Rising,
}

/// Growth below this over a run is never called growing: a few buffers'
/// worth of pinned RAM is noise.
const MIN_GROWTH_BYTES: u64 = 1 << 20;

impl PinnedHostTrend {
    /// The trend of `series` (each checkpoint's pinned host memory and
    /// step, in order), the first `warmup` checkpoints left out; `None`
    /// when no checkpoint recorded any.
    pub fn of(
        series: &[(Option<PinnedHost>, Option<u64>)],
        warmup: usize,
    ) -> Option<PinnedHostTrend> {
        if series.iter().all(|(h, _)| h.is_none()) {
            return None;
        }
        let host = |i: usize| series[i].0.unwrap_or_default();
        let bytes: Vec<(u64, Option<u64>)> = (0..series.len())
            .map(|i| (host(i).reserved_bytes, series[i].1))
            .collect();
        Some(PinnedHostTrend {
            first: host(warmup.min(series.len() - 1)),
            last: host(series.len() - 1),
            rising: Rising::of(&bytes, warmup, MIN_GROWTH_BYTES),
        })
    }
}
