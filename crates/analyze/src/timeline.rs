//! Live memory over a trace, at a bounded number of points: what a report
//! draws as its timeline, the whole device and a few sites stacked.
//!
//! A trace of millions of events is cut into at most `points` stretches of
//! equal event counts; each point gives the highest live bytes of its
//! stretch (so no peak falls between points) and each chosen site's live
//! bytes at the stretch's end. One replay pass.

use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_format::{DeviceTrace, Snapshot};

use crate::replay::{replay, replay_with};
use crate::stack_key::{StackKey, StackKeys};

/// Live memory of one device's trace at evenly spaced points.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Timeline {
    /// Device ordinal.
    pub device: u32,
    /// Events replayed at each point.
    pub events: Vec<usize>,
    /// Time of each point's last event, in µs since the epoch, if known.
    pub time_us: Vec<Option<i64>>,
    /// The most bytes live within each point's stretch.
    pub allocated: Vec<u64>,
    /// Each chosen site's live bytes at each point.
    pub sites: Vec<(StackKey, Vec<u64>)>,
}

/// The timeline of `trace` at most `points` points, following `sites`.
pub fn timeline(
    snap: &Snapshot,
    keys: &StackKeys,
    trace: &DeviceTrace,
    sites: &[StackKey],
    points: usize,
) -> Timeline {
    let len = trace.events.len();
    let points = points.clamp(1, len.max(1));
    // The point event `i` belongs to.
    let point_of = |i: usize| i * points / len.max(1);
    let index: FxHashMap<StackKey, usize> =
        sites.iter().enumerate().map(|(k, &s)| (s, k)).collect();
    // What was live when recording began (blocks from before it).
    let start = replay(snap, keys, trace, &[0]);
    let mut live_sites: Vec<i64> = sites
        .iter()
        .map(|k| start.points[0].get(k).map_or(0, |t| t.bytes as i64))
        .collect();
    let mut live = start.start_bytes;
    let mut allocated = vec![0u64; points];
    allocated[0] = live;
    let mut by_site = vec![vec![0u64; points]; sites.len()];
    let mut current = 0usize;
    // Closes points up to `to` (exclusive), carrying the live bytes over
    // stretches where nothing changed.
    let close = |to: usize,
                 current: &mut usize,
                 live: u64,
                 live_sites: &[i64],
                 allocated: &mut [u64],
                 by_site: &mut [Vec<u64>]| {
        while *current < to {
            allocated[*current] = allocated[*current].max(live);
            for (k, &b) in live_sites.iter().enumerate() {
                by_site[k][*current] = b.max(0) as u64;
            }
            *current += 1;
            if *current < points {
                allocated[*current] = live;
            }
        }
    };
    replay_with(snap, keys, trace, &[], |c| {
        let before = (c.live_bytes as i64 - c.bytes) as u64;
        close(
            point_of(c.event),
            &mut current,
            before,
            &live_sites,
            &mut allocated,
            &mut by_site,
        );
        if let Some(&k) = index.get(&c.site) {
            live_sites[k] += c.bytes;
        }
        live = c.live_bytes;
        allocated[current] = allocated[current].max(live);
    });
    close(
        points,
        &mut current,
        live,
        &live_sites,
        &mut allocated,
        &mut by_site,
    );
    let events: Vec<usize> = (1..=points).map(|p| (p * len).div_ceil(points)).collect();
    Timeline {
        device: trace.device,
        time_us: events
            .iter()
            .map(|&e| e.checked_sub(1).and_then(|i| trace.events.get(i)?.time_us))
            .collect(),
        events,
        allocated,
        sites: sites.iter().copied().zip(by_site).collect(),
    }
}

#[cfg(test)]
mod tests {
    use snapdiff_format::{Action, DeviceTrace, Snapshot, TraceEvent};

    use super::timeline;
    use crate::stack_key::{StackKeys, test_frame};

    #[test]
    fn points_keep_each_stretchs_peak_and_the_sites_at_its_end() {
        let mut snap = Snapshot::default();
        snap.frames.push(test_frame("f", "a.py", 1));
        snap.frames.push(test_frame("g", "b.py", 2));
        snap.stacks = vec![vec![0], vec![1]];
        let event = |action, address, size, stack| TraceEvent {
            action,
            address,
            size,
            stack: Some(stack),
            ..TraceEvent::default()
        };
        // Site 0 keeps 10 B; site 1 makes a 100 B spike within the first
        // stretch of 2 events, and 5 B that stay.
        snap.traces.push(DeviceTrace {
            device: 0,
            events: vec![
                event(Action::Alloc, 1, 100, 1),
                event(Action::FreeCompleted, 1, 100, 1),
                event(Action::Alloc, 2, 10, 0),
                event(Action::Alloc, 3, 5, 1),
            ]
            .into(),
        });
        let keys = StackKeys::new(&snap);
        let sites = [keys.key(Some(0)), keys.key(Some(1))];
        let t = timeline(&snap, &keys, &snap.traces[0], &sites, 2);
        assert_eq!(t.events, [2, 4]);
        assert_eq!(t.allocated, [100, 15]);
        assert_eq!(t.sites[0].1, [0, 10]);
        assert_eq!(t.sites[1].1, [0, 5]);
    }
}
