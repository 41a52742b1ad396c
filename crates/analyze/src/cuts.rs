//! Cutting one snapshot's trace into checkpoints: after each step mark,
//! `snapshot` marker or annotation, at the same phase of the iterations its
//! allocation sites repeat in, at each call of the loop's function its
//! stacks show (`calls.rs`), at the low points its memory keeps coming
//! back to, or evenly. `trend`, `steps` and the pictures of a step cut
//! traces the same way.

use snapdiff_format::{Action, Snapshot};

use crate::calls;
use crate::error::TraceError;
use crate::iterations;
use crate::stack_key::StackKeys;
use crate::trend::{CheckpointSource, TrendOptions};

/// Where to cut a trace, and the step each cut starts when known.
pub(crate) struct Cuts {
    pub(crate) source: CheckpointSource,
    /// Event indices: each checkpoint is the state after that many events.
    pub(crate) at: Vec<usize>,
    /// The step (or iteration found in the trace) each cut starts, when the
    /// cutting knows it.
    pub(crate) steps: Option<Vec<u64>>,
}

/// The ways of finding a trace's steps, in the order they are tried.
const STEP_SOURCES: [CheckpointSource; 6] = [
    CheckpointSource::StepMarks,
    CheckpointSource::SnapshotMarkers,
    CheckpointSource::Annotations,
    CheckpointSource::Iterations,
    CheckpointSource::Calls,
    CheckpointSource::Troughs,
];

/// Chooses where to cut a trace into checkpoints: the first way of
/// [`step_cuts`] that finds steps (or the one `options.cut` asks for), else
/// evenly. `options.limit_all` thins every way's cuts to
/// `options.checkpoints`, not only those found in the trace.
///
/// # Errors
///
/// When `options.cut` asks for a way the trace has nothing for.
pub(crate) fn cuts_for(
    snap: &Snapshot,
    keys: &StackKeys,
    trace_index: usize,
    options: &TrendOptions,
) -> Result<Cuts, TraceError> {
    let n = options.checkpoints.max(1);
    let found = match options.cut {
        None => step_cuts(snap, keys, trace_index, n),
        Some(CheckpointSource::EvenlySpaced) => None,
        Some(source) => Some(cuts_by(snap, keys, trace_index, n, source).ok_or(
            TraceError::NothingToCutAt {
                device: snap.traces[trace_index].device,
                what: match source {
                    CheckpointSource::StepMarks => "step marks",
                    CheckpointSource::SnapshotMarkers => "snapshot markers",
                    CheckpointSource::Annotations => "annotations",
                    CheckpointSource::Iterations => "repeating iterations",
                    CheckpointSource::Calls => "a function called again and again from one line",
                    _ => "low points between iterations",
                },
            },
        )?),
    };
    let mut cuts = found.unwrap_or_else(|| {
        let len = snap.traces[trace_index].events.len();
        let mut cuts: Vec<usize> = (1..=n).map(|k| k * len / n).collect();
        cuts.dedup();
        Cuts {
            source: CheckpointSource::EvenlySpaced,
            at: cuts,
            steps: None,
        }
    });
    if options.limit_all && cuts.at.len() > n {
        let chosen = spread(cuts.at.len(), n);
        cuts.at = chosen.iter().map(|&k| cuts.at[k]).collect();
        cuts.steps = cuts
            .steps
            .map(|steps| chosen.iter().map(|&k| steps[k]).collect());
    }
    Ok(cuts)
}

/// At most `n` of `count` indices, spread evenly, first and last kept.
fn spread(count: usize, n: usize) -> Vec<usize> {
    if count <= n {
        return (0..count).collect();
    }
    let mut chosen: Vec<usize> = (0..n).map(|k| k * (count - 1) / (n - 1).max(1)).collect();
    chosen.dedup();
    chosen
}

/// Where a trace's steps start: after each step mark, else after each
/// `snapshot` marker, else at annotation times, else at the same phase of
/// the iterations its allocation sites repeat in, else at the low points
/// its memory keeps coming back to; at most `n` of the last two, spread
/// over the trace. `None` when the trace shows no steps.
pub(crate) fn step_cuts(
    snap: &Snapshot,
    keys: &StackKeys,
    trace_index: usize,
    n: usize,
) -> Option<Cuts> {
    STEP_SOURCES
        .into_iter()
        .find_map(|source| cuts_by(snap, keys, trace_index, n, source))
}

/// The cuts one way of finding steps gives, if it finds any.
fn cuts_by(
    snap: &Snapshot,
    keys: &StackKeys,
    trace_index: usize,
    n: usize,
    source: CheckpointSource,
) -> Option<Cuts> {
    let events = &snap.traces[trace_index].events;
    let len = events.len();
    let plain = |at| Cuts {
        source,
        at,
        steps: None,
    };
    // One past each event with `action`: the cut just after it.
    let after = |action: Action| -> Vec<usize> {
        events
            .actions()
            .enumerate()
            .filter(|(_, a)| *a == action)
            .map(|(i, _)| i + 1)
            .collect()
    };
    match source {
        // Where a program marks its steps, they are the checkpoints it
        // means. Each cut is the start of a step; the trace's end, after the
        // last step's work, is the start of the next.
        CheckpointSource::StepMarks => {
            let mut marks = after(Action::Step);
            if marks.is_empty() {
                return None;
            }
            // A step mark's size is its step number.
            let mut steps: Vec<u64> = marks
                .iter()
                .map(|&i| events.get(i - 1).map_or(0, |e| e.size))
                .collect();
            if marks.last() != Some(&len) {
                steps.push(steps[steps.len() - 1] + 1);
                marks.push(len);
            }
            Some(Cuts {
                source,
                at: marks,
                steps: Some(steps),
            })
        }
        // Where earlier dumps were taken; the end of the trace is this one's.
        CheckpointSource::SnapshotMarkers => {
            let mut markers = after(Action::Snapshot);
            if markers.is_empty() {
                return None;
            }
            markers.push(len);
            markers.dedup();
            Some(plain(markers))
        }
        CheckpointSource::Annotations => {
            let device = snap.traces[trace_index].device;
            let mut times: Vec<i64> = snap
                .annotations
                .iter()
                .filter(|a| a.device == device)
                .filter_map(|a| a.time_us)
                .collect();
            times.sort_unstable();
            if times.is_empty() {
                return None;
            }
            // Each cut falls before the first event at or after its time. An
            // event without a time (the key is optional) takes the time of
            // the event before it.
            let mut cuts = Vec::with_capacity(times.len() + 1);
            let mut pending = times.iter().peekable();
            let mut last_time = i64::MIN;
            for (i, e) in events.indexed() {
                let time = e.time_us.unwrap_or(last_time);
                last_time = time;
                while pending.next_if(|&&t| t <= time).is_some() {
                    cuts.push(i);
                }
            }
            cuts.extend(pending.map(|_| len));
            cuts.push(len);
            cuts.dedup();
            (cuts.len() > 1).then(|| plain(cuts))
        }
        // At most n checkpoints, spread over the iterations.
        CheckpointSource::Iterations => {
            let found = iterations::find(events, keys)?;
            let chosen = spread(found.starts.len(), n);
            Some(Cuts {
                source,
                at: chosen.iter().map(|&k| found.starts[k]).collect(),
                steps: Some(chosen.iter().map(|&k| k as u64).collect()),
            })
        }
        // At most n checkpoints, spread over the calls, and the end: the
        // last call's work is done there.
        CheckpointSource::Calls => {
            let mut starts = calls::find(snap, keys, events)?;
            starts.push(len);
            starts.dedup();
            let chosen = spread(starts.len(), n);
            Some(Cuts {
                source,
                at: chosen.iter().map(|&k| starts[k]).collect(),
                steps: Some(chosen.iter().map(|&k| k as u64).collect()),
            })
        }
        CheckpointSource::Troughs => iteration_troughs(events, n).map(plain),
        CheckpointSource::Snapshots | CheckpointSource::EvenlySpaced => None,
    }
}

/// Cuts after the low points a trace's live memory keeps falling back to:
/// the ends of its iterations, where one step's working set is freed and
/// only what persists (weights, optimizer state, and leaks) stays live.
///
/// An iteration is a swing: memory rises from the last low to a peak, falls
/// back by at least half of that rise, and rises again by half of it. Swings
/// are measured from each one's own low, so a leak that lifts the whole
/// curve does not hide them; swings under an eighth of the trace's range are
/// noise. At most `n` cuts, spread over the iterations, and one at the end;
/// `None` when memory falls back fewer than 3 times (one forward pass, say):
/// such a trace has no repeated steps to compare.
fn iteration_troughs(events: &snapdiff_format::Events, n: usize) -> Option<Vec<usize>> {
    // Live bytes after each event: its action and size are all it takes.
    let mut live = 0i64;
    let curve: Vec<i64> = (events.actions().zip(events.sizes()))
        .map(|(action, &size)| {
            match action {
                Action::Alloc => live += size as i64,
                Action::FreeCompleted => live -= size as i64,
                _ => {}
            }
            live
        })
        .collect();
    let (lo, hi) = (*curve.iter().min()?, *curve.iter().max()?);
    let noise = (hi - lo) / 8;
    if noise == 0 {
        return None;
    }
    let mut troughs = Vec::new();
    let (mut last_low, mut peak) = (curve[0], curve[0]);
    // While falling: the lowest point so far, where, and the swing's rise.
    let mut falling: Option<(i64, usize, i64)> = None;
    for (i, &v) in curve.iter().enumerate() {
        match falling {
            None => {
                peak = peak.max(v);
                let rise = peak - last_low;
                if rise > noise && v <= peak - rise / 2 {
                    falling = Some((v, i, rise));
                }
            }
            Some((low, _, rise)) if v < low => falling = Some((v, i, rise)),
            Some((low, at, rise)) if v >= low + rise / 2 => {
                troughs.push(at + 1);
                last_low = low;
                peak = v;
                falling = None;
            }
            Some(_) => {}
        }
    }
    if let Some((_, at, _)) = falling {
        troughs.push(at + 1);
    }
    if troughs.len() < 3 {
        return None;
    }
    let mut cuts: Vec<usize> = if troughs.len() > n {
        (1..=n)
            .map(|k| troughs[k * troughs.len() / n - 1])
            .collect()
    } else {
        troughs
    };
    cuts.push(events.len());
    cuts.dedup();
    Some(cuts)
}
