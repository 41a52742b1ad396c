//! The verdict on one process's dumps, as every caller gives it: `trend`,
//! `report` and `capture` on files, and the Rust `snapdiff::trend_files`.
//!
//! Exit dumps are left out among enough others (by their names); one dump
//! is judged by its trace, several as checkpoints in order; the suspects'
//! owners come from the owners files of the last checkpoint and the one at
//! the end of warm-up, when the job wrote them.

use snapdiff_format::Owners;

use crate::error::TraceError;
use crate::held_by::{SiteLines, add_held_by, owners_by_site};
use crate::series_order::{NamedSnapshot, named_order, without_exit_dumps};
use crate::trend::{Trend, TrendOptions, trend_named, trend_trace};

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
    let mut judged = if let [only] = kept[..] {
        Judged {
            trend: trend_trace(dumps[only].snapshot, options)?,
            last: only,
        }
    } else {
        let named: Vec<NamedSnapshot<'_>> = kept.iter().map(|&i| dumps[i]).collect();
        let mut trend = trend_named(&named, options);
        let (order, _) = named_order(&named);
        let in_order: Vec<usize> = order.iter().map(|&i| kept[i]).collect();
        add_owners(&mut trend, dumps, &in_order, &mut owners_of, options);
        Judged {
            trend,
            last: *in_order.last().expect("two or more dumps"),
        }
    };
    judged.trend.notes.extend(exit_note);
    Ok(judged)
}

/// Fills in each suspect's `held_by` from the owners of the last
/// checkpoint and of the one at the end of warm-up; `in_order` are the
/// checkpoints' dumps, in order.
fn add_owners(
    trend: &mut Trend,
    dumps: &[NamedSnapshot<'_>],
    in_order: &[usize],
    owners_of: &mut impl FnMut(usize) -> Option<Owners>,
    options: &TrendOptions,
) {
    let Some(&last) = in_order.last() else {
        return;
    };
    if trend.suspects.is_empty() {
        return;
    }
    let Some(owners) = owners_of(last) else {
        return;
    };
    let last_snap = dumps[last].snapshot;
    let at_last = owners_by_site(last_snap, &owners);
    let warm = in_order[trend.warmup.min(in_order.len() - 1)];
    let warm_snap = dumps[warm].snapshot;
    let at_warmup = owners_of(warm).map(|o| owners_by_site(warm_snap, &o));
    let mut lines = SiteLines::new(&[last_snap, warm_snap], &options.rules);
    add_held_by(trend, &at_last, at_warmup.as_ref(), &options.rules, |key| {
        lines.line(key)
    });
}
