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
use crate::group::{Site, SiteNamer, Totals, live_groups};
use crate::replay::replay;
use crate::stack_key::{StackKey, StackKeys};

/// When to take the live memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
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
    moment: Moment,
) -> Result<Vec<SiteBytes>, String> {
    let keys = StackKeys::new(snap);
    let namer = SiteNamer::new(snap, rules);
    let mut totals: FxHashMap<StackKey, (Totals, Option<StackId>)> = FxHashMap::default();
    if moment == Moment::End {
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
            return Err(
                "no trace allocates, so there is no point of a trace to show; leave out --at to \
                 show the snapshot's live blocks"
                    .to_owned(),
            );
        }
        for (index, trace) in busy {
            let at = match moment {
                Moment::Event(n) => n.min(trace.events.len()),
                Moment::Step(step) => step_start(snap, &keys, index, step)?,
                _ => replay(snap, &keys, trace, &[]).highest.1,
            };
            let replayed = replay(snap, &keys, trace, &[at]);
            for (key, t) in &replayed.points[0] {
                let stack = replayed.stacks.get(key).copied().flatten();
                let entry = totals.entry(*key).or_insert((Totals::default(), stack));
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
fn step_start(snap: &Snapshot, keys: &StackKeys, index: usize, step: u64) -> Result<usize, String> {
    let cuts = step_cuts(snap, keys, index, usize::MAX).ok_or_else(|| {
        format!(
            "device {}'s trace shows no steps (no step or snapshot markers, annotations or \
             repeating iterations)",
            snap.traces[index].device
        )
    })?;
    let labels = cuts
        .steps
        .unwrap_or_else(|| (0..cuts.at.len() as u64).collect());
    let k = labels.iter().position(|&l| l == step).ok_or_else(|| {
        format!(
            "device {}'s trace has no step {step} (its steps are {} to {})",
            snap.traces[index].device,
            labels.first().unwrap_or(&0),
            labels.last().unwrap_or(&0)
        )
    })?;
    Ok(cuts.at[k])
}
