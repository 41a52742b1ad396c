//! Writes large synthetic snapshots for the end-to-end benchmarks in
//! `bench/analyze.sh`:
//!
//! ```text
//! cargo run --release -p snapdiff-analyze --example make_large -- DIR [EVENTS]
//! ```
//!
//! - `DIR/blocks-before.snap`, `DIR/blocks-after.snap`: 1,000,000 live blocks
//!   each, in 20-block segments, from 2,000 stacks of 30 frames; "after" has
//!   1% of the blocks replaced by new ones of a leaking site.
//! - `DIR/trace-10m.snap`: a trace of 10,000,000 events (alloc and
//!   free_completed pairs, with step marks), one site leaking a block per step;
//!   with `EVENTS` (in millions), a trace of that many as a PyTorch pickle
//!   instead, `DIR/trace-<EVENTS>m.pickle` (100 million: 4.3 GB, a pickle
//!   past 4 GiB).

use snapdiff_format::{
    Action, Block, BlockState, DeviceTrace, Events, Frame, Meta, Pool, Segment, Snapshot,
    TraceEvent,
};

const STACKS: u32 = 2_000;
const DEPTH: u32 = 30;

fn frames_and_stacks() -> (Vec<Frame>, Vec<Vec<u32>>) {
    let mut frames = Vec::new();
    let mut stacks = Vec::new();
    for s in 0..STACKS {
        let mut stack = Vec::new();
        for d in 0..DEPTH {
            stack.push(frames.len() as u32);
            let file = if d < DEPTH - 3 {
                format!("/venv/lib/python3.11/site-packages/lib{d}.py")
            } else {
                "/home/u/train.py".into()
            };
            frames.push(Frame {
                name: format!("fn_{s}_{d}").into(),
                file: file.into(),
                line: 10 + d,
                extra: vec![],
            });
        }
        stacks.push(stack);
    }
    (frames, stacks)
}

fn meta() -> Meta {
    Meta {
        producer: Meta::PRODUCER_RUNTIME.into(),
        run_id: Some("bench".into()),
        ..Meta::default()
    }
}

fn blocks_snapshot(leak: bool) -> Snapshot {
    let (frames, stacks) = frames_and_stacks();
    let mut segments = Vec::new();
    let mut seq = 0u64;
    for seg in 0..50_000u64 {
        let address = 0x7f00_0000_0000 + seg * (20 << 20);
        let blocks = (0..20u64)
            .map(|i| {
                seq += 1;
                let replaced = leak && seq.is_multiple_of(100);
                Block {
                    address: address + i * (1 << 20),
                    size: 1 << 20,
                    requested_size: (1 << 20) - 100,
                    state: BlockState::ActiveAllocated,
                    stack: Some(if replaced {
                        0
                    } else {
                        (seq % u64::from(STACKS)) as u32
                    }),
                    alloc_seq: Some(if replaced { 10_000_000 + seq } else { seq }),
                    ..Block::default()
                }
            })
            .collect();
        segments.push(Segment {
            address,
            total_size: 20 << 20,
            pool: Pool::Large,
            blocks,
            ..Segment::default()
        });
    }
    Snapshot {
        meta: meta(),
        frames,
        stacks,
        segments,
        ..Snapshot::default()
    }
}

fn trace_snapshot(n: usize) -> Snapshot {
    let (frames, stacks) = frames_and_stacks();
    let mut events = Events::with_capacity(n);
    let mut time = 1_700_000_000_000_000i64;
    let mut step = 0u64;
    let mut leaked = 0u64;
    while events.len() < n {
        step += 1;
        events.push(TraceEvent {
            action: Action::Step,
            size: step,
            time_us: Some(time),
            ..TraceEvent::default()
        });
        // Each step allocates and frees 1000 activations, and leaks one block.
        for i in 0..1000u64 {
            time += 3;
            let address = 0x7f00_0000_0000 + i * 4096;
            let stack = Some((1 + i % u64::from(STACKS - 1)) as u32);
            events.push(TraceEvent {
                action: Action::Alloc,
                address,
                size: 4096,
                time_us: Some(time),
                stack,
                ..TraceEvent::default()
            });
        }
        for i in 0..1000u64 {
            time += 3;
            let address = 0x7f00_0000_0000 + i * 4096;
            events.push(TraceEvent {
                action: Action::FreeCompleted,
                address,
                size: 4096,
                time_us: Some(time),
                ..TraceEvent::default()
            });
        }
        leaked += 1;
        events.push(TraceEvent {
            action: Action::Alloc,
            address: 0x7e00_0000_0000 + leaked * (1 << 20),
            size: 1 << 20,
            time_us: Some(time),
            stack: Some(0),
            ..TraceEvent::default()
        });
    }
    Snapshot {
        meta: meta(),
        frames,
        stacks,
        traces: vec![DeviceTrace { device: 0, events }],
        ..Snapshot::default()
    }
}

fn main() {
    let usage = "usage: make_large DIR [EVENTS, in millions]";
    let dir = std::path::PathBuf::from(std::env::args().nth(1).expect(usage));
    let millions: Option<usize> = std::env::args().nth(2).map(|n| n.parse().expect(usage));
    std::fs::create_dir_all(&dir).unwrap();
    snapdiff_format::write_path(
        dir.join("blocks-before.snap"),
        &blocks_snapshot(false),
        snapdiff_format::Existing::Replace,
    )
    .unwrap();
    snapdiff_format::write_path(
        dir.join("blocks-after.snap"),
        &blocks_snapshot(true),
        snapdiff_format::Existing::Replace,
    )
    .unwrap();
    let Some(millions) = millions else {
        snapdiff_format::write_path(
            dir.join("trace-10m.snap"),
            &trace_snapshot(10_000_000),
            snapdiff_format::Existing::Replace,
        )
        .unwrap();
        return;
    };
    let path = dir.join(format!("trace-{millions}m.pickle"));
    let out = std::fs::File::create(&path).unwrap();
    snapdiff_format::write_torch_pickle(&trace_snapshot(millions * 1_000_000), out).unwrap();
}
