//! The verdict on one process's checkpoints, as every caller gives it:
//! `trend`, `report` and `capture` on files, the Rust
//! `snapdiff::trend_files`, and the fleet on each rank's site tables.
//!
//! [`judge_series`] is the judge: checkpoints in order and the owners
//! files' sites in, the trend with each suspect's "held by" out.
//! [`judge_dumps`] brings a process's dumps to it: exit dumps are left out
//! among enough others (by their names); one dump is judged by its trace,
//! several as checkpoints in order. The fleet brings site tables to it.

use rustc_hash::FxHashMap;
use snapdiff_format::Owners;

use crate::error::TraceError;
use crate::group::{culprit_line, describe_site};
use crate::held_by::{CulpritLine, SiteOwners, add_held_by, owners_by_site};
use crate::series_order::{NamedSnapshot, SnapshotOrder, without_exit_dumps};
use crate::stack_key::StackKey;
use crate::trend::{
    SiteSeries, Trend, TrendOptions, judge_named, trend_of_snapshot_series, trend_trace,
};

/// A process's verdict, and which dump was its last checkpoint.
#[derive(Debug)]
pub struct Judged {
    /// The trend, suspects' owners filled in.
    pub trend: Trend,
    /// The index, among the dumps judged, of the last checkpoint in order
    /// (exit dumps left out): the dump a report describes.
    pub last: usize,
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
    mut owners_of: impl FnMut(usize) -> Option<Owners>,
    options: &TrendOptions,
) -> Result<Judged, TraceError> {
    assert!(!dumps.is_empty(), "a process has dumps");
    let names: Vec<&str> = dumps.iter().map(|d| d.name).collect();
    let (keep, exit_note) = without_exit_dumps(&names);
    let kept: Vec<usize> = (0..dumps.len()).filter(|&i| keep[i]).collect();
    if let [only] = kept[..] {
        let mut trend = trend_trace(dumps[only].snapshot, options)?;
        trend.notes.extend(exit_note);
        return Ok(Judged { trend, last: only });
    }
    let mut owners_at =
        |i: usize| owners_of(i).map(|owners| owners_by_site(dumps[i].snapshot, &owners));
    let (trend, last) = judge_named(dumps, &mut owners_at, options);
    Ok(Judged {
        trend,
        last: last.expect("two or more dumps"),
    })
}

/// Judges `series`, its checkpoints put in order `by` (see
/// [`snapshot_order`](crate::series_order::snapshot_order)), and fills in
/// each suspect's `held_by` from `owners_at(k)`, the owners by site at
/// checkpoint `k` (asked for the last checkpoint and the one at the end of
/// warm-up, and only when there are suspects).
pub fn judge_series(
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
    add_held_by(
        &mut trend,
        &at_last,
        at_warmup.as_ref(),
        &options.rules,
        line_of,
    );
    trend
}
