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

/// Pinned host memory over a run of checkpoints, judged on its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PinnedHostTrend {
    /// At the end of warm-up.
    pub first: PinnedHost,
    /// At the last checkpoint.
    pub last: PinnedHost,
    /// Checkpoints after warm-up at which the pinned bytes rose.
    pub rises: usize,
    /// Checkpoints after warm-up.
    pub checkpoints: usize,
    /// Growth of the pinned bytes a step, when the checkpoints record
    /// their step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth_per_step: Option<f64>,
    /// Whether it keeps growing: see [`PinnedHostTrend::of`].
    pub grows: bool,
}

/// Growth below this over a run is never called growing: a few buffers'
/// worth of pinned RAM is noise.
const MIN_GROWTH_BYTES: u64 = 1 << 20;

/// The least number of rises after warm-up for pinned memory to be said
/// to keep growing; a cache that fills once, early, rises once or twice.
const MIN_RISES: usize = 3;

impl PinnedHostTrend {
    /// The trend of `series` (each checkpoint's pinned host memory and
    /// step, in order), the first `warmup` checkpoints left out; `None`
    /// when no checkpoint recorded any. It grows when its pinned bytes
    /// rose by at least 1 MiB in all, at [`MIN_RISES`] checkpoints or
    /// more after warm-up, one of them in the second half of the run (a
    /// cache that filled early and then held still does not grow).
    pub fn of(
        series: &[(Option<PinnedHost>, Option<u64>)],
        warmup: usize,
    ) -> Option<PinnedHostTrend> {
        if series.iter().all(|(h, _)| h.is_none()) {
            return None;
        }
        let start = warmup.min(series.len().saturating_sub(1));
        let judged = &series[start..];
        let bytes = |i: usize| judged[i].0.map_or(0, |h| h.reserved_bytes);
        let rose_at: Vec<usize> = (1..judged.len())
            .filter(|&i| bytes(i) > bytes(i - 1))
            .collect();
        let first = judged[0].0.unwrap_or_default();
        let last = judged[judged.len() - 1].0.unwrap_or_default();
        let growth = last.reserved_bytes.saturating_sub(first.reserved_bytes);
        let late = rose_at.iter().any(|&i| 2 * i > judged.len() - 1);
        let growth_per_step = match (judged[0].1, judged[judged.len() - 1].1) {
            (Some(a), Some(b)) if b > a => {
                Some((last.reserved_bytes as f64 - first.reserved_bytes as f64) / (b - a) as f64)
            }
            _ => None,
        };
        Some(PinnedHostTrend {
            first,
            last,
            rises: rose_at.len(),
            checkpoints: judged.len().saturating_sub(1),
            growth_per_step,
            grows: growth >= MIN_GROWTH_BYTES && rose_at.len() >= MIN_RISES && late,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn at(reserved_mib: u64, step: u64) -> (Option<PinnedHost>, Option<u64>) {
        let host = PinnedHost {
            reserved_bytes: reserved_mib * MIB,
            ..PinnedHost::default()
        };
        (Some(host), Some(step))
    }

    #[test]
    fn a_cache_that_fills_early_and_holds_does_not_grow() {
        let series: Vec<_> = [4, 8, 16, 20, 20, 20, 20, 20, 20, 20]
            .iter()
            .enumerate()
            .map(|(i, &m)| at(m, i as u64))
            .collect();
        let trend = PinnedHostTrend::of(&series, 1).unwrap();
        assert_eq!(trend.rises, 2);
        assert!(!trend.grows);
    }

    #[test]
    fn a_cache_rising_through_the_run_grows() {
        let series: Vec<_> = [4, 8, 8, 12, 12, 16, 16, 20, 20, 24]
            .iter()
            .enumerate()
            .map(|(i, &m)| at(m, 10 * i as u64))
            .collect();
        let trend = PinnedHostTrend::of(&series, 1).unwrap();
        assert_eq!(trend.rises, 4);
        assert!(trend.grows);
        assert_eq!(trend.growth_per_step, Some((16 * MIB) as f64 / 80.0));
    }

    #[test]
    fn nothing_recorded_is_no_trend() {
        assert_eq!(
            PinnedHostTrend::of(&[(None, Some(1)), (None, Some(2))], 0),
            None
        );
    }
}
