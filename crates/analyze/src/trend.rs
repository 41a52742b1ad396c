//! Finding the sites whose live memory keeps growing.
//!
//! A trend looks at live bytes per site at a series of checkpoints: several
//! snapshots of one job, or one snapshot's trace cut at its step marks, its
//! `snapshot` markers, its annotation boundaries, or evenly. A
//! *suspect* is a site whose memory keeps growing after warm-up. Two shapes
//! that also rise are not suspects:
//!
//! - a one-time allocation (weights, optimizer state): it rises once and
//!   stays flat;
//! - a periodic rise and fall (activations, gradients): it returns to its
//!   floor.
//!
//! The rule works on the *floor* of each site's series: at checkpoint `i`,
//! the least memory the site holds from `i` to the end. A leak's floor rises
//! again and again; a periodic site's floor stays at its low point; a
//! one-time allocation's floor rises once. A site is a suspect when its floor
//! rises at two checkpoints or more after warm-up, and at no fewer than a
//! third of them (so that two separate one-time allocations among many
//! checkpoints are not taken for a leak); or when it rises like a
//! *staircase*: at four checkpoints or more, at a steady period (the longest
//! gap between rises at most twice the shortest), spread over the whole run
//! (neither its start nor its end longer without a rise than the longest
//! gap). That is a leak that grows once an epoch or an evaluation (a metric
//! state never reset), dumped every step; two or three separate one-time
//! allocations are not one.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use snapdiff_format::{Snapshot, StackId};

use crate::culprit::CulpritRules;
use crate::group::{Site, SiteNamer, SiteTotals, culprit_line, merge_rows};
use crate::held_by::HeldBy;
use crate::outside::{Outside, OutsidePoint};
use crate::pinned_host::{PinnedHost, PinnedHostTrend};
use crate::private_pools::IdlePool;
use crate::series_order::SnapshotOrder;
use crate::stack_key::StackKey;

/// Adds suspect `other` to `into`: two stacks whose culprit is the same
/// line, whose series add up checkpoint by checkpoint.
fn merge_suspects(into: &mut Suspect, other: Suspect) {
    into.site.absorb(other.site);
    into.growth_bytes = into.growth_bytes.saturating_add(other.growth_bytes);
    into.growth_per_checkpoint =
        (into.growth_per_checkpoint).saturating_add(other.growth_per_checkpoint);
    let add = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a + b);
    into.growth_per_second = add(into.growth_per_second, other.growth_per_second);
    into.growth_per_step = add(into.growth_per_step, other.growth_per_step);
    for (mine, theirs) in [
        (&mut into.series, &other.series),
        (&mut into.floor, &other.floor),
        (&mut into.blocks, &other.blocks),
    ] {
        for (a, b) in mine.iter_mut().zip(theirs) {
            *a = a.saturating_add(*b);
        }
    }
    into.before_recording |= other.before_recording;
    into.held_by.extend(other.held_by);
}

/// Checkpoints at the start treated as warm-up by default.
pub const DEFAULT_WARMUP: usize = 1;

/// Growth a step (a checkpoint, where steps are unknown) under which a site
/// is not a suspect beside one that grows at least this much: a
/// framework's bookkeeping (a counter, a logged scalar) beside a real leak.
/// Where all growth is under it, every growing site is still a suspect:
/// a slow leak is all there is.
pub(crate) const SMALL_GROWTH_BYTES: f64 = 1024.0;
/// Checkpoints a trace without markers is cut into by default.
pub(crate) const DEFAULT_CHECKPOINTS: usize = 10;

/// Options of [`trend_snapshots`](crate::trend_snapshots) and [`trend_trace`](crate::trend_trace).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TrendOptions {
    /// How culprits are chosen.
    pub rules: CulpritRules,
    /// Checkpoints at the start that are warm-up: what is allocated up to the
    /// end of warm-up is not growth. Default is [`DEFAULT_WARMUP`].
    pub warmup: usize,
    /// How many checkpoints to cut a trace into when it has no markers.
    /// Default: 10.
    pub checkpoints: usize,
    /// Total device memory, for the time-to-full estimate, when the snapshots
    /// do not record it. Default: none.
    pub device_memory: Option<u64>,
    /// How to cut a trace, when not the first way that finds steps (see
    /// [`CheckpointSource`]); a trace without what it asks for is an error.
    /// Default: none.
    pub cut: Option<CheckpointSource>,
    /// Whether `checkpoints` limits every way of cutting (markers and step
    /// marks too, thinned evenly), as when a user asks for a number.
    /// Default: only cuts found in the trace (iterations, low points) and
    /// even ones are limited.
    pub limit_all: bool,
}

impl Default for TrendOptions {
    fn default() -> Self {
        TrendOptions {
            rules: CulpritRules::default(),
            warmup: DEFAULT_WARMUP,
            checkpoints: DEFAULT_CHECKPOINTS,
            device_memory: None,
            cut: None,
            limit_all: false,
        }
    }
}

/// Iterations found in a trace up to which what grows is a suspect, not a
/// verdict.
const FEW_ITERATIONS: usize = 4;

/// Where the checkpoints came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointSource {
    /// One snapshot file per checkpoint.
    Snapshots,
    /// The trace's `snapshot` markers (where earlier snapshots were taken).
    SnapshotMarkers,
    /// The trace's step marks (`snapdiff-runtime`'s `mark_step`).
    StepMarks,
    /// The boundaries of PyTorch's external annotations.
    Annotations,
    /// At the same phase of every iteration, found from the order in which
    /// the trace's allocation sites repeat.
    Iterations,
    /// At each entry of the loop's function found in the trace's stacks:
    /// the same function called again from the same caller line.
    Calls,
    /// At the trace's recurring low points: the ends of its iterations.
    Troughs,
    /// Evenly spaced through the trace.
    EvenlySpaced,
}

/// One checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Checkpoint {
    /// When, in microseconds since the Unix epoch, if known.
    pub time_us: Option<i64>,
    /// The training step, if known.
    pub step: Option<u64>,
    /// For trace checkpoints, the number of events before the cut.
    pub event_index: Option<usize>,
}

/// A site whose memory keeps growing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Suspect {
    /// The site.
    #[serde(flatten)]
    pub site: Site,
    /// How much its floor grew after warm-up, in bytes.
    pub growth_bytes: u64,
    /// `growth_bytes` per checkpoint after warm-up.
    pub growth_per_checkpoint: u64,
    /// `growth_bytes` per second, when checkpoint times are known.
    pub growth_per_second: Option<f64>,
    /// `growth_bytes` per training step, when checkpoint steps are known.
    pub growth_per_step: Option<f64>,
    /// Live bytes at each checkpoint.
    pub series: Vec<u64>,
    /// Live blocks at each checkpoint.
    pub blocks: Vec<u64>,
    /// The floor at each checkpoint: the least of `series` from there to
    /// the end. A leak's floor keeps rising after warm-up; this is the
    /// evidence the verdict rests on.
    pub floor: Vec<u64>,
    /// Whether some of its blocks were allocated before recording began.
    pub before_recording: bool,
    /// The device whose trace it grew in, when one file's trace holds
    /// several busy devices, each judged on its own; else left out of JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// What kept its blocks alive when the last snapshot was taken, when
    /// the process said (capture's owners files): the owners that gained blocks
    /// first. Left out of JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<HeldBy>,
}

/// The result of a trend analysis: the suspects, sites whose live memory
/// keeps growing after warm-up, with the series they were judged on.
///
/// A site's *floor* at checkpoint `i` is the least memory it holds from `i`
/// to the end. A leak's floor rises again and again; a periodic site's
/// (activations, gradients) stays at its low point; a one-time allocation's
/// (weights, optimizer state) rises once. A site is a suspect when its floor
/// rises at two checkpoints or more after warm-up, and at no fewer than a
/// third of them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trend {
    /// Number of checkpoints.
    pub checkpoints: usize,
    /// Where they came from.
    pub checkpoint_source: CheckpointSource,
    /// How snapshots were put in order; `None` for one trace's checkpoints.
    pub order: Option<SnapshotOrder>,
    /// The checkpoints, oldest first.
    pub points: Vec<Checkpoint>,
    /// Checkpoints treated as warm-up.
    pub warmup: usize,
    /// Sites whose memory keeps growing, most growth first.
    pub suspects: Vec<Suspect>,
    /// Sum of the suspects' growth.
    pub suspected_bytes: u64,
    /// Sum of the suspects' growth per second, when times are known.
    pub growth_per_second: Option<f64>,
    /// Total device memory, if known.
    pub device_memory: Option<u64>,
    /// Allocated bytes at the last checkpoint.
    pub allocated_bytes: u64,
    /// Seconds until the device is full at the suspects' rate.
    pub seconds_to_full: Option<f64>,
    /// Plain statements about the analysis.
    pub notes: Vec<String>,
    /// Why there is no verdict, when there is none: too few checkpoints, or
    /// one pass cut evenly. Every view says "no verdict" then, never that
    /// nothing grows.
    pub no_verdict: Option<String>,
    /// Pinned host memory over the checkpoints, judged on its own (never
    /// part of the suspects or of the device's bytes), when the snapshots
    /// recorded it. (Boxed, as `outside`: rarely there, and a fleet keeps
    /// a trend for each of thousands of ranks.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_host: Option<Box<PinnedHostTrend>>,
    /// Memory outside what the snapshots record (device memory beyond the
    /// allocator, the process's resident memory), when capture measured it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outside: Option<Box<Outside>>,
    /// Private pools with nothing in use at every checkpoint since they
    /// appeared (a CUDA graph left behind), largest first; snapshots only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub idle_private_pools: Vec<IdlePool>,
}

/// The live memory of one process's device, by site, at a series of
/// checkpoints: all the floor rule is judged on. The judge builds it from
/// one device's rows (`rows.rs`), whoever built those.
#[derive(Clone, Debug, Default)]
pub(crate) struct SiteSeries<'a> {
    /// The checkpoints, oldest first.
    pub points: Vec<Checkpoint>,
    /// Live blocks and bytes per site at each checkpoint.
    pub totals: Vec<FxHashMap<StackKey, SiteTotals>>,
    /// The snapshot and stack describing each site (any snapshot whose
    /// frames and stacks hold it: the one it was read from, or a store of
    /// stacks).
    pub sites: FxHashMap<StackKey, (&'a Snapshot, Option<StackId>)>,
    /// Sites with blocks allocated before recording began (traces only).
    pub before_recording: FxHashSet<StackKey>,
    /// Bytes allocated at the last checkpoint, as the allocator counts them
    /// (rounded); 0 when unknown, and the live bytes of the sites stand in.
    pub allocated_bytes: u64,
    /// Total device memory, when recorded.
    pub device_memory: Option<u64>,
    /// Pinned host memory at each checkpoint, when the snapshots recorded
    /// it; empty otherwise.
    pub pinned_host: Vec<Option<PinnedHost>>,
    /// Memory outside the recorded memory at each checkpoint, when capture
    /// measured it; empty otherwise.
    pub outside: Vec<Option<OutsidePoint>>,
}

/// The floor of `series`: at each point, the least value from there to the
/// end. A leak's floor keeps rising; activations that come and go do not
/// move it. The one definition, used by `trend` and by leak tests.
pub(crate) fn floor_of(series: &[u64]) -> Vec<u64> {
    let mut floor = vec![0u64; series.len()];
    let mut min = u64::MAX;
    for i in (0..series.len()).rev() {
        min = min.min(series[i]);
        floor[i] = min;
    }
    floor
}

/// The floor rule (see the module documentation): growth of the floor after
/// warm-up, if the site is a suspect.
fn floor_growth(series: &[u64], warmup: usize) -> Option<u64> {
    let n = series.len();
    if n < warmup + 3 || is_periodic(&series[warmup..]) {
        return None;
    }
    let floor = floor_of(series);
    let intervals = n - 1 - warmup;
    let risen: Vec<usize> = (warmup + 1..n)
        .filter(|&i| floor[i] > floor[i - 1])
        .collect();
    let growth = floor[n - 1] - floor[warmup];
    let often = risen.len() >= 2 && 3 * risen.len() >= intervals;
    (growth > 0 && (often || is_staircase(&risen, warmup, n - 1))).then_some(growth)
}

/// Rises a staircase needs at least: two or three separate one-time
/// allocations are not one.
const STAIRCASE_RISES: usize = 4;

/// Whether a floor that rose at checkpoints `risen`, after warm-up ended at
/// checkpoint `start` and up to checkpoint `end`, rose like a staircase: at
/// a steady period (the longest gap at most twice the shortest, which
/// allows epochs of uneven length), over the whole run.
fn is_staircase(risen: &[usize], start: usize, end: usize) -> bool {
    if risen.len() < STAIRCASE_RISES {
        return false;
    }
    let gaps = risen.windows(2).map(|w| w[1] - w[0]);
    let (shortest, longest) = gaps.fold((usize::MAX, 0), |(s, l), g| (s.min(g), l.max(g)));
    let (first, last) = (risen[0], risen[risen.len() - 1]);
    longest <= 2 * shortest && first - start <= longest && end - last <= longest
}

/// Whether `series` rises and then falls back to the lowest level it held
/// before: a site that empties and refills (activations, a cache that is
/// cleared) whose floor would rise only because the run stopped on a rising
/// edge. A leak never falls back to its floor.
fn is_periodic(series: &[u64]) -> bool {
    let Some((&first, rest)) = series.split_first() else {
        return false;
    };
    let (mut low, mut risen) = (first, false);
    for &v in rest {
        if v > low {
            risen = true;
        } else if risen {
            return true;
        } else {
            low = v;
        }
    }
    false
}

/// Judges `series` by the floor rule: what [`trend_named`] and
/// [`trend_trace`] give once their series is built.
pub(crate) fn trend_of_series(
    series: SiteSeries<'_>,
    source: CheckpointSource,
    options: &TrendOptions,
) -> Trend {
    let n = series.points.len();
    let warmup = options.warmup.min(n.saturating_sub(1));
    let mut keys: Vec<StackKey> = series
        .totals
        .iter()
        .flat_map(|t| t.keys().copied())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let seconds = match (
        series.points.get(warmup).and_then(|p| p.time_us),
        series.points.last().and_then(|p| p.time_us),
    ) {
        (Some(a), Some(b)) if b > a => Some((b - a) as f64 / 1e6),
        _ => None,
    };
    let steps = match (
        series.points.get(warmup).and_then(|p| p.step),
        series.points.last().and_then(|p| p.step),
    ) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    let mut suspects = Vec::new();
    // One namer per snapshot that describes a suspect, keyed by its address.
    let mut namers: FxHashMap<*const Snapshot, SiteNamer> = FxHashMap::default();
    for key in keys {
        let totals: Vec<SiteTotals> = series
            .totals
            .iter()
            .map(|t| t.get(&key).copied().unwrap_or_default())
            .collect();
        let bytes: Vec<u64> = totals.iter().map(|t| t.bytes).collect();
        let Some(growth) = floor_growth(&bytes, warmup) else {
            continue;
        };
        let (snap, stack) = series.sites[&key];
        suspects.push(Suspect {
            site: namers
                .entry(std::ptr::from_ref(snap))
                .or_insert_with(|| SiteNamer::new(snap, &options.rules))
                .site(key, stack),
            growth_bytes: growth,
            growth_per_checkpoint: growth / (n - 1 - warmup) as u64,
            growth_per_second: seconds.map(|s| growth as f64 / s),
            growth_per_step: steps.map(|s| growth as f64 / s as f64),
            floor: floor_of(&bytes),
            series: bytes,
            blocks: totals.iter().map(|t| t.blocks).collect(),
            before_recording: series.before_recording.contains(&key),
            device: None,
            held_by: Vec::new(),
        });
    }
    if !options.rules.rows_by_stack() {
        suspects = merge_rows(
            suspects,
            |s| culprit_line(&s.site),
            |s| (s.growth_bytes, s.site.key),
            merge_suspects,
        );
    }
    suspects.sort_by(|a, b| {
        b.growth_bytes
            .cmp(&a.growth_bytes)
            .then(a.site.key.cmp(&b.site.key))
    });
    let small = |s: &Suspect| {
        s.growth_per_step.unwrap_or(s.growth_per_checkpoint as f64) < SMALL_GROWTH_BYTES
    };
    let mut left_out = 0;
    if suspects.iter().any(|s| !small(s)) {
        let before = suspects.len();
        suspects.retain(|s| !small(s));
        left_out = before - suspects.len();
    }

    let no_verdict = (n < warmup + 3).then(|| {
        format!(
            "{n} checkpoints with {warmup} of warm-up are too few to tell a leak from a one-time \
             allocation; at least {} are needed",
            warmup + 3
        )
    });
    let mut notes: Vec<String> = no_verdict.iter().cloned().collect();
    if left_out > 0 {
        notes.push(format!(
            "{left_out} site{} growing less than 1 KiB a step left out beside larger growth",
            if left_out == 1 { "" } else { "s" }
        ));
    }
    // Iterations the trace itself showed, few of them: what grows is named,
    // as what it is.
    let found = match source {
        CheckpointSource::Calls => Some(n.saturating_sub(1)),
        CheckpointSource::Iterations => Some(n),
        _ => None,
    };
    if let Some(iterations) = found.filter(|&k| k <= FEW_ITERATIONS && !suspects.is_empty()) {
        notes.push(format!(
            "only {iterations} iterations found in the trace: a suspect, not a verdict; dumps at \
             more steps (snapdiff capture --every N) tell a leak from a slow warm-up"
        ));
    }
    // A trace without times (torch_npu writes none): said, not guessed.
    let cut_trace = !matches!(
        source,
        CheckpointSource::Snapshots | CheckpointSource::EvenlySpaced
    );
    if seconds.is_none() && cut_trace && no_verdict.is_none() && !suspects.is_empty() {
        notes.push(
            "the trace records no times (time_us): growth is given per step and by event \
             order, never per second, and the time until the device is full is left out"
                .to_owned(),
        );
    }
    let suspected_bytes = (suspects.iter()).fold(0u64, |sum, s| sum.saturating_add(s.growth_bytes));
    let growth_per_second = seconds.map(|s| suspected_bytes as f64 / s);
    let device_memory = options.device_memory.or(series.device_memory);
    // A trace without segments still says what was live at its end.
    let live_at_end: u64 = series
        .totals
        .last()
        .map_or(0, |t| t.values().map(|x| x.bytes).sum());
    let allocated_bytes = match series.allocated_bytes {
        0 => live_at_end,
        allocated => allocated,
    };
    // Each checkpoint's figure with its step, where every checkpoint has one.
    fn with_steps<T: Copy>(
        values: &[Option<T>],
        points: &[Checkpoint],
    ) -> Option<Vec<(Option<T>, Option<u64>)>> {
        (values.len() == points.len()).then(|| {
            values
                .iter()
                .copied()
                .zip(points.iter().map(|p| p.step))
                .collect()
        })
    }
    let pinned_host = with_steps(&series.pinned_host, &series.points)
        .and_then(|at| PinnedHostTrend::of(&at, warmup));
    let outside =
        with_steps(&series.outside, &series.points).and_then(|at| Outside::of(&at, warmup));
    let seconds_to_full = match (device_memory, growth_per_second) {
        (Some(total), Some(rate)) if rate > 0.0 => {
            Some(total.saturating_sub(allocated_bytes) as f64 / rate)
        }
        _ => None,
    };
    Trend {
        checkpoints: n,
        checkpoint_source: source,
        order: None,
        points: series.points,
        warmup,
        suspects,
        suspected_bytes,
        growth_per_second,
        device_memory,
        allocated_bytes,
        seconds_to_full,
        notes,
        no_verdict,
        pinned_host: pinned_host.map(Box::new),
        outside: outside.map(Box::new),
        idle_private_pools: Vec::new(),
    }
}

/// Judges `series`, one snapshot per checkpoint put in order `by` (see
/// [`snapshot_order`](crate::series_order::snapshot_order)), with a note when that order is not by step or time.
pub(crate) fn trend_of_snapshot_series(
    series: SiteSeries<'_>,
    by: SnapshotOrder,
    options: &TrendOptions,
) -> Trend {
    let several = series.points.len() > 1;
    let mut trend = trend_of_series(series, CheckpointSource::Snapshots, options);
    trend.order = Some(by);
    let note = match by {
        SnapshotOrder::Names => {
            "the snapshots record neither step nor time; they are ordered by file name \
             (numbers as numbers)"
        }
        SnapshotOrder::Given => {
            "the snapshots record neither step nor time; they are taken in the order given"
        }
        SnapshotOrder::Steps | SnapshotOrder::Times => "",
    };
    if several && !note.is_empty() {
        trend.notes.insert(0, note.to_owned());
    }
    trend
}

/// Total memory of the devices `snap` records, when it records all of them.
pub(crate) fn device_memory_of(snap: &Snapshot) -> Option<u64> {
    let known: Option<Vec<u64>> = snap.meta.devices.iter().map(|d| d.total_memory).collect();
    known.filter(|k| !k.is_empty()).map(|k| k.iter().sum())
}

#[cfg(test)]
mod tests {

    use super::floor_growth;

    #[test]
    fn the_floor_rule_tells_leaks_from_one_time_and_periodic_growth() {
        // A leak: steady growth.
        assert_eq!(floor_growth(&[0, 10, 20, 30, 40, 50], 1), Some(40));
        // A staircase: once every 4 checkpoints, over the whole run.
        let stairs: Vec<u64> = (0..48).map(|i| 100 + 10 * (i / 4)).collect();
        assert_eq!(floor_growth(&stairs, 1), Some(110));
        // Uneven epochs (3 to 5 checkpoints) still are one.
        let uneven = [
            0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4, 5, 5, 5, 5,
        ];
        assert_eq!(floor_growth(&uneven, 1), Some(5));
        // One-time allocations at three separate points are not.
        let three: Vec<u64> = (0..48)
            .map(|i| [i >= 10, i >= 25, i >= 40].iter().filter(|&&b| b).count() as u64)
            .collect();
        assert_eq!(floor_growth(&three, 1), None);
        // Nor are four rises bunched in the first half of a long run.
        let early: Vec<u64> = (0..48).map(|i| i.min(5) as u64).collect();
        assert_eq!(floor_growth(&early, 1), None);
        // Growth at every other checkpoint is still a leak.
        assert_eq!(floor_growth(&[0, 10, 10, 20, 20, 30], 1), Some(20));
        // A one-time allocation, during or after warm-up.
        assert_eq!(floor_growth(&[0, 100, 100, 100, 100], 1), None);
        assert_eq!(floor_growth(&[0, 0, 0, 100, 100, 100], 1), None);
        // Periodic rise and fall (activations).
        assert_eq!(floor_growth(&[0, 50, 0, 50, 0, 50, 0], 1), None);
        assert_eq!(floor_growth(&[10, 60, 10, 60, 10, 60], 1), None);
        // ... wherever the run stops: here on a rising edge, where the
        // floor of the last three checkpoints rises.
        assert_eq!(floor_growth(&[1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3], 1), None);
        // A leak with a dip that does not fall back to the floor.
        assert_eq!(
            floor_growth(&[0, 100, 200, 300, 290, 400, 500], 1),
            Some(400)
        );
        // A leak riding on a periodic site.
        assert_eq!(floor_growth(&[0, 50, 10, 60, 20, 70, 30], 1), Some(20));
        // Too few checkpoints.
        assert_eq!(floor_growth(&[0, 10, 20], 1), None);
    }
}
