//! What a snapshot holds: totals with PyTorch's meanings, broken down by
//! device, pool and stream, plus fragmentation and trace event counts.

use std::collections::BTreeMap;

use serde::Serialize;
use snapdiff_format::{BlockState, PINNED_HOST_DEVICE, Pool, Snapshot, Totals};

use crate::culprit::CulpritRules;
use crate::group::{self, LiveByStack, Site, SiteNamer, merge_rows};
use crate::pinned_host::{PinnedHost, pinned_host};
use crate::stack_key::{StackKey, StackKeys};

/// A device, pool, private pool and stream, what totals are kept by.
type PoolKey = (u32, Pool, (i64, i64), i64);

/// Totals of one device, pool (private pools apart) and stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolTotals {
    /// Device ordinal.
    pub device: u32,
    /// `small` or `large`.
    pub pool: &'static str,
    /// A private memory pool's id (CUDA graphs, `torch.cuda.MemPool`, such
    /// as vLLM's KV cache); `None` for the shared pools, `(0, 0)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_pool: Option<(i64, i64)>,
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

/// A site holding live memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteUsage {
    /// The site.
    #[serde(flatten)]
    pub site: Site,
    /// Live blocks.
    pub blocks: u64,
    /// Live bytes.
    pub bytes: u64,
    /// Share of all live bytes, from 0 to 1.
    pub share: f64,
    /// What kept its blocks alive, when the process said (see
    /// [`Summary::add_held_by`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<crate::HeldBy>,
}

/// The summary of one snapshot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Totals over all devices (pinned host memory is not one).
    #[serde(flatten)]
    pub totals: Totals,
    /// Pinned host memory, when the file recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_host: Option<PinnedHost>,
    /// Number of trace events over all devices.
    pub trace_events: u64,
    /// Trace events per action name.
    pub actions: BTreeMap<String, u64>,
    /// Totals per device, pool and stream, in that order.
    pub pools: Vec<PoolTotals>,
    /// Free memory inside the devices' reserved segments.
    pub fragmentation: Fragmentation,
    /// The sites holding the most live memory, most first.
    pub top_sites: Vec<SiteUsage>,
}

/// Options of [`summarize`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SummaryOptions {
    /// How culprits are chosen.
    pub rules: CulpritRules,
    /// The most sites `top_sites` names. Default: 10.
    pub top: usize,
}

impl Default for SummaryOptions {
    fn default() -> Self {
        SummaryOptions {
            rules: CulpritRules::default(),
            top: 10,
        }
    }
}

/// Summarizes `snap`, naming the sites that hold the most live memory.
pub fn summarize(snap: &Snapshot, options: &SummaryOptions) -> Summary {
    let (rules, top) = (&options.rules, options.top);
    // The blocks' figures on one thread, the events' counts and the stack
    // keys on the other.
    let ((per_pool, frag, live), (actions, keys)) = rayon::join(
        || block_figures(snap),
        || (action_counts(snap), StackKeys::new(snap)),
    );
    let groups = live.into_groups(&keys);
    let live: u64 = groups.totals.values().map(|t| t.bytes).sum();
    let namer = SiteNamer::keyed(snap, &keys, rules);
    // Each row: a stack key, its totals, and how many stacks it stands for
    // (several when sites whose culprits are the same line are merged; the
    // key is then the largest one's). Culprits are found for every site,
    // the frames only for the rows shown.
    let mut rows: Vec<(StackKey, group::SiteTotals, u32)> =
        groups.totals.iter().map(|(&key, &t)| (key, t, 1)).collect();
    if !rules.rows_by_stack() {
        rows = merge_rows(
            rows,
            |&(key, _, _)| namer.culprit_line(groups.stacks[&key]),
            |&(key, t, _)| (t.bytes, key),
            |into, (_, t, n)| {
                into.1.blocks += t.blocks;
                into.1.bytes += t.bytes;
                into.2 += n;
            },
        );
    }
    rows.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
    let top_sites = rows
        .into_iter()
        .take(top)
        .map(|(key, t, stacks)| SiteUsage {
            site: Site {
                stacks,
                ..namer.site(key, groups.stacks[&key])
            },
            blocks: t.blocks,
            bytes: t.bytes,
            share: if live == 0 {
                0.0
            } else {
                t.bytes as f64 / live as f64
            },
            held_by: Vec::new(),
        })
        .collect();
    Summary {
        totals: per_pool
            .iter()
            .filter(|((device, ..), _)| *device != PINNED_HOST_DEVICE)
            .fold(Totals::default(), |mut all, (_, t)| {
                all.merge(t);
                all
            }),
        pinned_host: pinned_host(snap),
        trace_events: snap.trace_len() as u64,
        actions,
        pools: per_pool
            .into_iter()
            .map(|((device, pool, pool_id, stream), totals)| PoolTotals {
                device,
                pool: pool.name(),
                private_pool: (pool_id != (0, 0)).then_some(pool_id),
                stream,
                totals,
            })
            .collect(),
        fragmentation: frag,
        top_sites,
    }
}

/// Totals by device, pool and stream, fragmentation, and live blocks by
/// stack: one pass over the blocks for every figure, as a million blocks
/// are 70 MB to bring in from memory, and each segment's blocks are in
/// cache for the second look.
fn block_figures(snap: &Snapshot) -> (BTreeMap<PoolKey, Totals>, Fragmentation, LiveByStack) {
    let mut per_pool: BTreeMap<PoolKey, Totals> = BTreeMap::new();
    let mut frag = Fragmentation::default();
    let mut live = LiveByStack::new(snap);
    for seg in &snap.segments {
        per_pool
            .entry((seg.device, seg.pool, seg.pool_id, seg.stream))
            .or_default()
            .add_segment(seg);
        if seg.is_pinned_host() {
            // Its own row above; never in the devices' figures.
            continue;
        }
        for b in &seg.blocks {
            match b.state {
                BlockState::Inactive => {
                    frag.free_bytes += b.size;
                    frag.largest_free_block = frag.largest_free_block.max(b.size);
                }
                _ => frag.internal_slack_bytes += b.size.saturating_sub(b.requested_size),
            }
            live.add(b);
        }
    }
    (per_pool, frag, live)
}

/// Trace events by action name, over all devices.
fn action_counts(snap: &Snapshot) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for trace in &snap.traces {
        for (action, n) in trace.events.action_counts() {
            *counts.entry(action.name().to_owned()).or_insert(0) += n;
        }
    }
    counts
}

impl Summary {
    /// Fills in each top site's `held_by` from the owners when the
    /// snapshot was dumped. `line_of` gives the culprit line of a site key
    /// (see [`SiteLines`](crate::held_by::SiteLines)).
    pub fn add_held_by(
        &mut self,
        owners: &crate::held_by::SiteOwners,
        rules: &crate::CulpritRules,
        line_of: impl FnMut(crate::StackKey) -> Option<crate::held_by::CulpritLine>,
    ) {
        let rows = self.top_sites.iter_mut().map(|u| (&u.site, &mut u.held_by));
        crate::held_by::fill(rows, owners, None, None, rules, line_of);
    }
}
