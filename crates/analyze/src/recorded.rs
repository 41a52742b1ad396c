//! What PyTorch recorded with a site's allocations besides their stack: the
//! labels `torch.cuda.memory._annotate_memory` gave its blocks, the compiled
//! regions (`compile_context`) and the user metadata
//! (`torch.cuda.memory._set_memory_metadata`) of its `alloc` events.

use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_format::{Action, Snapshot, StackId, StrId};

/// The most distinct values of each kind a site keeps: enough to tell
/// what its memory is, few enough for a report's cell.
const MOST: usize = 3;

/// What was recorded with a site's allocations, each list in the order
/// first seen, at most three values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Recorded {
    /// Labels the program gave its blocks (`annotate` trace entries).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// The `torch.compile` regions its blocks were allocated in.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compiled_regions: Vec<String>,
    /// The user metadata set when its blocks were allocated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metadata: Vec<String>,
}

impl Recorded {
    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.compiled_regions.is_empty() && self.metadata.is_empty()
    }

    /// Adds what `other` holds that this does not, up to the limit.
    pub(crate) fn merge(&mut self, other: &Recorded) {
        for (into, from) in [
            (&mut self.labels, &other.labels),
            (&mut self.compiled_regions, &other.compiled_regions),
            (&mut self.metadata, &other.metadata),
        ] {
            for value in from {
                push_distinct(into, value);
            }
        }
    }
}

fn push_distinct(list: &mut Vec<String>, value: &str) {
    if list.len() < MOST && !list.iter().any(|v| v == value) {
        list.push(value.to_owned());
    }
}

/// What was recorded with the allocations of each stack of `snap`; empty
/// (and no trace is read) when the file records none of it.
pub(crate) fn recorded_by_stack(snap: &Snapshot) -> FxHashMap<StackId, Recorded> {
    let mut out: FxHashMap<StackId, Recorded> = FxHashMap::default();
    // PyTorch writes "N/A" outside compiled regions and "" without metadata.
    let meaningful: Vec<bool> = snap
        .strings
        .iter()
        .map(|s| !s.is_empty() && s != "N/A")
        .collect();
    let annotates = snap
        .traces
        .iter()
        .any(|t| t.events.has_action(&Action::Annotate));
    if !annotates && !meaningful.contains(&true) {
        return out;
    }
    let text = |id: Option<StrId>| {
        id.filter(|&i| meaningful.get(i as usize) == Some(&true))
            .map(|i| snap.strings[i as usize].as_str())
    };
    for trace in &snap.traces {
        // The stack of the block at each address: the segments' blocks
        // (allocated before recording, perhaps), then each `alloc`.
        let mut stack_at: FxHashMap<u64, StackId> = FxHashMap::default();
        if annotates {
            for seg in snap.segments.iter().filter(|s| s.device == trace.device) {
                for b in &seg.blocks {
                    if let Some(stack) = b.stack {
                        stack_at.insert(b.address, stack);
                    }
                }
            }
        }
        for e in trace.events.iter() {
            match e.action {
                Action::Alloc => {
                    let Some(stack) = e.stack else { continue };
                    if annotates {
                        stack_at.insert(e.address, stack);
                    }
                    let (region, metadata) = (text(e.compile_context), text(e.user_metadata));
                    if region.is_some() || metadata.is_some() {
                        let r = out.entry(stack).or_default();
                        if let Some(v) = region {
                            push_distinct(&mut r.compiled_regions, v);
                        }
                        if let Some(v) = metadata {
                            push_distinct(&mut r.metadata, v);
                        }
                    }
                }
                Action::Annotate => {
                    let label = text(e.user_metadata);
                    if let (Some(label), Some(&stack)) = (label, stack_at.get(&e.address)) {
                        push_distinct(&mut out.entry(stack).or_default().labels, label);
                    }
                }
                _ => {}
            }
        }
    }
    out
}
