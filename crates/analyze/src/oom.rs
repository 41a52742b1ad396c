//! An out-of-memory error, explained from the snapshot taken at it.
//!
//! PyTorch records an `oom` trace event before it raises `OutOfMemoryError`
//! (with the rounded request, its stream and stack, and the driver's free
//! bytes), and so does snapdiff's runtime; a snapshot dumped at that moment
//! (PyTorch's OOM observer, capture's `oom` dump, the runtime's own) holds
//! the rest. From it: what was asked for; how much was free and in which
//! pieces, so whether the request would have fit if the free memory had been
//! one piece (fragmentation) or the device was simply full; what held the
//! memory, by category and site, as [`peak`](crate::peak()) shows it; and what
//! kept growing before the error, when the trace shows a leak.

use serde::Serialize;
use snapdiff_format::{Action, BlockState, DeviceTrace, Pool, Segment, Snapshot};

use crate::category::Categories;
use crate::culprit::CulpritRules;
use crate::group::{Site, SiteNamer};
use crate::judge::trend_trace_with_keys;
use crate::peak::{CategoryTotal, PeakSite, live_breakdown, reserved_over};
use crate::replay::replay;
use crate::stack_key::StackKeys;
use crate::trend::{Suspect, TrendOptions};

/// Options of [`oom`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OomOptions {
    /// How culprits are chosen.
    pub rules: CulpritRules,
}

/// The out-of-memory errors of a snapshot, one per device that had one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Oom {
    /// The last error of each device that had one, by ordinal.
    pub devices: Vec<DeviceOom>,
    /// Plain statements about the analysis.
    pub notes: Vec<String>,
}

/// The last out-of-memory error of one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceOom {
    /// Device ordinal.
    pub device: u32,
    /// Out-of-memory errors in the trace (the last is the one described).
    pub errors: usize,
    /// Events of the trace before the error.
    pub event_index: usize,
    /// Events in the trace.
    pub events: usize,
    /// When, in µs since the epoch, if events have times.
    pub time_us: Option<i64>,
    /// The request that failed, rounded as the allocator rounds it.
    pub requested_bytes: u64,
    /// Its stream.
    pub stream: i64,
    /// Where it was asked for, if the trace recorded stacks.
    pub request: Option<Site>,
    /// Free bytes the driver reported.
    pub device_free: Option<u64>,
    /// Bytes live then (requested sizes, as the trace records them).
    pub allocated_bytes: u64,
    /// Bytes reserved from the driver then, when the trace allows following them.
    pub reserved_bytes: Option<u64>,
    /// The allocator's free blocks, when the snapshot was taken at the error.
    pub cache: Option<FreePieces>,
    /// Of those, the ones that could serve the request: of its stream and
    /// pool (at most 1 MiB: small; larger: large).
    pub usable: Option<FreePieces>,
    /// Whether the request would have fit in all the free memory as one
    /// piece, when that is known: `true` means fragmentation, `false` a full
    /// device.
    pub fits_without_fragmentation: Option<bool>,
    /// Live bytes by category, largest first.
    pub categories: Vec<CategoryTotal>,
    /// Live bytes by site, largest first.
    pub sites: Vec<PeakSite>,
    /// Sites that kept growing before the error (as `trend` finds them).
    pub grew: Vec<Suspect>,
    /// Whether the request would have fit without that growth, when there
    /// was some and the free memory is known.
    pub fits_without_growth: Option<bool>,
}

/// Free blocks held by the allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FreePieces {
    /// Their bytes.
    pub bytes: u64,
    /// How many.
    pub pieces: u64,
    /// The largest.
    pub largest: u64,
}

/// Explains the last out-of-memory error of each device of `snap`.
pub fn oom(snap: &Snapshot, options: &OomOptions) -> Oom {
    let keys = StackKeys::new(snap);
    let namer = SiteNamer::new(snap, &options.rules);
    let categories = Categories::new(snap);
    // What kept growing before the error: a leak is what usually fills a
    // device that held steady before.
    let trend_options = TrendOptions {
        rules: options.rules.clone(),
        ..TrendOptions::default()
    };
    let grew = trend_trace_with_keys(snap, &keys, &trend_options)
        .map(|t| t.suspects)
        .unwrap_or_default();
    let devices: Vec<DeviceOom> = snap
        .traces
        .iter()
        .filter_map(|trace| {
            let errors = trace.events.actions().filter(|a| *a == Action::Oom).count();
            let index = trace.events.actions().rposition(|a| a == Action::Oom)?;
            Some(device_oom(
                snap,
                trace,
                index,
                errors,
                (&keys, &namer, &categories),
                &grew,
            ))
        })
        .collect();
    let mut notes = Vec::new();
    if devices.is_empty() {
        notes.push(
            "no out-of-memory error in the trace: this snapshot was not taken at one (or was \
             recorded without history; record with torch.cuda.memory._record_memory_history())"
                .to_owned(),
        );
    }
    Oom { devices, notes }
}

/// The error at event `index` of `trace`.
fn device_oom(
    snap: &Snapshot,
    trace: &DeviceTrace,
    index: usize,
    errors: usize,
    (keys, namer, categories): (&StackKeys, &SiteNamer, &Categories),
    grew: &[Suspect],
) -> DeviceOom {
    let event = trace.events.get(index).unwrap_or_default();
    let at = replay(snap, keys, trace, &[index]);
    let (category_totals, sites) = live_breakdown(&at, namer, categories);
    let allocated_bytes = sites.iter().map(|s| s.bytes).sum();
    // The snapshot's free blocks are those of the error only when nothing
    // was allocated or freed after it (the cache released to retry is gone
    // by then either way).
    let taken_at_error = !trace.events.actions().skip(index + 1).any(|a| {
        matches!(
            a,
            Action::Alloc | Action::FreeCompleted | Action::FreeRequested
        )
    });
    let cache = taken_at_error.then(|| free_pieces(snap, trace.device, |_| true));
    let pool = if event.size <= SMALL_REQUEST {
        Pool::Small
    } else {
        Pool::Large
    };
    let usable = taken_at_error.then(|| {
        free_pieces(snap, trace.device, |s| {
            s.stream == event.stream && s.pool == pool
        })
    });
    let device_free = event.device_free();
    let free = match (cache, device_free) {
        (Some(cache), Some(device)) => Some(cache.bytes + device),
        _ => None,
    };
    let fits_without_fragmentation = free.map(|free| free >= event.size);
    let grew = grew.to_vec();
    let growth: u64 = grew.iter().map(|s| s.growth_bytes).sum();
    let fits_without_growth = if growth > 0 {
        free.map(|free| free + growth >= event.size)
    } else {
        None
    };
    DeviceOom {
        device: trace.device,
        errors,
        event_index: index,
        events: trace.events.len(),
        time_us: event.time_us,
        requested_bytes: event.size,
        stream: event.stream,
        request: event.stack.map(|s| namer.site(keys.key(Some(s)), Some(s))),
        device_free,
        allocated_bytes,
        reserved_bytes: reserved_over(snap, trace, index).map(|r| r.at),
        cache,
        usable,
        fits_without_fragmentation,
        categories: category_totals,
        sites,
        grew,
        fits_without_growth,
    }
}

/// The largest request PyTorch's small pool serves.
const SMALL_REQUEST: u64 = 1 << 20;

/// The free blocks of `device`'s segments that `keep` keeps.
fn free_pieces(snap: &Snapshot, device: u32, keep: impl Fn(&Segment) -> bool) -> FreePieces {
    let mut pieces = FreePieces::default();
    for block in snap
        .segments
        .iter()
        .filter(|s| s.device == device && keep(s))
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::Inactive)
    {
        pieces.bytes += block.size;
        pieces.pieces += 1;
        pieces.largest = pieces.largest.max(block.size);
    }
    pieces
}
