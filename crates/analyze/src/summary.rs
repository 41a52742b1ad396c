//! What a snapshot holds: totals with PyTorch's meanings, broken down by
//! device, pool and stream, plus fragmentation and trace event counts.

use std::collections::BTreeMap;

use serde::Serialize;
use snapdiff_format::{BlockState, Pool, Snapshot, Totals};

/// Totals of one device, pool and stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolTotals {
    /// Device ordinal.
    pub device: u32,
    /// `small` or `large`.
    pub pool: &'static str,
    /// The stream.
    pub stream: i64,
    /// Totals over the segments of this device, pool and stream.
    #[serde(flatten)]
    pub totals: Totals,
}

/// Free memory inside reserved segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Fragmentation {
    /// Bytes of inactive (cached, free) blocks.
    pub free_bytes: u64,
    /// The largest inactive block: the biggest request the cache can serve
    /// without asking the driver for more.
    pub largest_free_block: u64,
    /// Bytes of active blocks beyond what was requested (rounding and unsplit slack).
    pub internal_slack_bytes: u64,
}

/// The summary of one snapshot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Totals over all devices.
    #[serde(flatten)]
    pub totals: Totals,
    /// Number of trace events over all devices.
    pub trace_events: u64,
    /// Trace events per action name.
    pub actions: BTreeMap<String, u64>,
    /// Totals per device, pool and stream, in that order.
    pub pools: Vec<PoolTotals>,
    /// Free memory inside reserved segments.
    pub fragmentation: Fragmentation,
}

/// Summarizes `snap`.
pub fn summarize(snap: &Snapshot) -> Summary {
    let mut per_pool: BTreeMap<(u32, Pool, i64), Totals> = BTreeMap::new();
    let mut frag = Fragmentation::default();
    for seg in &snap.segments {
        per_pool
            .entry((seg.device, seg.pool, seg.stream))
            .or_default()
            .add_segment(seg);
        for b in &seg.blocks {
            match b.state {
                BlockState::Inactive => {
                    frag.free_bytes += b.size;
                    frag.largest_free_block = frag.largest_free_block.max(b.size);
                }
                _ => frag.internal_slack_bytes += b.size.saturating_sub(b.requested_size),
            }
        }
    }
    let mut actions = BTreeMap::new();
    for trace in &snap.traces {
        for ev in &trace.events {
            *actions.entry(ev.action.name().to_owned()).or_insert(0) += 1;
        }
    }
    Summary {
        totals: snap.totals(),
        trace_events: snap.trace_len() as u64,
        actions,
        pools: per_pool
            .into_iter()
            .map(|((device, pool, stream), totals)| PoolTotals {
                device,
                pool: pool.name(),
                stream,
                totals,
            })
            .collect(),
        fragmentation: frag,
    }
}
