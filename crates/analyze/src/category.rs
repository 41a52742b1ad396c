//! What a block of memory is for: parameters, gradients, optimizer state,
//! activations, told from the stack that allocated it.
//!
//! PyTorch records no purpose with an allocation, but its stacks say where
//! it came from: an optimizer's `step` (in `torch/optim/`), the autograd
//! engine running a backward function (or anomaly mode's forward frames
//! after a backward allocation's own), a module being moved or loaded
//! (`Module._apply`, `load_state_dict`), a module's forward
//! (`Module._call_impl`). A stack that shows none of these is `Unknown`:
//! nothing is guessed.

use std::borrow::Cow;
use std::sync::LazyLock;

use memchr::memmem;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use snapdiff_format::{Action, Frame, Snapshot, StackId};

/// What a block is for. Declared from the strongest evidence to the
/// weakest: a stack with an optimizer's frame is the optimizer's even when
/// the training loop around it runs a module's forward, and a backward
/// function's allocation is the backward's though a module's call is
/// further out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Made by an optimizer's `step`: its state (Adam's moments) and
    /// temporaries.
    OptimizerState,
    /// Made by the backward pass (the autograd engine, `backward()`): the
    /// gradients, and backward temporaries live at that moment.
    Backward,
    /// Made while a module's parameters were created, moved or loaded
    /// (`Module.__init__`, `_apply`/`to`/`cuda`, `load_state_dict`).
    Parameters,
    /// Made inside a module's forward: activations kept for backward, and
    /// temporaries.
    Activations,
    /// Allocated before recording began, with no stack or one that shows
    /// none of the above (on a training job, mostly the parameters, which
    /// are made before anyone turns recording on).
    BeforeRecording,
    /// The stack shows none of the above.
    Unknown,
}

impl Category {
    /// Every category, strongest evidence first.
    const ALL: [Category; 6] = [
        Category::OptimizerState,
        Category::Backward,
        Category::Parameters,
        Category::Activations,
        Category::BeforeRecording,
        Category::Unknown,
    ];
    const COUNT: usize = Category::ALL.len();

    /// The category as reports name it.
    pub fn label(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::Backward => "gradients and backward",
            Category::OptimizerState => "optimizer state",
            Category::Activations => "activations and temporaries",
            Category::BeforeRecording => "before recording (stack says nothing)",
            Category::Unknown => "unknown",
        }
    }
}

/// Categories of the stacks of one snapshot, each distinct frame looked at
/// once.
pub struct Categories<'a> {
    snap: &'a Snapshot,
    frames: Vec<Option<Category>>,
    /// What the allocations made with each stack say beyond their frames:
    /// the annotated region they fell in (`record_function`, as PyTorch's
    /// `external_annotations` record them) and their compile context.
    regions: FxHashMap<StackId, Category>,
}

impl<'a> Categories<'a> {
    /// What each distinct frame of `snap` says on its own, and what its
    /// annotations and compile contexts say of the allocations in them.
    pub fn new(snap: &'a Snapshot) -> Categories<'a> {
        Categories {
            snap,
            frames: snap.frames.iter().map(frame_category).collect(),
            regions: region_categories(snap),
        }
    }

    /// The category of stack `stack`: the strongest evidence among its
    /// frames and the regions its allocations were made in.
    pub fn of(&self, stack: Option<StackId>) -> Category {
        stack
            .and_then(|s| {
                self.snap.stacks[s as usize]
                    .iter()
                    .filter_map(|&f| self.frames[f as usize])
                    .chain(self.regions.get(&s).copied())
                    .min()
            })
            .unwrap_or(Category::Unknown)
    }
}

/// What the name of an annotated region or a compile context says of the
/// allocations made in it: PyTorch names an optimizer's step
/// `Optimizer.step#AdamW.step`, the profiler's passes `## forward ##` and
/// `## backward ##`, and AOT autograd's compiled graphs forward and
/// backward.
fn region_category(name: &str) -> Option<Category> {
    let name = name.to_ascii_lowercase();
    if name.starts_with("optimizer.step") {
        Some(Category::OptimizerState)
    } else if name.contains("backward") {
        Some(Category::Backward)
    } else if name.contains("forward") {
        Some(Category::Activations)
    } else {
        None
    }
}

/// The strongest category the regions give each stack's allocations.
fn region_categories(snap: &Snapshot) -> FxHashMap<StackId, Category> {
    // Annotated regions with a category: (device, start, end, category),
    // each START paired with the next END of the same name and device.
    let mut open: FxHashMap<(u32, &str), Vec<i64>> = FxHashMap::default();
    let mut regions: Vec<(u32, i64, i64, Category)> = Vec::new();
    let mut annotations: Vec<_> = snap.annotations.iter().collect();
    annotations.sort_by_key(|a| a.time_us);
    for a in annotations {
        let (Some(name), Some(stage), Some(time)) = (&a.name, &a.stage, a.time_us) else {
            continue;
        };
        let Some(category) = region_category(name) else {
            continue;
        };
        match stage.as_str() {
            "START" => open.entry((a.device, name)).or_default().push(time),
            "END" => {
                if let Some(start) = open.get_mut(&(a.device, name.as_str())).and_then(Vec::pop) {
                    regions.push((a.device, start, time, category));
                }
            }
            _ => {}
        }
    }
    let contexts: Vec<Option<Category>> = snap.strings.iter().map(|s| region_category(s)).collect();
    let mut by_stack: FxHashMap<StackId, Category> = FxHashMap::default();
    if regions.is_empty() && contexts.iter().all(Option::is_none) {
        // No allocation is in a region or a context that says anything.
        return by_stack;
    }
    for trace in &snap.traces {
        // A sweep through the trace (in time order) over the device's
        // regions' starts and ends, counting the regions open per category.
        let mine = || regions.iter().filter(|r| r.0 == trace.device);
        let mut starts: Vec<(i64, Category)> = mine().map(|r| (r.1, r.3)).collect();
        let mut ends: Vec<(i64, Category)> = mine().map(|r| (r.2, r.3)).collect();
        starts.sort_unstable();
        ends.sort_unstable();
        let (mut next_start, mut next_end) = (0, 0);
        let mut open_regions = [0u32; Category::COUNT];
        for e in trace.events.iter().filter(|e| e.action == Action::Alloc) {
            let Some(stack) = e.stack else { continue };
            let in_region = e.time_us.and_then(|t| {
                while let Some(&(start, c)) = starts.get(next_start)
                    && start <= t
                {
                    open_regions[c as usize] += 1;
                    next_start += 1;
                }
                while let Some(&(end, c)) = ends.get(next_end)
                    && end < t
                {
                    open_regions[c as usize] = open_regions[c as usize].saturating_sub(1);
                    next_end += 1;
                }
                Category::ALL
                    .into_iter()
                    .find(|&c| open_regions[c as usize] > 0)
            });
            let in_context = e.compile_context.and_then(|c| contexts[c as usize]);
            if let Some(c) = in_region.into_iter().chain(in_context).min() {
                let entry = by_stack.entry(stack).or_insert(c);
                *entry = (*entry).min(c);
            }
        }
    }
    by_stack
}

/// Finders for what [`frame_category`] looks for, built once: it looks at
/// every distinct frame of every file a fleet reads, and most frames hold
/// none of it.
struct Needles {
    torch_folder: memmem::Finder<'static>,
    autograd: memmem::Finder<'static>,
    accumulate_grad: memmem::Finder<'static>,
}

static NEEDLES: LazyLock<Needles> = LazyLock::new(|| Needles {
    torch_folder: memmem::Finder::new("/torch/"),
    autograd: memmem::Finder::new("torch::autograd::"),
    accumulate_grad: memmem::Finder::new("AccumulateGrad"),
});

/// What one frame says about its stack, if anything.
fn frame_category(frame: &Frame) -> Option<Category> {
    let needles = &*NEEDLES;
    let name = frame.name.as_str();
    let file: Cow<'_, str> = if frame.file.contains('\\') {
        frame.file.replace('\\', "/").into()
    } else {
        frame.file.as_str().into()
    };
    // What follows each `/torch/` of the path (`optim/adamw.py`).
    let torch_at = needles.torch_folder.find(file.as_bytes());
    let in_torch = |module: &str| {
        torch_at.is_some()
            && needles
                .torch_folder
                .find_iter(file.as_bytes())
                .any(|at| file[at + "/torch/".len()..].starts_with(module))
    };
    if in_torch("optim/") || name.starts_with("Optimizer.step") {
        return Some(Category::OptimizerState);
    }
    let in_autograd = |what: &str| {
        needles
            .autograd
            .find_iter(name.as_bytes())
            .any(|at| name[at + "torch::autograd::".len()..].starts_with(what))
    };
    // Anomaly mode's forward frames follow a backward allocation's own.
    if frame.is_forward_marker()
        || in_autograd("Engine::")
        || in_autograd("generated::")
        || needles.accumulate_grad.find(name.as_bytes()).is_some()
        || (in_torch("autograd/") && (name == "backward" || name == "_engine_run_backward"))
    {
        return Some(Category::Backward);
    }
    // Beyond here only torch's own files say anything.
    torch_at?;
    if in_torch("nn/modules/module.py")
        && matches!(
            name,
            "_apply" | "to" | "cuda" | "load_state_dict" | "_load_from_state_dict"
        )
        || in_torch("nn/parameter.py")
        || (in_torch("nn/modules/") && (name == "__init__" || name == "reset_parameters"))
    {
        return Some(Category::Parameters);
    }
    if in_torch("nn/modules/module.py") && matches!(name, "_call_impl" | "_wrapped_call_impl") {
        return Some(Category::Activations);
    }
    None
}

#[cfg(test)]
mod tests {
    use snapdiff_format::{Annotation, DeviceTrace, Snapshot, TraceEvent};

    use super::*;
    use crate::stack_key::test_frame;

    #[test]
    fn annotated_regions_and_compile_contexts_name_what_their_allocations_are() {
        let mut snap = Snapshot::default();
        // Three stacks of one frame of plain user code, which says nothing.
        for k in 0..3 {
            snap.frames
                .push(test_frame("f", &format!("train{k}.py"), 1));
            snap.stacks.push(vec![k]);
        }
        snap.strings = vec!["N/A".into(), "[0/0] backward".into()];
        let region = |stage: &str, time: i64| Annotation {
            device: 0,
            time_us: Some(time),
            name: Some("Optimizer.step#AdamW.step".into()),
            stage: Some(stage.into()),
            extra: vec![],
        };
        snap.annotations = vec![region("START", 100), region("END", 200)];
        let alloc = |stack: u32, time: i64, context: u32| TraceEvent {
            action: Action::Alloc,
            stack: Some(stack),
            time_us: Some(time),
            compile_context: Some(context),
            ..TraceEvent::default()
        };
        snap.traces.push(DeviceTrace {
            device: 0,
            events: vec![alloc(0, 50, 0), alloc(1, 150, 0), alloc(2, 250, 1)].into(),
        });
        let categories = Categories::new(&snap);
        assert_eq!(
            categories.of(Some(0)),
            Category::Unknown,
            "before the region"
        );
        assert_eq!(
            categories.of(Some(1)),
            Category::OptimizerState,
            "inside it"
        );
        assert_eq!(
            categories.of(Some(2)),
            Category::Backward,
            "compiled backward"
        );
    }
}
