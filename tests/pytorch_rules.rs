//! The runtime's caching allocator against PyTorch's own, on real traces:
//! fed the requests of a real trace in order, it must hand out the addresses
//! PyTorch handed out, obtain and release the segments PyTorch did, and end
//! with PyTorch's final segments and blocks.

use snapdiff_format::{Action, Snapshot};
use snapdiff_runtime::AllocatorConfig;

use crate::pytorch_replay::{NotReplayable, Replay, start_state, trace_of};
use crate::util::shared_torch_fixtures;

/// No stacks, no trace: only the allocator's decisions matter here.
fn bare() -> AllocatorConfig {
    AllocatorConfig {
        record_stacks: false,
        trace_entries: 0,
        dump_dir: None,
        ..AllocatorConfig::default()
    }
}

/// Segments as (address, size, blocks), blocks as (address, size, active).
type Layout = Vec<(u64, u64, Vec<(u64, u64, bool)>)>;

/// Every segment of `device`, with its blocks, in address order.
fn layout(snap: &Snapshot, device: u32) -> Layout {
    let mut segments: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| (b.address, b.size, b.state.is_active()))
                .collect();
            (s.address, s.total_size, blocks)
        })
        .collect();
    segments.sort();
    segments
}

#[test]
fn the_runtime_allocates_where_pytorch_did_on_every_real_trace() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let mut checked = std::collections::BTreeMap::<String, usize>::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy();
        let snap = snapdiff_format::read_path(file).unwrap();
        for trace in &snap.traces {
            if !trace.events.iter().any(|e| e.action == Action::Alloc) {
                continue; // an idle device
            }
            let start = match start_state(&snap, trace.device) {
                Ok(start) => start,
                // The runtime obtains whole segments; PyTorch's expandable
                // segments map pages into one growing range instead, so
                // there is nothing to compare the runtime's segments with.
                Err(NotReplayable::ExpandableSegments) => {
                    assert_eq!(name, "snapviewer-memory.pickle");
                    continue;
                }
            };
            let mut replay = Replay::new(trace.device, &start, bare());
            replay
                .run(&trace_of(&snap, trace.device), |_, e, _| {
                    *checked.entry(e.action.name().to_owned()).or_default() += 1;
                })
                .unwrap_or_else(|d| panic!("{name}: event {}: {}", d.event, d.what));
            assert_eq!(
                layout(&replay.allocator.snapshot(), trace.device),
                layout(&snap, trace.device),
                "{name}: the final segments and blocks"
            );
        }
    }
    // Every kind of decision was exercised: reuse, new segments, releases.
    for action in ["alloc", "free_completed", "segment_alloc", "segment_free"] {
        assert!(
            checked.get(action).copied().unwrap_or(0) > 500,
            "{action}: {checked:?}"
        );
    }
}
