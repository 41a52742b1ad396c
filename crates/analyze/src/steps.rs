//! A trace step by step: how memory moves inside each training step, and
//! what each step leaves behind.
//!
//! Steps are cut as `trend` cuts checkpoints (step marks, snapshot markers,
//! annotations, the iterations found in the trace, the low points between
//! them), but all of them, not a sample. One replay pass follows live
//! memory through every step: at its start, its highest point, what it
//! allocated and freed, and what it **retained** (live at its end less live
//! at its start), with the sites that retained it. A leak is a step that
//! retains; a steady job's steps retain nothing on average.

use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_format::DeviceName;
use snapdiff_format::{Action, Snapshot};

use crate::category::Categories;
use crate::culprit::CulpritRules;
use crate::cuts::step_cuts;
use crate::group::{Site, SiteNamer};
use crate::judge::trend_trace_with_keys;
use crate::peak::{CategoryTotal, PeakSite, live_breakdown};
use crate::replay::{LiveChange, replay, replay_with};
use crate::stack_key::{StackKey, StackKeys};
use crate::trend::{CheckpointSource, TrendOptions};

/// Sites named per step as what it retained.
const RETAINED_SITES: usize = 5;

/// Options of [`steps`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct StepsOptions {
    /// How culprits are chosen.
    pub rules: CulpritRules,
    /// A step whose peak to break down by category and site.
    pub detail: Option<u64>,
}

/// The steps of every device whose trace shows some.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Steps {
    /// One entry per busy device, by ordinal.
    pub devices: Vec<DeviceSteps>,
    /// Plain statements about the analysis.
    pub notes: Vec<String>,
}

/// One device's steps.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceSteps {
    /// Device ordinal.
    pub device: u32,
    /// How the steps were found.
    pub source: CheckpointSource,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// How much the steps' peak rose from the first step after warm-up to
    /// the last (negative: fell).
    pub peak_growth: i64,
    /// Of that, what the sites that keep growing (as `trend` finds them)
    /// gained between those two steps, when there are such sites.
    pub explained_by_growth: Option<i64>,
    /// The peak of the step asked for with [`StepsOptions::detail`].
    pub detail: Option<StepDetail>,
}

/// One step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    /// Its number: the program's step, or the iteration's index.
    pub step: u64,
    /// Events before it starts.
    pub start_event: usize,
    /// Events before it ends.
    pub end_event: usize,
    /// Bytes live at its start.
    pub start_bytes: u64,
    /// The most bytes live during it.
    pub peak_bytes: u64,
    /// Events replayed when the peak was reached.
    pub peak_event: usize,
    /// Bytes it allocated.
    pub allocated_bytes: u64,
    /// Bytes it freed.
    pub freed_bytes: u64,
    /// Bytes live at its end less at its start.
    pub retained_bytes: i64,
    /// The sites that retained the most, most first.
    pub retained_by: Vec<Retained>,
}

/// What one site retained in a step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Retained {
    /// The site.
    #[serde(flatten)]
    pub site: Site,
    /// Bytes it held more at the step's end than at its start.
    pub bytes: i64,
}

/// What was live at one step's peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepDetail {
    /// The step.
    pub step: u64,
    /// Bytes live at its peak.
    pub peak_bytes: u64,
    /// Live bytes by category, largest first.
    pub categories: Vec<CategoryTotal>,
    /// Live bytes by site, largest first.
    pub sites: Vec<PeakSite>,
}

/// Follows every busy device of `snap` step by step.
pub fn steps(snap: &Snapshot, options: &StepsOptions) -> Steps {
    let keys = StackKeys::new(snap);
    let namer = SiteNamer::new(snap, &options.rules);
    // Suspects by whole stack: their keys are matched with the replay's.
    let trend_options = TrendOptions {
        rules: options.rules.clone().with_rows_by_stack(true),
        ..TrendOptions::default()
    };
    let growing: Vec<StackKey> = trend_trace_with_keys(snap, &keys, &trend_options)
        .map(|t| t.suspects.iter().map(|s| s.site.key).collect())
        .unwrap_or_default();
    let mut notes = Vec::new();
    let mut devices = Vec::new();
    for (t, trace) in snap.traces.iter().enumerate() {
        if !trace.events.actions().any(|a| a == Action::Alloc) {
            continue;
        }
        let Some(cuts) = step_cuts(snap, &keys, t, usize::MAX).filter(|c| c.at.len() >= 2) else {
            notes.push(format!(
                "{}: no steps found (no step or snapshot markers, annotations or \
                 repeating iterations): one pass",
                DeviceName(trace.device)
            ));
            continue;
        };
        let labels: Vec<u64> = cuts
            .steps
            .clone()
            .unwrap_or_else(|| (0..cuts.at.len() as u64).collect());
        let mut follow = Follow::new(&cuts.at);
        let replayed = replay_with(snap, &keys, trace, &[], |c| follow.change(c));
        let raw = follow.finish(replayed.start_bytes);
        let name = |key: StackKey| namer.site(key, replayed.stacks.get(&key).copied().flatten());
        let steps: Vec<Step> = raw
            .iter()
            .enumerate()
            .map(|(k, r)| Step {
                step: labels[k],
                start_event: cuts.at[k],
                end_event: cuts.at[k + 1],
                start_bytes: r.start,
                peak_bytes: r.peak.0,
                peak_event: r.peak.1,
                allocated_bytes: r.allocated,
                freed_bytes: r.freed,
                retained_bytes: r.end as i64 - r.start as i64,
                retained_by: r
                    .retained_by()
                    .into_iter()
                    .map(|(key, bytes)| Retained {
                        site: name(key),
                        bytes,
                    })
                    .collect(),
            })
            .collect();
        // After one step of warm-up, as trend judges.
        let judged = &raw[raw.len().min(1)..];
        let peak_growth = match (judged.first(), judged.last()) {
            (Some(a), Some(b)) => b.peak.0 as i64 - a.peak.0 as i64,
            _ => 0,
        };
        // What the growing sites gained between those two peaks: over the
        // steps after the first judged one.
        let explained_by_growth = (!growing.is_empty()).then(|| {
            judged
                .iter()
                .skip(1)
                .flat_map(|r| &r.sites)
                .filter(|(key, _)| growing.contains(key))
                .map(|(_, &bytes)| bytes)
                .sum()
        });
        let detail = options.detail.and_then(|wanted| {
            let k = labels.iter().position(|&l| l == wanted)?;
            let at = replay(snap, &keys, trace, &[raw[k].peak.1]);
            let categories = Categories::new(snap);
            let (categories, sites) = live_breakdown(&at, &namer, &categories);
            Some(StepDetail {
                step: wanted,
                peak_bytes: raw[k].peak.0,
                categories,
                sites,
            })
        });
        if let (Some(wanted), None) = (options.detail, &detail) {
            notes.push(format!("{}: no step {wanted}", DeviceName(trace.device)));
        }
        devices.push(DeviceSteps {
            device: trace.device,
            source: cuts.source,
            steps,
            peak_growth,
            explained_by_growth,
            detail,
        });
    }
    Steps { devices, notes }
}

/// One step as the replay follows it.
#[derive(Clone, Debug, Default)]
struct RawStep {
    start: u64,
    end: u64,
    /// Bytes and the event count after which they were reached.
    peak: (u64, usize),
    allocated: u64,
    freed: u64,
    /// Net bytes per site over the step.
    sites: FxHashMap<StackKey, i64>,
}

impl RawStep {
    /// The sites that held more at the end, most first.
    fn retained_by(&self) -> Vec<(StackKey, i64)> {
        let mut kept: Vec<(StackKey, i64)> = self
            .sites
            .iter()
            .filter(|&(_, &b)| b > 0)
            .map(|(&k, &b)| (k, b))
            .collect();
        kept.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        kept.truncate(RETAINED_SITES);
        kept
    }
}

/// Splits the replay's changes of live memory into steps. A step is opened
/// at every boundary, the last one too (what follows the last boundary is
/// dropped at the end).
struct Follow<'a> {
    /// Step boundaries, as event counts.
    cuts: &'a [usize],
    steps: Vec<RawStep>,
    /// Live bytes after the last change seen.
    live: Option<u64>,
}

impl<'a> Follow<'a> {
    fn new(cuts: &'a [usize]) -> Follow<'a> {
        Follow {
            cuts,
            steps: Vec::with_capacity(cuts.len()),
            live: None,
        }
    }

    /// Opens the steps whose boundaries are at or before `event`, each from
    /// `live` bytes, and ends the one before each.
    fn reach(&mut self, event: usize, live: u64) {
        while let Some(&boundary) = self.cuts.get(self.steps.len())
            && boundary <= event
        {
            if let Some(last) = self.steps.last_mut() {
                last.end = live;
            }
            self.steps.push(RawStep {
                start: live,
                end: live,
                peak: (live, boundary),
                ..RawStep::default()
            });
        }
    }

    fn change(&mut self, c: LiveChange) {
        let before = (c.live_bytes as i64 - c.bytes) as u64;
        self.reach(c.event, before);
        self.live = Some(c.live_bytes);
        let Some(step) = self.steps.last_mut() else {
            return;
        };
        if c.bytes > 0 {
            step.allocated += c.bytes as u64;
        } else {
            step.freed += c.bytes.unsigned_abs();
        }
        *step.sites.entry(c.site).or_default() += c.bytes;
        if c.live_bytes > step.peak.0 {
            step.peak = (c.live_bytes, c.event + 1);
        }
        step.end = c.live_bytes;
    }

    /// The steps between the boundaries.
    fn finish(mut self, start_bytes: u64) -> Vec<RawStep> {
        let live = self.live.unwrap_or(start_bytes);
        self.reach(usize::MAX, live);
        self.steps.truncate(self.cuts.len().saturating_sub(1));
        self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(event: usize, site: u64, bytes: i64, live_bytes: u64) -> LiveChange {
        LiveChange {
            event,
            site: StackKey(site),
            bytes,
            live_bytes,
        }
    }

    #[test]
    fn steps_split_at_their_boundaries() {
        // Boundaries after 2 and 5 events, and the end at 8: two steps.
        let cuts = [2, 5, 8];
        let mut follow = Follow::new(&cuts);
        // Before the first step: 100 live.
        follow.change(change(0, 1, 100, 100));
        // Step one (events 2-4): +50 at site 2, freed again, +30 at site 3.
        follow.change(change(2, 2, 50, 150));
        follow.change(change(3, 2, -50, 100));
        follow.change(change(4, 3, 30, 130));
        // Step two (events 5-7): nothing until event 6, which frees site 3.
        follow.change(change(6, 3, -30, 100));
        // After the end: not counted.
        follow.change(change(9, 4, 999, 1099));
        let steps = follow.finish(0);
        assert_eq!(steps.len(), 2);
        let (one, two) = (&steps[0], &steps[1]);
        assert_eq!((one.start, one.end, one.peak), (100, 130, (150, 3)));
        assert_eq!((one.allocated, one.freed), (80, 50));
        assert_eq!(one.retained_by(), [(StackKey(3), 30)]);
        assert_eq!((two.start, two.end, two.peak), (130, 100, (130, 5)));
        assert!(two.retained_by().is_empty());
    }
}
