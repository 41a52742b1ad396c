//! What a block of memory is for: parameters, gradients, optimizer state,
//! activations, told from the stack that allocated it.
//!
//! PyTorch records no purpose with an allocation, but its stacks say where
//! it came from: an optimizer's `step` (in `torch/optim/`), the autograd
//! engine running a backward function, a module being moved or loaded
//! (`Module._apply`, `load_state_dict`), a module's forward
//! (`Module._call_impl`). A stack that shows none of these is `Unknown`:
//! nothing is guessed.

use serde::Serialize;
use snapdiff_format::{Frame, Snapshot, StackId};

/// What a block is for. Declared from the strongest evidence to the
/// weakest: a stack with an optimizer's frame is the optimizer's even when
/// the training loop around it runs a module's forward, and a backward
/// function's allocation is the backward's though a module's call is
/// further out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
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
}

impl<'a> Categories<'a> {
    /// What each distinct frame of `snap` says on its own.
    pub fn new(snap: &'a Snapshot) -> Categories<'a> {
        Categories {
            snap,
            frames: snap.frames.iter().map(frame_category).collect(),
        }
    }

    /// The category of stack `stack`: the strongest evidence among its frames.
    pub fn of(&self, stack: Option<StackId>) -> Category {
        stack
            .and_then(|s| {
                self.snap.stacks[s as usize]
                    .iter()
                    .filter_map(|&f| self.frames[f as usize])
                    .min()
            })
            .unwrap_or(Category::Unknown)
    }
}

/// What one frame says about its stack, if anything.
fn frame_category(frame: &Frame) -> Option<Category> {
    let name = frame.name.as_str();
    let file = frame.file.replace('\\', "/");
    let in_torch = |module: &str| file.contains(&format!("/torch/{module}"));
    if in_torch("optim/") || name.starts_with("Optimizer.step") {
        return Some(Category::OptimizerState);
    }
    if name.contains("torch::autograd::Engine::")
        || name.contains("torch::autograd::generated::")
        || name.contains("AccumulateGrad")
        || (in_torch("autograd/") && (name == "backward" || name == "_engine_run_backward"))
    {
        return Some(Category::Backward);
    }
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
