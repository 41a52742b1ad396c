//! The verdict on one process, as every caller gives it: `trend`, `report`
//! and `capture` on files, the Rust `snapdiff::trend_files`, the fleet and
//! `watch` on each rank.
//!
//! [`judge()`] is the judge: one device's [`DeviceRows`] in (see
//! [`rows`](crate::rows)), whoever built them; exit dumps left out among
//! enough others (by their names), the checkpoints put in order, the floor
//! rule applied, and each suspect's "held by" filled in. [`judge_dumps`]
//! brings a process's snapshots to it: one dump (exit dumps left out) is
//! judged by its trace, cut into checkpoints; several, a checkpoint each.

use rustc_hash::FxHashMap;
use snapdiff_format::{DeviceName, Owners, PINNED_HOST_DEVICE, Snapshot, StackId};

use crate::error::TraceError;
use crate::group::{culprit_line, describe_site};
use crate::held_by::{CulpritLine, SiteOwners, owners_by_site};
use crate::outside::OutsidePoint;
use crate::private_pools::idle_private_pools;
use crate::rows::{DeviceRows, Devices, ProcessRows, SiteStacks};
use crate::series_order::{
    NamedSnapshot, OrderKey, SnapshotOrder, snapshot_order, without_exit_dumps,
};
use crate::stack_key::{StackKey, StackKeys};
use crate::trend::{
    Checkpoint, CheckpointSource, SiteSeries, Trend, TrendOptions, trend_of_series,
    trend_of_snapshot_series,
};

/// A verdict, and the checkpoints it was judged on.
#[derive(Debug)]
pub struct Judged {
    /// The trend, suspects' owners filled in.
    pub trend: Trend,
    /// The checkpoints judged, by their index in the order given, in the
    /// order judged (exit dumps left out).
    pub order: Vec<usize>,
}

impl Judged {
    /// The index of the last checkpoint judged, in the order given: the
    /// dump a report describes. `None` when none was.
    pub fn last(&self) -> Option<usize> {
        self.order.last().copied()
    }
}

/// Where the judge finds a site's frames: the snapshot holding its stack,
/// and the stack's id there.
pub type Describe<'a, 'b> = &'b dyn Fn(StackKey) -> Option<(&'a Snapshot, Option<StackId>)>;

/// Judges one device's `rows`: exit dumps left out among enough others
/// (told by their file names), checkpoints in order (by step, else time,
/// else name), the floor rule, then each suspect's owners from
/// `owners_at(i)`, what kept the sites' blocks alive at checkpoint `i` of
/// `rows` (asked for at most two checkpoints, and only when there are
/// suspects). Sites are described from `describe`. Rows cut from a trace
/// are judged in their own order, with what their cut says.
pub fn judge<'a>(
    rows: &DeviceRows,
    describe: Describe<'a, '_>,
    owners_at: &mut dyn FnMut(usize) -> Option<SiteOwners>,
    options: &TrendOptions,
) -> Judged {
    let n = rows.checkpoints.len();
    let (order, by, exit_note) = match rows.cut {
        Some(_) => ((0..n).collect(), None, None),
        None => {
            let names: Vec<&str> = rows.checkpoints.iter().map(|c| c.file_name()).collect();
            let (keep, exit_note) = without_exit_dumps(&names);
            let kept: Vec<usize> = (0..n).filter(|&i| keep[i]).collect();
            let keys: Vec<OrderKey<'_>> = kept
                .iter()
                .map(|&i| OrderKey {
                    step: rows.checkpoints[i].step,
                    time_us: rows.checkpoints[i].time_us,
                    name: names[i],
                })
                .collect();
            let (order, by) = snapshot_order(&keys);
            (
                order.iter().map(|&k| kept[k]).collect::<Vec<_>>(),
                Some(by),
                exit_note,
            )
        }
    };
    let series = series_of(rows, &order, describe);
    let mut trend = match by {
        None => judge_cut(rows, series, options),
        Some(by) => judge_series(series, by, |k| owners_at(order[k]), options),
    };
    trend.notes.extend(exit_note);
    Judged { trend, order }
}

/// The series the floor rule judges: `rows`' checkpoints in `order`.
fn series_of<'a>(rows: &DeviceRows, order: &[usize], describe: Describe<'a, '_>) -> SiteSeries<'a> {
    let at = |i: usize| &rows.checkpoints[i];
    let last = order.last().map(|&i| at(i));
    let mut sites = FxHashMap::default();
    for &i in order {
        for row in &rows.sites[i] {
            if let std::collections::hash_map::Entry::Vacant(site) = sites.entry(row.key)
                && let Some(described) = describe(row.key)
            {
                site.insert(described);
            }
        }
    }
    SiteSeries {
        points: order
            .iter()
            .map(|&i| Checkpoint {
                time_us: at(i).time_us,
                step: at(i).step,
                event_index: at(i).event_index,
            })
            .collect(),
        totals: order
            .iter()
            .map(|&i| rows.sites[i].iter().map(|r| (r.key, r.totals)).collect())
            .collect(),
        sites,
        before_recording: rows
            .cut
            .as_ref()
            .map(|cut| cut.before_recording.clone())
            .unwrap_or_default(),
        allocated_bytes: last.map_or(0, |c| c.allocated_bytes),
        device_memory: last.and_then(|c| c.device_memory),
        pinned_host: order.iter().map(|&i| at(i).pinned_host).collect(),
        outside: order
            .iter()
            .map(|&i| at(i).outside(rows.device))
            .collect::<Vec<Option<OutsidePoint>>>(),
    }
}

/// Judges rows cut from one trace: the floor rule, with what the cut says.
fn judge_cut(rows: &DeviceRows, series: SiteSeries<'_>, options: &TrendOptions) -> Trend {
    let cut = rows.cut.as_ref().expect("rows cut from a trace");
    let mut trend = trend_of_series(series, cut.source, options);
    if cut.freed_unseen > 0 {
        trend.notes.push(format!(
            "{}'s trace frees {} block{} it never saw allocated: recording \
             began mid-run, or the trace's ring buffer (max_entries) wrapped; only the recorded \
             window is judged; a site holding blocks from before it says \"some blocks older than \
             the trace\", and they never count as growth",
            cut.device_name,
            cut.freed_unseen,
            if cut.freed_unseen == 1 { "" } else { "s" }
        ));
    }
    if cut.source == CheckpointSource::EvenlySpaced {
        // Evenly spaced cuts fall at different phases of different steps, so
        // a working set that is still being built looks like growth.
        trend.suspects.clear();
        trend.suspected_bytes = 0;
        trend.growth_per_second = trend.growth_per_second.map(|_| 0.0);
        trend.seconds_to_full = None;
        let why = "no verdict: one pass, not enough iterations to tell a leak from the working \
                   set (the trace has no step or snapshot markers, and its memory never falls \
                   back between iterations); dump snapshots at several steps (snapdiff capture \
                   --every N) or mark steps";
        trend.notes.insert(0, why.to_owned());
        trend.no_verdict = Some(why.to_owned());
    }
    trend
}

/// Judges one process's `dumps` (see the module documentation).
/// `owners_of(i)` gives what the owners file of dump `i` says, if there is
/// one; it is asked for at most two dumps, and only when there are
/// suspects.
///
/// # Errors
///
/// When there is one dump and its trace records no allocation.
///
/// # Panics
///
/// When `dumps` is empty.
pub fn judge_dumps(
    dumps: &[NamedSnapshot<'_>],
    owners_of: impl FnMut(usize) -> Option<Owners>,
    options: &TrendOptions,
) -> Result<Judged, TraceError> {
    judge_keyed_dumps(dumps, &[], owners_of, options)
}

/// [`judge_dumps`] where `keys` holds the stack keys of the dumps'
/// snapshots, by index, worked out already (for a caller that also finds
/// their peaks); any it does not hold are worked out where needed.
///
/// # Errors
///
/// As [`judge_dumps`].
///
/// # Panics
///
/// When `dumps` is empty.
pub fn judge_keyed_dumps(
    dumps: &[NamedSnapshot<'_>],
    keys: &[StackKeys],
    mut owners_of: impl FnMut(usize) -> Option<Owners>,
    options: &TrendOptions,
) -> Result<Judged, TraceError> {
    assert!(!dumps.is_empty(), "a process has dumps");
    let names: Vec<&str> = dumps.iter().map(|d| d.name).collect();
    let (keep, exit_note) = without_exit_dumps(&names);
    let kept: Vec<usize> = (0..dumps.len()).filter(|&i| keep[i]).collect();
    if let [only] = kept[..] {
        let snap = dumps[only].snapshot;
        let worked_out;
        let keys = match keys.get(only) {
            Some(keys) => keys,
            None => {
                worked_out = StackKeys::new(snap);
                &worked_out
            }
        };
        let mut trend = judge_trace(snap, keys, options)?;
        trend.notes.extend(exit_note);
        return Ok(Judged {
            trend,
            order: vec![only],
        });
    }
    let mut owners_at =
        |i: usize| owners_of(i).map(|owners| owners_by_site(dumps[i].snapshot, &owners));
    Ok(judge_snapshots(dumps, &mut owners_at, options))
}

/// Judges `dumps`, one process's snapshots, a checkpoint each, all its
/// devices as one (see [`Devices::AsOne`]); `owners_at(i)`: as in
/// [`judge()`], by index in `dumps`.
pub(crate) fn judge_snapshots(
    dumps: &[NamedSnapshot<'_>],
    owners_at: &mut dyn FnMut(usize) -> Option<SiteOwners>,
    options: &TrendOptions,
) -> Judged {
    use rayon::prelude::*;
    let read: Vec<(ProcessRows, SiteStacks)> = dumps
        .par_iter()
        .map(|d| {
            let mut rows = ProcessRows::new("");
            let stacks = rows.add_snapshot(d.name, d.snapshot, None, Devices::AsOne);
            (rows, stacks)
        })
        .collect();
    let mut sites: FxHashMap<StackKey, (&Snapshot, Option<StackId>)> = FxHashMap::default();
    let mut rows = ProcessRows::new("");
    for ((one, stacks), dump) in read.into_iter().zip(dumps) {
        for (key, stack) in stacks {
            sites.insert(key, (dump.snapshot, stack));
        }
        rows.append(one);
    }
    let device = rows.device_mut(0);
    let describe = |key: StackKey| sites.get(&key).copied();
    let mut judged = judge(device, &describe, owners_at, options);
    let in_order: Vec<&Snapshot> = judged.order.iter().map(|&i| dumps[i].snapshot).collect();
    judged.trend.idle_private_pools = idle_private_pools(&in_order);
    judged
}

/// Judges the trace of one snapshot (its stack keys `keys`), each busy
/// device's cut into checkpoints and judged on its own, their verdicts
/// told together.
///
/// # Errors
///
/// When the snapshot recorded no allocation in its traces.
pub(crate) fn judge_trace(
    snap: &Snapshot,
    keys: &StackKeys,
    options: &TrendOptions,
) -> Result<Trend, TraceError> {
    let mut rows = ProcessRows::new("");
    let stacks: FxHashMap<StackKey, Option<StackId>> = rows
        .add_trace("", snap, keys, options)?
        .into_iter()
        .collect();
    let describe = |key: StackKey| Some((snap, stacks.get(&key).copied().flatten()));
    let several = rows.devices.len() > 1;
    let trends = rows
        .devices
        .iter()
        .map(|device| {
            let mut trend = judge(device, &describe, &mut |_| None, options).trend;
            if several {
                // Each device's verdict is its own: its suspects and notes
                // say whose they are.
                for s in &mut trend.suspects {
                    s.device = Some(device.device);
                }
                let name = DeviceName(device.device).to_string();
                for note in trend.notes.iter_mut().filter(|n| !n.starts_with(&name)) {
                    *note = format!("{name}: {note}");
                }
            }
            trend
        })
        .collect();
    Ok(merge_device_trends(snap, trends))
}

/// Judges `series`, its checkpoints put in order `by` (see
/// [`snapshot_order`](crate::series_order::snapshot_order)), and fills in
/// each suspect's `held_by` from `owners_at(k)`, the owners by site at
/// checkpoint `k` (asked for the last checkpoint and the one at the end of
/// warm-up, and only when there are suspects).
fn judge_series(
    series: SiteSeries<'_>,
    by: SnapshotOrder,
    mut owners_at: impl FnMut(usize) -> Option<SiteOwners>,
    options: &TrendOptions,
) -> Trend {
    let sites = series.sites.clone();
    let checkpoints = series.points.len();
    let mut trend = trend_of_snapshot_series(series, by, options);
    if trend.suspects.is_empty() || checkpoints == 0 {
        return trend;
    }
    let Some(at_last) = owners_at(checkpoints - 1) else {
        return trend;
    };
    let at_warmup = owners_at(trend.warmup.min(checkpoints - 1));
    // Each site's culprit line, worked out once, from the snapshot that
    // describes it.
    let mut lines: FxHashMap<StackKey, CulpritLine> = FxHashMap::default();
    let line_of = |key: StackKey| {
        let &(snap, stack) = sites.get(&key)?;
        let line = lines
            .entry(key)
            .or_insert_with(|| culprit_line(&describe_site(snap, key, stack, &options.rules)));
        Some(line.clone())
    };
    // How many blocks each owner gained a step needs the steps between.
    let warm = trend.warmup.min(trend.points.len().saturating_sub(1));
    let steps = match (
        trend.points.get(warm).and_then(|p| p.step),
        trend.points.last().and_then(|p| p.step),
    ) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    let rows = trend.suspects.iter_mut().map(|s| (&s.site, &mut s.held_by));
    let rules = &options.rules;
    crate::held_by::fill(rows, &at_last, at_warmup.as_ref(), steps, rules, line_of);
    trend
}

/// The trend over several snapshots of one job, ordered by their step if
/// all have one, else by their time if all have one, else as given.
pub fn trend_snapshots(snaps: &[Snapshot], options: &TrendOptions) -> Trend {
    let named: Vec<NamedSnapshot<'_>> = snaps
        .iter()
        .map(|snapshot| NamedSnapshot { name: "", snapshot })
        .collect();
    trend_named(&named, options)
}

/// The trend over several named snapshots of one job (exit dumps, told by
/// their names, left out among three or more others), ordered by their step
/// if all have one, else by their time if all have one, else by name with
/// numbers compared as numbers; [`Trend::order`] says which, with a note
/// when it is not by step or time.
pub fn trend_named(snaps: &[NamedSnapshot<'_>], options: &TrendOptions) -> Trend {
    judge_snapshots(snaps, &mut |_| None, options).trend
}

/// The trend within one snapshot's trace, cut into checkpoints.
///
/// Each device's trace is cut and judged on its own: devices run their own
/// streams and steps, so a cut of one says nothing about another. A device
/// whose trace holds no allocation (an idle GPU, with only markers or
/// nothing) is left out and changes nothing. With several busy devices the
/// suspects of each are reported together.
///
/// # Errors
///
/// When the snapshot recorded no allocation in its traces.
pub fn trend_trace(snap: &Snapshot, options: &TrendOptions) -> Result<Trend, TraceError> {
    judge_trace(snap, &StackKeys::new(snap), options)
}

/// [`trend_trace`] with `snap`'s stack keys already computed, for analyses
/// that need them too (a snapshot of 20,000 deep stacks takes 40 ms).
pub(crate) fn trend_trace_with_keys(
    snap: &Snapshot,
    keys: &StackKeys,
    options: &TrendOptions,
) -> Result<Trend, TraceError> {
    judge_trace(snap, keys, options)
}

/// The verdicts of `snap`'s busy devices, each judged on its own, told as
/// one: the first device's checkpoints, every device's suspects, and a
/// note of the devices judged and of those left idle.
pub(crate) fn merge_device_trends(snap: &Snapshot, mut trends: Vec<Trend>) -> Trend {
    let busy = crate::rows::busy_traces(snap);
    let mut idle: Vec<String> = (0..snap.traces.len())
        .filter(|i| {
            let trace = &snap.traces[*i];
            !busy.contains(i) && trace.device != PINNED_HOST_DEVICE && !trace.events.is_empty()
        })
        .map(|i| snap.traces[i].device.to_string())
        .collect();
    idle.dedup();
    let mut trend = trends.remove(0);
    for other in trends {
        trend.suspected_bytes = trend.suspected_bytes.saturating_add(other.suspected_bytes);
        trend.growth_per_second = match (trend.growth_per_second, other.growth_per_second) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        trend.suspects.extend(other.suspects);
        trend.notes.extend(other.notes);
    }
    if busy.len() > 1 {
        trend.suspects.sort_by(|a, b| {
            b.growth_bytes
                .cmp(&a.growth_bytes)
                .then(a.site.key.cmp(&b.site.key))
        });
        let devices: Vec<String> = busy
            .iter()
            .map(|&t| snap.traces[t].device.to_string())
            .collect();
        trend.notes.insert(
            0,
            format!(
                "devices {} were each cut and judged on their own; the checkpoints shown are \
                 device {}'s",
                devices.join(", "),
                devices[0]
            ),
        );
    }
    if !idle.is_empty() {
        trend.notes.push(format!(
            "device{} {} recorded no allocation and {} left out",
            if idle.len() == 1 { "" } else { "s" },
            idle.join(", "),
            if idle.len() == 1 { "is" } else { "are" }
        ));
    }
    trend
}
