//! A generated training job of many ranks, for `snapdiff fleet`'s tests and
//! benchmark (`bench/make_fleet.rs`).
//!
//! Every rank replays a real PyTorch trace (one of `../shared/fixtures/torch/`)
//! through the runtime's caching allocator, which follows PyTorch's rules
//! (see `pytorch_replay`), and dumps a snapshot at the end of each step:
//! `node<N>/rank<R>-step<S>.snap`, eight ranks a node. Ranks differ as real
//! ranks do: their addresses (each rank its own range), the order of their
//! segments in the file, their dump times, and the requested sizes of their
//! blocks (up to 511 bytes less, the same for a block at every step, as
//! data of slightly different shapes asks). Three ranks leak one real
//! block a step at two real allocation sites, and rank 0 alone holds a
//! large block at a third from its first step on (a logging buffer), which
//! is imbalance, not a leak. [`Truth`] says what a right verdict is.

use std::path::Path;

use snapdiff_analyze::{Culprit, CulpritKind, CulpritRules};
use snapdiff_format::{Action, Existing, Snapshot, StackId};

use crate::pytorch_replay::{Extra, Job, trace_of};

/// A leak the job was made with.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TruthLeak {
    /// The line that allocated the leaked block.
    pub culprit: Culprit,
    /// The leaking ranks, with the bytes each leaks a step.
    pub ranks: Vec<(u32, u64)>,
}

/// What a right verdict on the generated job says.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Truth {
    /// The leaks.
    pub leaks: Vec<TruthLeak>,
    /// The line at which rank 0 alone holds [`Truth::held_bytes`] more.
    pub held_by_rank0: Culprit,
    pub held_bytes: u64,
    /// Snapshot files written, and their bytes.
    pub files: usize,
    #[cfg_attr(
        test,
        allow(dead_code, reason = "the benchmark reports it; the tests do not")
    )]
    pub bytes: u64,
}

/// Bytes rank 0 holds at its own site.
const HELD_BYTES: u64 = 1 << 30;

/// An allocation of the trace at a line of user code that the trace frees
/// again (keeping it is a leak), of at least `min` bytes, at a line not in
/// `not`: its event index, bytes, stack and culprit. The smallest such.
fn transient_alloc(
    source: &Snapshot,
    device: u32,
    min: u64,
    not: &[&Culprit],
) -> (usize, u64, StackId, Culprit) {
    let events = trace_of(source, device);
    let mut open = std::collections::HashMap::new();
    let mut transient = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.address, i);
            }
            Action::FreeCompleted | Action::FreeRequested => {
                transient.extend(open.remove(&e.address))
            }
            _ => {}
        }
    }
    let rules = CulpritRules::default();
    transient
        .into_iter()
        .filter(|&i| events[i].size >= min)
        .filter_map(|i| {
            let stack = events[i].stack?;
            let culprit = rules.culprit(source.stack_frames(Some(stack)));
            (culprit.kind == CulpritKind::User && !not.contains(&&culprit))
                .then(|| (i, events[i].size, stack, culprit))
        })
        .min_by_key(|&(i, size, _, _)| (size, i))
        .expect("a transient allocation at a user line")
}

/// The bytes rank `rank` asks for where others ask for `size` at `stack`:
/// up to 511 fewer, fixed per rank, stack and size.
fn jittered(rank: u32, stack: Option<StackId>, size: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in [u64::from(rank), u64::from(stack.unwrap_or(u32::MAX)), size] {
        h = (h ^ x).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    size.saturating_sub(h % 512).max(1)
}

/// Rank `rank`'s file as it would write it: its own addresses, segment
/// order, time and requested sizes, and a trace ring of `ring` events (one
/// step's: the replay keeps the whole trace to give blocks their stacks).
fn as_rank(mut snap: Snapshot, rank: u32, step: u32, ring: usize) -> Snapshot {
    let offset = u64::from(rank) << 36;
    let mut rng = fastrand::Rng::with_seed(u64::from(rank) * 7919 + u64::from(step));
    rng.shuffle(&mut snap.segments);
    for segment in &mut snap.segments {
        segment.address += offset;
        for b in &mut segment.blocks {
            b.address += offset;
            if b.state.is_active() {
                b.requested_size = jittered(rank, b.stack, b.requested_size);
            }
        }
    }
    for trace in &mut snap.traces {
        let mut events: Vec<_> = trace.events.iter().collect();
        events.drain(..events.len().saturating_sub(ring));
        for e in &mut events {
            e.address += offset;
        }
        trace.events = events.into();
    }
    snap.meta.step = Some(u64::from(step));
    // The replay's device is as large as any request; the ranks ran on 80 GiB GPUs.
    for device in &mut snap.meta.devices {
        device.total_memory = Some(80 << 30);
    }
    snap.meta.pid = Some(10_000 + rank);
    snap.meta.host = Some(format!("node{}", rank / 8));
    snap.meta.created_us =
        Some(1_764_000_000_000_000 + i64::from(step) * 60_000_000 + i64::from(rank) * 1_000);
    snap
}

/// Writes a job of `ranks` ranks and `steps` steps into `dir`, replayed from
/// the trace of `source` (a real PyTorch snapshot), ranks in parallel.
pub fn make_fleet(source: &Path, ranks: u32, steps: u32, dir: &Path) -> Truth {
    use rayon::prelude::*;
    assert!(ranks >= 8, "a fleet of at least 8 ranks");
    let source = snapdiff_format::read_path(source).expect("a readable fixture");
    let device = source
        .traces
        .iter()
        .find(|t| t.events.iter().any(|e| e.action == Action::Alloc))
        .expect("a trace with allocations")
        .device;
    let events = trace_of(&source, device).len();
    let (big, big_bytes, _, big_line) = transient_alloc(&source, device, 1 << 20, &[]);
    let (small, small_bytes, _, small_line) =
        transient_alloc(&source, device, 64 << 10, &[&big_line]);
    let (_, _, held_stack, held_line) =
        transient_alloc(&source, device, 1, &[&big_line, &small_line]);
    let leaking_big = [7, ranks * 2 / 3 + 1];
    let leaking_small = [ranks / 3 + 2];
    let job_of = |rank: u32| {
        let extra = if leaking_big.contains(&rank) {
            Extra::KeepBlock { alloc: big }
        } else if leaking_small.contains(&rank) {
            Extra::KeepBlock { alloc: small }
        } else if rank == 0 {
            Extra::HoldFromStart {
                stack: held_stack,
                bytes: HELD_BYTES,
            }
        } else {
            return None; // a steady rank
        };
        Some(Job::steady(steps as usize).with(extra))
    };
    // Every steady rank replays the same job: it is run once, its dumps
    // cut to one step's trace events, and each rank given its own
    // addresses and sizes from them (10,000 ranks in minutes).
    let mut steady = Vec::new();
    Job::steady(steps as usize).run_dumping(&source, device, &mut |step, mut snap| {
        for trace in &mut snap.traces {
            let keep = trace.events.len().saturating_sub(events);
            let kept: Vec<_> = trace.events.iter().skip(keep).collect();
            trace.events = kept.into();
        }
        steady.push((step, snap));
    });
    let written: Vec<(usize, u64)> = (0..ranks)
        .into_par_iter()
        .map(|rank| {
            let node = dir.join(format!("node{}", rank / 8));
            std::fs::create_dir_all(&node).expect("a node folder");
            let mut files = (0, 0);
            let mut write = |step: usize, snap: Snapshot| {
                let path = node.join(format!("rank{rank}-step{step}.snap"));
                let snap = as_rank(snap, rank, step as u32, events);
                snapdiff_format::write_path(&path, &snap, Existing::Replace).expect("a snapshot");
                files.0 += 1;
                files.1 += std::fs::metadata(&path).map_or(0, |m| m.len());
            };
            match job_of(rank) {
                Some(job) => {
                    job.run_dumping(&source, device, &mut write);
                }
                None => steady
                    .iter()
                    .for_each(|(step, snap)| write(*step, snap.clone())),
            }
            files
        })
        .collect();
    let leak = |culprit: Culprit, ranks: &[u32], bytes: u64, stack: StackId| TruthLeak {
        culprit,
        ranks: ranks
            .iter()
            .map(|&r| (r, jittered(r, Some(stack), bytes)))
            .collect(),
    };
    let events = trace_of(&source, device);
    let stack_of = |alloc: usize| events[alloc].stack.expect("a stack");
    Truth {
        leaks: vec![
            leak(big_line, &leaking_big, big_bytes, stack_of(big)),
            leak(small_line, &leaking_small, small_bytes, stack_of(small)),
        ],
        held_by_rank0: held_line,
        held_bytes: jittered(0, Some(held_stack), HELD_BYTES),
        files: written.iter().map(|w| w.0).sum(),
        bytes: written.iter().map(|w| w.1).sum(),
    }
}
