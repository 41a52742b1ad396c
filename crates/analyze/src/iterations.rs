//! Finding a training loop's iterations in a trace without markers.
//!
//! A loop allocates at the same sites in the same order every iteration, so
//! the sequence of its allocations' stack keys repeats with the loop's
//! period. The period is the lag at which the sequence best matches itself;
//! every iteration is then cut at the same phase, the point of the period
//! where live memory is lowest on average, so that each checkpoint sees the
//! same part of the working set and only what outlives an iteration adds up.
//!
//! A lag can also match inside one pass (the layers of a model repeat), but
//! a layer's allocations outlive it (activations saved for backward) where
//! an iteration's do not; a lag whose windows keep most of their bytes past
//! the next window is not an iteration.

use rustc_hash::FxHashMap;
use snapdiff_format::{BlockAction, Events};

use crate::stack_key::{StackKey, StackKeys};

/// An allocation: its event index, and its site, numbered densely by stack
/// key so that the passes below index arrays instead of hashing keys.
type Alloc = (usize, u32);

/// At least this share of sampled allocations must match one period later.
const MIN_MATCH: f64 = 0.9;
/// Lags matching within this much of the best are equal; the shortest wins.
const MATCH_TIE: f64 = 0.01;
/// At least this share of the bytes an iteration allocates is freed by the
/// end of the next one.
const MIN_FREED: f64 = 0.75;
/// Positions sampled to score a lag.
const SAMPLES: usize = 4096;
/// Lags tried: the most common distances between two allocations at one site.
const CANDIDATES: usize = 12;

/// A trace's iterations: where each starts, at the same phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Iterations {
    /// Allocations per iteration.
    pub(crate) period: usize,
    /// Index of the event each iteration's cut falls before; the first is
    /// the start of the first whole iteration.
    pub(crate) starts: Vec<usize>,
}

/// The iterations of `events`, if its allocations repeat at least three
/// times with one period.
pub(crate) fn find(events: &Events, keys: &StackKeys) -> Option<Iterations> {
    // Sites by stack (the first slot for no stack), numbered as first seen.
    let mut numbers: FxHashMap<StackKey, u32> = FxHashMap::default();
    let mut site_of_stack: Vec<Option<u32>> = Vec::new();
    let allocs: Vec<Alloc> = events
        .block_events()
        .filter(|e| e.action == BlockAction::Alloc)
        .map(|e| {
            let slot = e.stack.map_or(0, |s| s as usize + 1);
            if slot >= site_of_stack.len() {
                site_of_stack.resize(slot + 1, None);
            }
            let site = *site_of_stack[slot].get_or_insert_with(|| {
                let next = numbers.len() as u32;
                *numbers.entry(keys.key(e.stack)).or_insert(next)
            });
            (e.index, site)
        })
        .collect();
    let n = allocs.len();
    if n < 6 {
        return None;
    }
    let mut scored: Vec<(usize, f64)> = candidate_lags(&allocs, numbers.len())
        .into_iter()
        .filter(|&lag| 3 * lag <= n)
        .map(|lag| (lag, self_match(&allocs, lag)))
        .collect();
    scored.retain(|&(_, score)| score >= MIN_MATCH);
    let best = scored.iter().map(|&(_, s)| s).fold(0.0, f64::max);
    scored.retain(|&(_, s)| s >= best - MATCH_TIE);
    let period = scored.iter().map(|&(lag, _)| lag).min()?;
    if freed_within_next(events, &allocs, period) < MIN_FREED {
        return None;
    }
    let phase = lowest_phase(events, &allocs, period);
    let starts: Vec<usize> = (phase..n).step_by(period).map(|j| allocs[j].0).collect();
    (starts.len() >= 3).then_some(Iterations { period, starts })
}

/// Lags worth trying: the most common distances, in allocations, between
/// consecutive allocations at one site; and the distances that sites
/// recur at regularly, one vote per site (a site allocated once per
/// iteration always recurs at the period, but layers and inner loops recur
/// more often and crowd the first list).
fn candidate_lags(allocs: &[Alloc], sites: usize) -> Vec<usize> {
    let mut last: Vec<Option<usize>> = vec![None; sites];
    let mut distances: Vec<Vec<usize>> = vec![Vec::new(); sites];
    // How many times each distance occurs: all are below the allocations'
    // count.
    let mut all = vec![0u32; allocs.len()];
    for (j, &(_, site)) in allocs.iter().enumerate() {
        if let Some(prev) = last[site as usize].replace(j) {
            all[j - prev] += 1;
            distances[site as usize].push(j - prev);
        }
    }
    let mut regular: FxHashMap<usize, u32> = FxHashMap::default();
    for mut d in distances.into_iter().filter(|d| d.len() >= 2) {
        d.sort_unstable();
        // The site's most common distance, if at least 4 in 5 are it.
        let (mut best, mut best_run, mut run) = (d[0], 0, 0);
        for (k, &x) in d.iter().enumerate() {
            run = if k > 0 && d[k - 1] == x { run + 1 } else { 1 };
            if run > best_run {
                (best, best_run) = (x, run);
            }
        }
        if 5 * best_run >= 4 * d.len() {
            *regular.entry(best).or_default() += 1;
        }
    }
    let most_common = |mut lags: Vec<(usize, u32)>, take: usize| {
        lags.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        lags.into_iter().take(take).map(|(lag, _)| lag)
    };
    let all = (all.into_iter().enumerate()).filter(|&(_, count)| count > 0);
    let mut lags: Vec<usize> = most_common(all.collect(), CANDIDATES)
        .chain(most_common(regular.into_iter().collect(), CANDIDATES))
        .collect();
    lags.sort_unstable();
    lags.dedup();
    lags
}

/// The share of sampled allocations whose site is that of the allocation
/// `lag` later.
fn self_match(allocs: &[Alloc], lag: usize) -> f64 {
    let span = allocs.len() - lag;
    let step = span.div_ceil(SAMPLES).max(1);
    let (mut same, mut total) = (0usize, 0usize);
    for j in (0..span).step_by(step) {
        total += 1;
        same += usize::from(allocs[j].1 == allocs[j + lag].1);
    }
    same as f64 / total as f64
}

/// The share of bytes allocated in windows of `period` allocations that are
/// freed before the end of the following window.
fn freed_within_next(events: &Events, allocs: &[Alloc], period: usize) -> f64 {
    // Where the window after window `w` ends, as an event index.
    let window_end = |w: usize| allocs.get((w + 2) * period).map_or(events.len(), |a| a.0);
    // Open allocations by address: (window, bytes).
    let mut open: FxHashMap<u64, (usize, u64)> = FxHashMap::default();
    let mut seen = 0;
    let (mut allocated, mut freed) = (0u64, 0u64);
    for e in events.block_events() {
        match e.action {
            BlockAction::Alloc => {
                allocated += e.size;
                open.insert(e.address, (seen / period, e.size));
                seen += 1;
            }
            BlockAction::FreeCompleted | BlockAction::FreeRequested => {
                if let Some((w, size)) = open.remove(&e.address)
                    && e.index < window_end(w)
                {
                    freed += size;
                }
            }
        }
    }
    if allocated == 0 {
        0.0
    } else {
        freed as f64 / allocated as f64
    }
}

/// The allocation index in `0..period` before which live memory is lowest,
/// summed over the whole iterations.
fn lowest_phase(events: &Events, allocs: &[Alloc], period: usize) -> usize {
    let frees_complete = events
        .block_events()
        .any(|e| e.action == BlockAction::FreeCompleted);
    let whole = allocs.len() / period * period;
    let mut live = 0i64;
    // Live bytes just before each allocation of the whole iterations, summed
    // by phase.
    let mut sums = vec![0i128; period];
    let mut j = 0;
    for e in events.block_events() {
        match e.action {
            BlockAction::Alloc => {
                if j < whole {
                    sums[j % period] += i128::from(live);
                }
                j += 1;
                live += e.size as i64;
            }
            BlockAction::FreeCompleted => live -= e.size as i64,
            BlockAction::FreeRequested if !frees_complete => live -= e.size as i64,
            BlockAction::FreeRequested => {}
        }
    }
    (0..period).min_by_key(|&p| sums[p]).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use snapdiff_format::{Action, Events, Snapshot, TraceEvent};

    use super::find;
    use crate::stack_key::{StackKeys, test_frame};

    /// A snapshot of `sites` one-frame stacks, `site0.py:1` ... (stack `k`
    /// is site `k`), and the events of `program`: `(site, true)` allocates
    /// a 1 KiB block at the site, `(site, false)` frees the newest live
    /// block allocated there.
    fn run(sites: u32, program: &[(u32, bool)]) -> (Events, StackKeys) {
        let mut snap = Snapshot::default();
        for k in 0..sites {
            snap.frames.push(test_frame("f", &format!("site{k}.py"), 1));
            snap.stacks.push(vec![k]);
        }
        let mut live: Vec<Vec<u64>> = vec![Vec::new(); sites as usize];
        let mut next_address = 0x1000;
        let mut events = Events::new();
        for &(site, alloc) in program {
            let address = if alloc {
                next_address += 1024;
                live[site as usize].push(next_address);
                next_address
            } else {
                live[site as usize].pop().expect("a live block to free")
            };
            events.push(TraceEvent {
                action: if alloc {
                    Action::Alloc
                } else {
                    Action::FreeCompleted
                },
                address,
                size: 1024,
                stack: Some(site),
                ..TraceEvent::default()
            });
        }
        (events, StackKeys::new(&snap))
    }

    #[test]
    fn a_loop_is_cut_once_per_iteration() {
        // Six iterations of: allocate at ten sites, then free them all.
        let one: Vec<(u32, bool)> = (0..10)
            .map(|k| (k, true))
            .chain((0..10).rev().map(|k| (k, false)))
            .collect();
        let (events, keys) = run(10, &one.repeat(6));
        let found = find(&events, &keys).expect("iterations");
        assert_eq!(found.period, 10);
        // Cut where nothing is live: before each iteration's first allocation.
        let starts: Vec<usize> = (0..6).map(|i| i * 20).collect();
        assert_eq!(found.starts, starts);
    }

    #[test]
    fn the_layers_of_one_pass_are_not_iterations() {
        // One forward pass of twelve layers, the same five sites each; every
        // layer's activations are kept for backward, freed at the end.
        let mut pass: Vec<(u32, bool)> = Vec::new();
        for _ in 0..12 {
            pass.extend((0..5).map(|k| (k, true)));
        }
        for _ in 0..12 {
            pass.extend((0..5).rev().map(|k| (k, false)));
        }
        let (events, keys) = run(5, &pass);
        assert_eq!(find(&events, &keys), None);
    }
}
