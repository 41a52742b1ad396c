//! Rebuilding the live blocks at any point of a recorded trace.
//!
//! A trace says when each block was allocated and freed; replaying it from
//! the start gives the live set after any event, as PyTorch's viewer does to
//! draw its timeline. Two kinds of block were allocated before recording
//! began and have no `alloc` event: blocks freed during the trace (they were
//! live from the start until their free) and live blocks of the final
//! snapshot whose address the trace never mentions (live throughout). Both
//! are kept, and their sites are labelled.

use std::collections::hash_map::Entry;

use rustc_hash::{FxHashMap, FxHashSet};
use snapdiff_format::{BlockAction, DeviceTrace, Snapshot, StackId};

use crate::group::{SiteTotals, is_live};
use crate::stack_key::{StackKey, StackKeys};

/// Live totals per site at each requested point of a trace.
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    /// For each cut, the live totals per site.
    pub points: Vec<FxHashMap<StackKey, SiteTotals>>,
    /// One stack of each site seen, to describe it.
    pub stacks: FxHashMap<StackKey, Option<StackId>>,
    /// Sites with blocks allocated before recording began.
    pub before_recording: FxHashSet<StackKey>,
    /// Blocks the trace frees without having recorded their allocation:
    /// recording began mid-run, or the ring buffer of trace events wrapped.
    pub freed_unseen: usize,
    /// The most bytes live at once, and the first cut at which they were:
    /// the number of events replayed by then.
    pub highest: (u64, usize),
    /// Bytes live when recording began (blocks allocated before it).
    pub start_bytes: u64,
}

/// How one event changed live memory, as [`replay_with`] reports it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LiveChange {
    /// Index of the event in the trace.
    pub event: usize,
    /// The site of the block allocated or freed.
    pub site: StackKey,
    /// Bytes added (allocation) or removed (free, negative).
    pub bytes: i64,
    /// Bytes live after the event.
    pub live_bytes: u64,
}

/// Replays the trace of one device and records the live totals per site
/// after the first `cut` events, for each `cut` in `cuts` (ascending; a cut
/// equal to the number of events is the end of the trace). Sizes are the
/// sizes the program requested, as trace events record them.
pub fn replay(snap: &Snapshot, keys: &StackKeys, trace: &DeviceTrace, cuts: &[usize]) -> Replayed {
    replay_with(snap, keys, trace, cuts, |_| {})
}

/// [`replay`] of the first `cut` events only, with the live totals per site
/// after them: [`Replayed::highest`] is the highest point among them.
pub(crate) fn replay_to(
    snap: &Snapshot,
    keys: &StackKeys,
    trace: &DeviceTrace,
    cut: usize,
) -> Replayed {
    replay_events(snap, keys, trace, &[cut], cut, |_| {})
}

/// [`replay`], calling `visit` with each change of live memory in order:
/// for analyses that follow memory through the whole trace (per step, say)
/// without keeping the live totals of every point.
pub(crate) fn replay_with(
    snap: &Snapshot,
    keys: &StackKeys,
    trace: &DeviceTrace,
    cuts: &[usize],
    visit: impl FnMut(LiveChange),
) -> Replayed {
    replay_events(snap, keys, trace, cuts, trace.events.len(), visit)
}

/// [`replay_with`], stopping after the first `end` events.
fn replay_events(
    snap: &Snapshot,
    keys: &StackKeys,
    trace: &DeviceTrace,
    cuts: &[usize],
    end: usize,
    mut visit: impl FnMut(LiveChange),
) -> Replayed {
    let events = &trace.events;
    let free_action = free_action(trace);

    let mut out = Replayed::default();
    let mut live: FxHashMap<u64, (u64, StackKey)> = FxHashMap::default();
    let mut totals: FxHashMap<StackKey, SiteTotals> = FxHashMap::default();

    // Blocks allocated before recording began: freed in the trace without an
    // alloc before, or live at the end without appearing at all. `named`:
    // each address the trace names, and whether an alloc of it awaits its
    // free (one map, probed once an event).
    let mut named: FxHashMap<u64, bool> = FxHashMap::default();
    for e in events.block_events() {
        if e.action == BlockAction::Alloc {
            named.insert(e.address, true);
        } else if e.action == free_action {
            match named.entry(e.address) {
                Entry::Occupied(mut seen) => *seen.get_mut() = false,
                Entry::Vacant(unseen) => {
                    unseen.insert(false);
                    out.freed_unseen += 1;
                    let key = keys.key(e.stack);
                    out.stacks.entry(key).or_insert(e.stack);
                    out.before_recording.insert(key);
                    // Trace events record only the requested size.
                    live.insert(e.address, (e.size, key));
                    totals.entry(key).or_default().add_bytes(e.size, e.size);
                }
            }
        }
    }
    let mut live_bytes: u64 = live.values().map(|&(size, _)| size).sum();
    // The live blocks whose address the trace never names stay live
    // throughout: they count in their sites' totals, but no event looks
    // them up, so they stay out of `live` (a snapshot taken long after
    // recording began can hold a million of them).
    let unnamed = snap
        .segments
        .iter()
        .filter(|s| s.device == trace.device)
        .flat_map(|s| &s.blocks)
        .filter(|b| is_live(b) && !named.contains_key(&b.address));
    // Summed by stack first (an add a block, no hashing), then by site in
    // the order the stacks first appear, so that each site is described by
    // the same stack as block by block. Slot 0: blocks without a stack.
    let mut by_stack = vec![SiteTotals::default(); snap.stacks.len() + 1];
    let mut first_seen = Vec::new();
    for b in unnamed {
        let slot = b.stack.map_or(0, |id| id as usize + 1);
        if by_stack[slot].blocks == 0 {
            first_seen.push(slot);
        }
        let size = crate::group::requested(b);
        by_stack[slot].add_bytes(size, size);
        live_bytes += size;
    }
    drop(named);
    for slot in first_seen {
        let stack = slot.checked_sub(1).map(|id| id as StackId);
        let key = keys.key(stack);
        out.stacks.entry(key).or_insert(stack);
        out.before_recording.insert(key);
        totals.entry(key).or_default().merge(by_stack[slot]);
    }

    out.highest = (live_bytes, 0);
    out.start_bytes = live_bytes;
    let mut cuts = cuts.iter().copied().peekable();
    // Other events change no block: a cut before one is the same as a
    // cut before the next allocation or free.
    for e in events.block_events().take_while(|e| e.index < end) {
        let i = e.index;
        while cuts.next_if(|&c| c <= i).is_some() {
            out.points.push(totals.clone());
        }
        if e.action == BlockAction::Alloc {
            let key = keys.key(e.stack);
            out.stacks.entry(key).or_insert(e.stack);
            if let Some((old, old_key)) = live.insert(e.address, (e.size, key)) {
                // A second alloc at a live address: its free was not recorded.
                live_bytes -= old;
                visit(LiveChange {
                    event: i,
                    site: old_key,
                    bytes: -(old as i64),
                    live_bytes,
                });
                remove_from(&mut totals, old_key, old);
            }
            totals.entry(key).or_default().add_bytes(e.size, e.size);
            live_bytes += e.size;
            if live_bytes > out.highest.0 {
                out.highest = (live_bytes, i + 1);
            }
            visit(LiveChange {
                event: i,
                site: key,
                bytes: e.size as i64,
                live_bytes,
            });
        } else if e.action == free_action
            && let Some((size, key)) = live.remove(&e.address)
        {
            remove_from(&mut totals, key, size);
            live_bytes -= size;
            visit(LiveChange {
                event: i,
                site: key,
                bytes: -(size as i64),
                live_bytes,
            });
        }
    }
    for _ in cuts {
        out.points.push(totals.clone());
    }
    out
}

/// The action that frees a block in `trace`: traces that record
/// `free_completed` free a block then; older or partial ones only have
/// `free_requested`.
fn free_action(trace: &DeviceTrace) -> BlockAction {
    let mut blocks = trace.events.block_events();
    if blocks.any(|e| e.action == BlockAction::FreeCompleted) {
        BlockAction::FreeCompleted
    } else {
        BlockAction::FreeRequested
    }
}

/// The first cut at which the most bytes were live in `trace`: the event
/// count of [`Replayed::highest`] of its whole replay, found in one pass
/// with one map and no per-site totals (a peak's first question, before it
/// replays to that point with [`replay_to`]). The bytes live before
/// recording began add the same to every point, so they are left out.
pub(crate) fn highest_at(trace: &DeviceTrace) -> usize {
    let free_action = free_action(trace);
    // Each address the trace names, and the bytes of the block live there.
    let mut live: FxHashMap<u64, Option<u64>> = FxHashMap::default();
    // Live bytes since the start (negative when blocks allocated before
    // recording are freed), and their highest point.
    let mut change: i128 = 0;
    let mut highest: (i128, usize) = (0, 0);
    for e in trace.events.block_events() {
        if e.action == BlockAction::Alloc {
            if let Some(Some(old)) = live.insert(e.address, Some(e.size)) {
                // A second alloc at a live address: its free was not recorded.
                change -= i128::from(old);
            }
            change += i128::from(e.size);
            if change > highest.0 {
                highest = (change, e.index + 1);
            }
        } else if e.action == free_action {
            match live.entry(e.address) {
                Entry::Occupied(mut seen) => {
                    if let Some(size) = seen.get_mut().take() {
                        change -= i128::from(size);
                    }
                }
                // Allocated before recording began: live until now.
                Entry::Vacant(unseen) => {
                    unseen.insert(None);
                    change -= i128::from(e.size);
                }
            }
        }
    }
    highest.1
}

fn remove_from(totals: &mut FxHashMap<StackKey, SiteTotals>, key: StackKey, size: u64) {
    if let Some(t) = totals.get_mut(&key) {
        t.remove_bytes(size, size);
        if t.blocks == 0 {
            totals.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use snapdiff_format::{Action, Block, BlockState, DeviceTrace, Segment, Snapshot, TraceEvent};

    use super::{highest_at, replay};
    use crate::stack_key::{StackKeys, test_frame};

    /// Live blocks no event names count from the start, in their sites'
    /// totals, and a site is described by the stack of its first block even
    /// when a later stack of the same site has a lower id.
    #[test]
    fn unnamed_live_blocks_count_from_the_start_under_their_first_stack() {
        let block = |stack, size| Block {
            address: 0x1000 * size,
            size,
            requested_size: size,
            state: BlockState::ActiveAllocated,
            stack: Some(stack),
            ..Block::default()
        };
        let snap = Snapshot {
            frames: vec![
                test_frame("train_step", "/home/u/train.py", 12),
                test_frame("torch::unwind::unwind()", "??", 0),
            ],
            // The same site: stack 1 only adds a noise frame.
            stacks: vec![vec![0], vec![1, 0]],
            segments: vec![Segment {
                blocks: vec![block(1, 3), block(0, 5), block(1, 7)],
                ..Segment::default()
            }],
            traces: vec![DeviceTrace::default()],
            ..Snapshot::default()
        };
        let keys = StackKeys::new(&snap);
        let key = keys.key(Some(0));
        assert_eq!(key, keys.key(Some(1)));
        let replayed = replay(&snap, &keys, &snap.traces[0], &[0]);
        assert_eq!(replayed.start_bytes, 15);
        assert_eq!(replayed.points[0][&key].blocks, 3);
        assert_eq!(replayed.points[0][&key].bytes, 15);
        assert_eq!(replayed.stacks[&key], Some(1));
        assert!(replayed.before_recording.contains(&key));
    }

    /// The highest point found without per-site totals is where the whole
    /// replay finds it, through what a trace holds besides plain allocs
    /// and frees; each case's point moves if that is mishandled.
    #[test]
    fn the_highest_point_is_where_the_whole_replay_finds_it() {
        use Action::{Alloc, FreeCompleted, FreeRequested};
        /// What a case shows, its events (action, address, size), and the
        /// highest point's event count.
        type Case = (&'static str, &'static [(Action, u64, u64)], usize);
        let cases: [Case; 4] = [
            (
                "a block freed before any alloc of its address was live from the start",
                &[
                    (Alloc, 0xa, 10),
                    (FreeCompleted, 0xb, 300),
                    (Alloc, 0xc, 20),
                ],
                1,
            ),
            (
                "a second alloc at a live address replaces the block",
                &[(Alloc, 0xa, 100), (Alloc, 0xa, 10), (Alloc, 0xb, 50)],
                1,
            ),
            (
                "a second free of a block frees nothing",
                &[
                    (Alloc, 0xa, 50),
                    (FreeCompleted, 0xa, 50),
                    (FreeCompleted, 0xa, 50),
                    (Alloc, 0xb, 30),
                    (Alloc, 0xc, 30),
                ],
                5,
            ),
            (
                "free_requested frees nothing where free_completed is recorded",
                &[
                    (Alloc, 0xa, 50),
                    (FreeRequested, 0xa, 50),
                    (Alloc, 0xb, 40),
                    (FreeCompleted, 0xa, 50),
                    (Alloc, 0xc, 5),
                ],
                3,
            ),
        ];
        for (what, events, expected) in cases {
            let snap = Snapshot {
                frames: vec![test_frame("train_step", "/home/u/train.py", 12)],
                stacks: vec![vec![0]],
                traces: vec![DeviceTrace {
                    device: 0,
                    events: (events.iter().cloned())
                        .map(|(action, address, size)| TraceEvent {
                            action,
                            address,
                            size,
                            stack: Some(0),
                            ..TraceEvent::default()
                        })
                        .collect(),
                }],
                ..Snapshot::default()
            };
            let trace = &snap.traces[0];
            assert_eq!(highest_at(trace), expected, "{what}");
            let keys = StackKeys::new(&snap);
            assert_eq!(
                replay(&snap, &keys, trace, &[]).highest.1,
                expected,
                "{what}"
            );
        }
    }
}
