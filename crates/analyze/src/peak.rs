//! The moment a device held the most memory, and what held it.
//!
//! A leak shows up as a rising peak, and an out-of-memory error happens at
//! one. Replaying a device's trace gives the bytes live after every event;
//! at the highest point, the live blocks are grouped by site (culprit line
//! as everywhere else) and by [`Category`]. Reserved memory is followed
//! through the segment events, so the allocator's cache at that moment
//! (reserved minus allocated) is shown too.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_format::{Action, DeviceTrace, Snapshot};

use crate::category::{Categories, Category};
use crate::culprit::CulpritRules;
use crate::group::{Site, SiteNamer, SiteTotals, culprit_line, merge_rows};
use crate::judge::trend_trace_with_keys;
use crate::replay::{Replayed, highest_at, replay_to};
use crate::stack_key::{StackKey, StackKeys};
use crate::trend::TrendOptions;

/// Options of [`peak`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct PeakOptions {
    /// How culprits are chosen.
    pub rules: CulpritRules,
}

/// The peak of every device whose trace allocates.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Peak {
    /// One entry per busy device, by ordinal.
    pub devices: Vec<DevicePeak>,
    /// Plain statements about the analysis.
    pub notes: Vec<String>,
}

/// The highest point of one device's trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DevicePeak {
    /// Device ordinal.
    pub device: u32,
    /// Events of the trace replayed when the peak was reached.
    pub event_index: usize,
    /// Events in the trace.
    pub events: usize,
    /// When the peak was reached (µs since the epoch), if events have times.
    pub time_us: Option<i64>,
    /// Bytes live at the peak (as the trace records them, requested sizes).
    pub allocated_bytes: u64,
    /// Bytes reserved from the driver at that moment, when the trace's
    /// segment events allow following them.
    pub reserved_bytes: Option<u64>,
    /// Reserved minus allocated at that moment: the allocator's cache.
    pub cache_bytes: Option<u64>,
    /// The highest reserved memory over the trace, and when, if known.
    pub highest_reserved: Option<HighestReserved>,
    /// Live bytes by category, largest first.
    pub categories: Vec<CategoryTotal>,
    /// Live bytes by site, largest first.
    pub sites: Vec<PeakSite>,
    /// Live bytes by memory pool, the shared pool first, when the trace
    /// allocates in a private pool (CUDA graphs, `torch.cuda.MemPool`,
    /// vLLM's KV cache); empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolBytes>,
    /// What the sites that keep growing (as `trend` finds them) gained
    /// after warm-up, and held at the peak: how much of the peak a leak
    /// explains. `None` when no site keeps growing.
    pub growth: Option<PeakGrowth>,
}

/// Live memory of one pool at the peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PoolBytes {
    /// The pool's id; `(0, 0)` is the shared pool.
    pub pool_id: (i64, i64),
    /// Live blocks.
    pub blocks: u64,
    /// Live bytes (requested).
    pub bytes: u64,
}

/// The part of a peak that sites that keep growing explain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PeakGrowth {
    /// Their growth after warm-up, over the whole trace.
    pub growth_bytes: u64,
    /// What they held at the peak.
    pub held_bytes: u64,
}

/// The highest reserved memory and when it was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HighestReserved {
    /// Events replayed when it was reached.
    pub event_index: usize,
    /// Bytes reserved.
    pub bytes: u64,
}

/// Live memory of one category at the peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CategoryTotal {
    /// The category.
    pub category: Category,
    /// Live blocks.
    pub blocks: u64,
    /// Live bytes.
    pub bytes: u64,
    /// Of these, bytes allocated before recording began.
    pub before_recording_bytes: u64,
}

/// One site's live memory at the peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeakSite {
    /// The site.
    #[serde(flatten)]
    pub site: Site,
    /// What its blocks are for.
    pub category: Category,
    /// Live blocks.
    pub blocks: u64,
    /// Live bytes.
    pub bytes: u64,
    /// Whether some of its blocks were allocated before recording began.
    pub before_recording: bool,
}

/// Finds the peak of every device of `snap` whose trace allocates.
pub fn peak(snap: &Snapshot, options: &PeakOptions) -> Peak {
    let keys = StackKeys::new(snap);
    let namer = SiteNamer::keyed(snap, &keys, &options.rules);
    let categories = Categories::new(snap);
    // Suspects by whole stack, to find their stacks' blocks at the peak.
    let trend_options = TrendOptions {
        rules: options.rules.clone().with_rows_by_stack(true),
        ..TrendOptions::default()
    };
    // The trend and the peaks each replay the trace: side by side.
    let (suspects, at_peaks) = rayon::join(
        || {
            trend_trace_with_keys(snap, &keys, &trend_options)
                .map(|t| t.suspects)
                .unwrap_or_default()
        },
        || busy_peaks(snap, &keys, &namer, &categories),
    );
    let mut notes = Vec::new();
    let devices: Vec<DevicePeak> = at_peaks
        .into_iter()
        .map(|(mut peak, at)| {
            peak.growth = (!suspects.is_empty()).then(|| PeakGrowth {
                growth_bytes: suspects.iter().map(|s| s.growth_bytes).sum(),
                held_bytes: suspects
                    .iter()
                    .filter_map(|s| at.points[0].get(&s.site.key))
                    .map(|t| t.bytes)
                    .sum(),
            });
            peak
        })
        .collect();
    if devices.is_empty() {
        notes.push(
            "no trace allocates: the file holds no recorded history, so there is no peak to \
             find (record with torch.cuda.memory._record_memory_history(), or capture)"
                .to_owned(),
        );
    }
    Peak { devices, notes }
}

/// The peak of each device whose trace allocates, with the replay cut
/// there, without what grows (see [`peak`] for that).
fn busy_peaks(
    snap: &Snapshot,
    keys: &StackKeys,
    namer: &SiteNamer,
    categories: &Categories,
) -> Vec<(DevicePeak, Replayed)> {
    snap.traces
        .iter()
        .filter(|t| t.events.actions().any(|a| a == Action::Alloc))
        .map(|trace| {
            // First the highest point (bytes only), then the live sites
            // there: the replay stops there (the first reach of the
            // highest point is the same in the events before it).
            let at = replay_to(snap, keys, trace, highest_at(trace));
            (device_peak(snap, trace, &at, namer, categories), at)
        })
        .collect()
}

/// The peak of each device of `snap` whose trace allocates, without what
/// grows (the trend [`peak`] also runs): for a baseline's peak moment.
pub(crate) fn device_peaks(
    snap: &Snapshot,
    keys: &StackKeys,
    namer: &SiteNamer,
    categories: &Categories,
) -> Vec<DevicePeak> {
    busy_peaks(snap, keys, namer, categories)
        .into_iter()
        .map(|(peak, _)| peak)
        .collect()
}

/// The peak of `trace`, from `at`: its replay cut at the highest point.
fn device_peak(
    snap: &Snapshot,
    trace: &DeviceTrace,
    at: &Replayed,
    namer: &SiteNamer,
    categories: &Categories,
) -> DevicePeak {
    let (allocated_bytes, event_index) = at.highest;
    let (categories, sites) = live_breakdown(at, namer, categories);
    let reserved = reserved_over(snap, trace, event_index);
    let reserved_bytes = reserved.map(|r| r.at);
    DevicePeak {
        device: trace.device,
        event_index,
        events: trace.events.len(),
        time_us: event_index
            .checked_sub(1)
            .and_then(|i| trace.events.get(i)?.time_us),
        allocated_bytes,
        reserved_bytes,
        cache_bytes: reserved_bytes.map(|r| r.saturating_sub(allocated_bytes)),
        highest_reserved: reserved.map(|r| r.highest),
        categories,
        sites,
        pools: pools_at(snap, trace, event_index),
        growth: None,
    }
}

/// Live bytes by pool after `index` events of `trace`; empty unless some
/// of them are in a private pool. An event's pool is its `pool_id` (newest
/// PyTorch), else that of the device's segment holding its address.
fn pools_at(snap: &Snapshot, trace: &DeviceTrace, index: usize) -> Vec<PoolBytes> {
    let mut private: Vec<(u64, u64, (i64, i64))> = snap
        .segments
        .iter()
        .filter(|s| s.device == trace.device && s.pool_id != (0, 0))
        .map(|s| (s.address, s.address + s.total_size, s.pool_id))
        .collect();
    private.sort_unstable();
    let has_pool_ids = (trace.events.with_details()).any(|(_, d)| d.pool_id.is_some());
    if private.is_empty() && !has_pool_ids {
        return Vec::new();
    }
    let segment_pool = |address: u64| {
        let i = private.partition_point(|&(start, _, _)| start <= address);
        i.checked_sub(1)
            .map(|i| private[i])
            .filter(|&(_, end, _)| address < end)
            .map_or((0, 0), |(_, _, pool)| pool)
    };
    let mut live: FxHashMap<u64, (u64, (i64, i64))> = FxHashMap::default();
    for e in trace.events.iter().take(index) {
        match e.action {
            Action::Alloc => {
                let pool = e.details.as_ref().and_then(|d| d.pool_id);
                live.insert(
                    e.address,
                    (e.size, pool.unwrap_or_else(|| segment_pool(e.address))),
                );
            }
            Action::FreeCompleted => {
                live.remove(&e.address);
            }
            _ => {}
        }
    }
    let mut by_pool: BTreeMap<(i64, i64), PoolBytes> = BTreeMap::new();
    for (size, pool_id) in live.into_values() {
        let p = by_pool.entry(pool_id).or_insert(PoolBytes {
            pool_id,
            blocks: 0,
            bytes: 0,
        });
        p.blocks += 1;
        p.bytes += size;
    }
    if by_pool.keys().all(|&p| p == (0, 0)) {
        return Vec::new();
    }
    by_pool.into_values().collect()
}

/// What was live at the first cut of `at`, by category and by site,
/// largest first.
pub(crate) fn live_breakdown(
    at: &Replayed,
    namer: &SiteNamer,
    categories: &Categories,
) -> (Vec<CategoryTotal>, Vec<PeakSite>) {
    let live: &FxHashMap<StackKey, SiteTotals> = &at.points[0];
    let mut sites: Vec<PeakSite> = live
        .iter()
        .map(|(&key, t)| {
            let stack = at.stacks.get(&key).copied().flatten();
            let before_recording = at.before_recording.contains(&key);
            let category = match categories.of(stack) {
                Category::Unknown if before_recording => Category::BeforeRecording,
                c => c,
            };
            PeakSite {
                site: namer.site(key, stack),
                category,
                blocks: t.blocks,
                bytes: t.bytes,
                before_recording,
            }
        })
        .collect();
    if !namer.rules().rows_by_stack() {
        sites = merge_rows(
            sites,
            |s| (culprit_line(&s.site), s.category),
            |s| (s.bytes, s.site.key),
            |into, other| {
                into.site.absorb(other.site);
                into.blocks += other.blocks;
                into.bytes += other.bytes;
                into.before_recording |= other.before_recording;
            },
        );
    }
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.key.cmp(&b.site.key)));
    let mut by_category: FxHashMap<Category, CategoryTotal> = FxHashMap::default();
    for s in &sites {
        let total = by_category
            .entry(s.category)
            .or_insert_with(|| CategoryTotal {
                category: s.category,
                blocks: 0,
                bytes: 0,
                before_recording_bytes: 0,
            });
        total.blocks += s.blocks;
        total.bytes += s.bytes;
        if s.before_recording {
            total.before_recording_bytes += s.bytes;
        }
    }
    let mut categories: Vec<CategoryTotal> = by_category.into_values().collect();
    categories.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.category.cmp(&b.category)));
    (categories, sites)
}

/// Reserved bytes at one moment, and at their highest.
#[derive(Clone, Copy)]
pub(crate) struct Reserved {
    pub(crate) at: u64,
    pub(crate) highest: HighestReserved,
}

/// Reserved bytes after `index` events of `trace`, and their highest over
/// it. Follows reserved memory through the segment events, from what
/// the device's segments hold at the end back to the start. `None` when the
/// trace has no segment events to follow (a trace recorded with
/// `trace_alloc_record_context` off, or a file without segments).
pub(crate) fn reserved_over(
    snap: &Snapshot,
    trace: &DeviceTrace,
    index: usize,
) -> Option<Reserved> {
    let change = |action: &Action, size: u64| -> i128 {
        match action {
            Action::SegmentAlloc | Action::SegmentMap => i128::from(size),
            Action::SegmentFree | Action::SegmentUnmap => -i128::from(size),
            _ => 0,
        }
    };
    if !trace.events.actions().any(|a| change(&a, 1) != 0) || snap.segments.is_empty() {
        return None;
    }
    let at_end: i128 = snap
        .segments
        .iter()
        .filter(|s| s.device == trace.device)
        .map(|s| i128::from(s.total_size))
        .sum();
    let changes = || trace.events.actions().zip(trace.events.sizes());
    let net: i128 = changes().map(|(a, &size)| change(&a, size)).sum();
    let mut reserved = at_end - net;
    if reserved < 0 {
        // The segments at the end do not account for the trace's events (a
        // snapshot taken on another device, or edited): nothing to follow.
        return None;
    }
    let mut at = reserved as u64;
    let mut highest = HighestReserved {
        event_index: 0,
        bytes: reserved as u64,
    };
    for (i, (a, &size)) in changes().enumerate() {
        reserved += change(&a, size);
        let bytes = reserved.max(0) as u64;
        if i + 1 == index {
            at = bytes;
        }
        if bytes > highest.bytes {
            highest = HighestReserved {
                event_index: i + 1,
                bytes,
            };
        }
    }
    Some(Reserved { at, highest })
}
