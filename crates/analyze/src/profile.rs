//! Live memory by stack at one moment: what flame graphs and pprof files
//! draw.
//!
//! The moment is the snapshot's own (its live blocks), or a point of its
//! trace: after a number of events, or at the peak. Each site comes with
//! its frames (allocator, interpreter and dispatcher frames left out, as
//! everywhere) so that a picture shows the program's own call paths.

use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_format::{Action, Snapshot, StackId};

use crate::culprit::CulpritRules;
use crate::cuts::step_cuts;
use crate::error::TraceError;
use crate::group::{Site, SiteNamer, SiteTotals, live_groups};
use crate::replay::{highest_at, replay_to};
use crate::stack_key::{StackKey, StackKeys};

/// When to take the live memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveMoment {
    /// When the snapshot was taken: its live blocks.
    End,
    /// After this many events of each busy device's trace.
    Event(usize),
    /// At each busy device's highest point.
    Peak,
    /// At the start of this step (as `steps` numbers them) of each busy
    /// device's trace.
    Step(u64),
}

/// One site's live memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteBytes {
    /// The site, with its frames.
    #[serde(flatten)]
    pub site: Site,
    /// Live blocks.
    pub blocks: u64,
    /// Live bytes (requested sizes).
    pub bytes: u64,
}

/// The live memory of `snap` at `moment`, by site, most bytes first.
///
/// # Errors
///
/// When `moment` is a point of the trace and no trace allocates.
pub fn live_by_site(
    snap: &Snapshot,
    rules: &CulpritRules,
    moment: LiveMoment,
) -> Result<Vec<SiteBytes>, TraceError> {
    let keys = StackKeys::new(snap);
    let namer = SiteNamer::keyed(snap, &keys, rules);
    let mut totals: FxHashMap<StackKey, (SiteTotals, Option<StackId>)> = FxHashMap::default();
    if moment == LiveMoment::End {
        let groups = live_groups(snap, &keys);
        for (key, t) in groups.totals {
            totals.insert(key, (t, groups.stacks.get(&key).copied().flatten()));
        }
    } else {
        let busy: Vec<_> = snap
            .traces
            .iter()
            .enumerate()
            .filter(|(_, t)| t.events.actions().any(|a| a == Action::Alloc))
            .collect();
        if busy.is_empty() {
            return Err(TraceError::NoPointToShow);
        }
        for (index, trace) in busy {
            let at = match moment {
                LiveMoment::Event(n) => n.min(trace.events.len()),
                LiveMoment::Step(step) => step_start(snap, &keys, index, step)?,
                _ => highest_at(trace),
            };
            let replayed = replay_to(snap, &keys, trace, at);
            for (key, t) in &replayed.points[0] {
                let stack = replayed.stacks.get(key).copied().flatten();
                let entry = totals.entry(*key).or_insert((SiteTotals::default(), stack));
                entry.0.merge(*t);
            }
        }
    }
    let mut sites: Vec<SiteBytes> = totals
        .into_iter()
        .map(|(key, (t, stack))| SiteBytes {
            site: namer.site(key, stack),
            blocks: t.blocks,
            bytes: t.bytes,
        })
        .collect();
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.key.cmp(&b.site.key)));
    Ok(sites)
}

/// The event count at which step `step` of trace `index` starts.
fn step_start(
    snap: &Snapshot,
    keys: &StackKeys,
    index: usize,
    step: u64,
) -> Result<usize, TraceError> {
    let device = snap.traces[index].device;
    let cuts = step_cuts(snap, keys, index, usize::MAX).ok_or(TraceError::NoSteps { device })?;
    let labels = cuts
        .steps
        .unwrap_or_else(|| (0..cuts.at.len() as u64).collect());
    let k = labels
        .iter()
        .position(|&l| l == step)
        .ok_or(TraceError::NoSuchStep {
            device,
            step,
            first: labels.first().copied().unwrap_or(0),
            last: labels.last().copied().unwrap_or(0),
        })?;
    Ok(cuts.at[k])
}
