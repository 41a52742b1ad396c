//! Finding a loop's iterations in a trace by its calls: where the trace
//! has no markers and its allocation order repeats too few times, or its
//! memory never falls back (a leak keeps a tensor each call), the stacks
//! still show the loop. A training step called from one line of a loop is
//! the same function entered again from the same caller line; each entry
//! starts an iteration.
//!
//! Stacks are read outermost first, noise left out. At each depth, the
//! allocations whose frame there is one function called from one caller
//! frame (its line included) are one *call site*; a call of it starts at
//! its first allocation, where the allocation before was not in it (the
//! loop ran other code between calls), or where the function's own line
//! goes back to the line of its first allocation (one call right after
//! another). The outermost call site entered at least three times, its
//! calls holding most of the allocated bytes, gives the iterations. Only
//! the program's own functions, called from its own code, count: a
//! library's called once per layer (the autograd engine's node), or the
//! program's layer called from torch's module call, is one pass, not a
//! loop. This works whether memory falls back or not, and on Python
//! frames, C++ frames or both.

use rustc_hash::FxHashMap;
use snapdiff_format::{BlockAction, Events, FrameId, Snapshot, StackId};

use crate::frame_class::{FrameClass, classify_known};
use crate::stack_key::StackKeys;

/// A call site: the caller's function and line (none at the outermost
/// depth), and the function it calls.
type CallSite = (Option<(u32, u32)>, u32);

/// Calls a call site needs to show a loop.
const MIN_CALLS: usize = 3;
/// Share of all allocated bytes its calls must hold: the loop's body, not
/// a helper called now and then.
const MIN_SHARE: f64 = 0.5;
/// Depths looked at, outermost first.
const MOST_DEPTH: usize = 64;

/// Namespaces of the C++ libraries under a program: their functions are
/// never its loop (the autograd engine calls a node per layer).
const LIBRARY_NAMESPACES: &[&str] = &[
    "torch::",
    "at::",
    "c10::",
    "std::",
    "caffe2::",
    "pybind11::",
    "__gnu",
    "_Py",
    "Py",
    "slot_",
];

/// Whether the function of `frame` can be the program's loop or call it: the
/// program's own code, or native code with a source that is no library's
/// (a C++ program's own functions; `.cpp` files are native to `classify`).
/// A library's function called once per layer is never a training step.
fn may_loop(frame: &snapdiff_format::Frame, class: FrameClass) -> bool {
    match class {
        FrameClass::User | FrameClass::NotebookCell => true,
        FrameClass::Native => {
            !matches!(frame.file.as_str(), "" | "??")
                && !LIBRARY_NAMESPACES.iter().any(|n| frame.name.starts_with(n))
        }
        _ => false,
    }
}

/// The event index of each call's first allocation, at the outermost call
/// site entered at least [`MIN_CALLS`] times; `None` when none is.
pub(crate) fn find(snap: &Snapshot, keys: &StackKeys, events: &Events) -> Option<Vec<usize>> {
    // The same function: frames by (name, file), whatever their lines.
    let mut functions: FxHashMap<(&str, &str), u32> = FxHashMap::default();
    let function_of: Vec<u32> = snap
        .frames
        .iter()
        .map(|f| {
            let next = functions.len() as u32;
            *functions
                .entry((f.name.as_str(), f.file.as_str()))
                .or_insert(next)
        })
        .collect();
    let classes: Vec<FrameClass> = (snap.frames.iter().enumerate())
        .map(|(id, f)| classify_known(f, keys.is_noise(snap, id as FrameId)))
        .collect();
    let loops: Vec<bool> = snap
        .frames
        .iter()
        .zip(&classes)
        .map(|(f, &class)| may_loop(f, class))
        .collect();
    // Each stack outermost first, noise left out.
    let outermost_first: Vec<Vec<FrameId>> = snap
        .stacks
        .iter()
        .map(|stack| {
            stack
                .iter()
                .rev()
                .copied()
                .filter(|&f| classes[f as usize] != FrameClass::Noise)
                .collect()
        })
        .collect();
    // Each allocation: its index, bytes, and stack.
    let allocs: Vec<(usize, u64, StackId)> = events
        .block_events()
        .filter(|e| e.action == BlockAction::Alloc)
        .filter_map(|e| {
            let stack = e.stack.filter(|&s| (s as usize) < outermost_first.len())?;
            Some((e.index, e.size, stack))
        })
        .collect();
    let total: u64 = allocs.iter().map(|a| a.1).sum();
    if allocs.len() < MIN_CALLS || total == 0 {
        return None;
    }
    let deepest = allocs
        .iter()
        .map(|a| outermost_first[a.2 as usize].len())
        .max()?
        .min(MOST_DEPTH);
    // Each stack's allocations and their bytes: a call site's are its
    // stacks', so a depth where no site could hold enough is passed over
    // without walking the allocations (most depths of a trace with no loop).
    let mut of_stack = vec![(0usize, 0u64); outermost_first.len()];
    for &(_, bytes, stack) in &allocs {
        let (count, all_bytes) = &mut of_stack[stack as usize];
        *count += 1;
        *all_bytes += bytes;
    }
    let enough_bytes = |bytes: u64| bytes as f64 >= MIN_SHARE * total as f64;
    for depth in 0..deepest {
        // Each stack's call site at this depth, numbered, and the line of
        // its frame there: worked out once a stack, as thousands of
        // allocations share a few hundred stacks.
        let mut numbers: FxHashMap<CallSite, u32> = FxHashMap::default();
        let site_of_stack: Vec<Option<(u32, u32)>> = outermost_first
            .iter()
            .map(|frames| {
                let callee = *frames.get(depth)?;
                let caller = depth.checked_sub(1).map(|d| frames[d] as usize);
                // The program's own loop calls the program's own function.
                if !loops[callee as usize] || caller.is_some_and(|f| !loops[f]) {
                    return None;
                }
                let caller = caller.map(|f| (function_of[f], snap.frames[f].line));
                let next = numbers.len() as u32;
                let number = *numbers
                    .entry((caller, function_of[callee as usize]))
                    .or_insert(next);
                Some((number, snap.frames[callee as usize].line))
            })
            .collect();
        let mut site_totals = vec![(0usize, 0u64); numbers.len()];
        for (site, (count, bytes)) in site_of_stack.iter().zip(&of_stack) {
            if let Some((site, _)) = site {
                site_totals[*site as usize].0 += count;
                site_totals[*site as usize].1 += bytes;
            }
        }
        if !(site_totals.iter()).any(|&(count, bytes)| count >= MIN_CALLS && enough_bytes(bytes)) {
            continue;
        }
        // Per call site: the line of its first call's first allocation,
        // the event index of each call's first, and the bytes of all.
        let mut calls: Vec<(Option<u32>, Vec<usize>, u64)> =
            vec![(None, Vec::new(), 0); numbers.len()];
        let mut previous: Option<(u32, u32)> = None;
        for &(i, bytes, stack) in &allocs {
            let Some((site, line)) = site_of_stack[stack as usize] else {
                previous = None;
                continue;
            };
            let (first, starts, all_bytes) = &mut calls[site as usize];
            let first = *first.get_or_insert(line);
            let call_starts = match previous {
                Some((s, last)) if s == site => line == first && last != first,
                _ => true,
            };
            if call_starts {
                starts.push(i);
            }
            *all_bytes += bytes;
            previous = Some((site, line));
        }
        // The call site holding the most bytes; of equals, the one called
        // most, then the one entered first.
        let best = calls
            .into_iter()
            .filter(|(_, starts, bytes)| starts.len() >= MIN_CALLS && enough_bytes(*bytes))
            .max_by_key(|(_, starts, bytes)| (*bytes, starts.len(), std::cmp::Reverse(starts[0])));
        if let Some((_, starts, _)) = best {
            return Some(starts);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapdiff_format::{Action, DeviceTrace, Frame, TraceEvent};

    /// A snapshot whose trace allocates `(size, stack)` in order, each
    /// freed at once when `freed`; stacks are frames (name, line), innermost
    /// first, in `job.py`.
    /// An allocation: its size, its stack (name, line) innermost first, and
    /// whether it is freed at once.
    type Alloc<'a> = (u64, &'a [(&'a str, u32)], bool);

    fn trace(allocs: &[Alloc<'_>]) -> Snapshot {
        let mut snap = Snapshot::default();
        let mut frame_ids: FxHashMap<(String, u32), FrameId> = FxHashMap::default();
        let mut events = Events::new();
        for (k, (size, stack, freed)) in allocs.iter().enumerate() {
            let ids: Vec<FrameId> = stack
                .iter()
                .map(|(name, line)| {
                    let next = snap.frames.len() as FrameId;
                    *frame_ids
                        .entry((name.to_string(), *line))
                        .or_insert_with(|| {
                            snap.frames.push(Frame {
                                name: (*name).into(),
                                file: "job.py".into(),
                                line: *line,
                                extra: Vec::new(),
                            });
                            next
                        })
                })
                .collect();
            snap.stacks.push(ids);
            let stack = Some((snap.stacks.len() - 1) as u32);
            let address = 0x1000 * (k as u64 + 1);
            events.push(TraceEvent {
                action: Action::Alloc,
                address,
                size: *size,
                stack,
                ..TraceEvent::default()
            });
            if *freed {
                events.push(TraceEvent {
                    action: Action::FreeCompleted,
                    address,
                    size: *size,
                    stack,
                    ..TraceEvent::default()
                });
            }
        }
        snap.traces.push(DeviceTrace { device: 0, events });
        snap
    }

    #[test]
    fn a_step_called_three_times_from_one_line_is_three_iterations() {
        // Each call: an activation freed, a tensor kept, and state once.
        let step = |line: u32| -> [(&str, u32); 2] { [("train_step", line), ("<module>", 17)] };
        let (a, b, c) = (step(8), step(10), step(12));
        let calls = [
            (40, &a[..], true),
            (40, &b[..], false),
            (180, &c[..], false),
            (40, &a[..], true),
            (40, &b[..], false),
            (40, &a[..], true),
            (40, &b[..], false),
        ];
        let snap = trace(&calls);
        let starts = find(&snap, &StackKeys::new(&snap), &snap.traces[0].events).unwrap();
        // Allocations 0, 3 and 5 start calls (events 0, 4 and 7: the
        // activations' frees come between).
        assert_eq!(starts, [0, 4, 7]);
    }

    #[test]
    fn one_pass_through_layers_is_not_a_loop() {
        // One forward pass: layer() called from three lines of forward().
        let calls = [
            (
                10,
                &[("layer", 3), ("forward", 20), ("<module>", 30)][..],
                false,
            ),
            (
                10,
                &[("layer", 3), ("forward", 21), ("<module>", 30)][..],
                false,
            ),
            (
                10,
                &[("layer", 3), ("forward", 22), ("<module>", 30)][..],
                false,
            ),
        ];
        let snap = trace(&calls);
        assert_eq!(
            find(&snap, &StackKeys::new(&snap), &snap.traces[0].events),
            None
        );
    }
}
