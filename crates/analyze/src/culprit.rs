//! The culprit of a stack: the frame a person should look at first.
//!
//! It is the innermost frame of the program's own code: not the allocator,
//! not the interpreter, not a framework (torch, site-packages, the Rust
//! standard library, crates from the registry, snapdiff itself). `--focus`
//! and `--ignore` adjust the choice. Allocations made where the program has
//! no frame at all (PyTorch's autograd thread records only C++ frames) fall
//! back to the first frame past the allocation plumbing, and say so.

use regex::Regex;
use serde::Serialize;
use snapdiff_format::Frame;

use crate::frame_class::{
    FrameClass, classify_known, is_vendored, named_like_package, notebook_cell,
};
use crate::stack_key::is_noise;

/// How a culprit was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CulpritKind {
    /// The innermost frame of the program's own code.
    User,
    /// The innermost frame matching `--focus`.
    Focus,
    /// A backward allocation's: the innermost frame of the program's own
    /// code in the forward pass that caused it (anomaly mode's
    /// `forward_frames`).
    Forward,
    /// No frame of the program's own code: the first frame past the allocator
    /// and tensor-allocation plumbing (e.g. the operator that allocated).
    Fallback,
    /// The allocation has no recorded stack.
    NoStack,
}

/// The frame to look at for a group of allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Culprit {
    /// Function name.
    pub name: String,
    /// Source file.
    pub file: String,
    /// Line number (0 when unknown).
    pub line: u32,
    /// How it was chosen.
    pub kind: CulpritKind,
}

impl Culprit {
    /// `function  file:line`, with C++ argument lists left out.
    pub fn display(&self) -> String {
        self.display_from("")
    }

    /// [`Culprit::display`] with the file shown relative to folder `base`
    /// (a path prefix ending in a separator, see [`common_base`]), with `/`
    /// between its parts whatever the OS that recorded it; files outside
    /// `base` are shown whole.
    pub fn display_from(&self, base: &str) -> String {
        let file = match self.file.strip_prefix(base) {
            Some(rest) if !base.is_empty() => rest.replace('\\', "/"),
            _ => self.file.clone(),
        };
        match self.kind {
            CulpritKind::NoStack => "(no stack recorded)".to_owned(),
            _ => {
                let location = match (file.as_str(), self.line) {
                    (file, line) if notebook_cell(file).is_some() => {
                        let cell = notebook_cell(file).map(|c| c.to_string());
                        format!("  {}, line {line}", cell.unwrap_or_default())
                    }
                    ("" | "??", _) => String::new(),
                    (file, 0) => format!("  {file}"),
                    (file, line) => format!("  {file}:{line}"),
                };
                // Names and paths come from the file: escaped, so that a
                // newline or a bidi control cannot forge or reverse a line.
                let name = short_name(&self.name);
                let text = match self.kind {
                    CulpritKind::Forward => format!("backward of {name}{location}"),
                    _ => format!("{name}{location}"),
                };
                match snapdiff_format::visible::escaped(&text) {
                    std::borrow::Cow::Borrowed(_) => text,
                    std::borrow::Cow::Owned(escaped) => escaped,
                }
            }
        }
    }
}

/// The longest folder that holds all of `files` (absolute paths of the
/// program's own code), ending in its separator, for showing them relative
/// to it: `/home/ana/proj/` for `/home/ana/proj/train.py` and
/// `/home/ana/proj/lib/model.py`. The working directory when it holds them
/// all; empty when they share no folder below the root.
pub fn common_base<'a>(files: impl IntoIterator<Item = &'a str>, cwd: Option<&str>) -> String {
    let files: Vec<&str> = files.into_iter().collect();
    if files.is_empty() {
        return String::new();
    }
    if let Some(cwd) = cwd {
        let cwd = format!("{}/", cwd.trim_end_matches('/'));
        if cwd.len() > 1 && files.iter().all(|f| f.starts_with(&cwd)) {
            return cwd;
        }
    }
    // The common prefix, cut back to its last separator.
    let first = files[0];
    let mut len = first.len();
    for f in &files[1..] {
        len = first
            .bytes()
            .zip(f.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count();
    }
    let prefix = &first[..len];
    let base = match prefix.rfind(['/', '\\']) {
        Some(i) => &first[..=i],
        None => "",
    };
    // A root alone (`/`, `C:\`, `\\server\`) says nothing worth removing.
    let parts = base.split(['/', '\\']).filter(|p| !p.is_empty()).count();
    if parts < 2 {
        String::new()
    } else {
        base.to_owned()
    }
}

/// A C++ name without its argument list and qualifiers:
/// `at::_ops::add::call(at::Tensor const&)` → `at::_ops::add::call`, and so
/// for `reduce_grad(at::Tensor&) const`.
pub fn short_name(name: &str) -> &str {
    let unqualified = [" const", " volatile", " &&", " &", " noexcept"]
        .iter()
        .find_map(|q| name.strip_suffix(q).filter(|n| n.ends_with(')')));
    let name = unqualified.unwrap_or(name);
    if name.ends_with(')') && !name.starts_with('<') {
        // Cut at the '(' that opens the final argument list.
        let mut depth = 0usize;
        for (i, c) in name.char_indices().rev() {
            match c {
                ')' => depth += 1,
                '(' => {
                    depth -= 1;
                    if depth == 0 {
                        return if i > 0 { &name[..i] } else { name };
                    }
                }
                _ => {}
            }
        }
    }
    name
}

/// Allocation plumbing: where tensors get their memory, never why.
const PLUMBING: &[&str] = &[
    "at::detail::",
    "at::empty",
    "at::native::empty",
    "empty_strided",
    "empty_cuda",
    "empty_generic",
    "create_out",
    "set_output",
    "resize_",
    "::allocate(",
    "::malloc(",
    "c10::",
];

/// Chooses culprits. Built once from `--focus` and `--ignore`.
#[derive(Clone, Debug, Default)]
pub struct CulpritRules {
    focus: Option<Regex>,
    ignore: Option<Regex>,
    library: Option<Regex>,
    by_stack: bool,
}

impl CulpritRules {
    /// Rules with optional `focus` and `ignore` regular expressions, matched
    /// against `function file:line` of each frame.
    ///
    /// # Errors
    ///
    /// When a pattern is not a valid regular expression.
    pub fn new(focus: Option<&str>, ignore: Option<&str>) -> Result<CulpritRules, regex::Error> {
        Ok(CulpritRules {
            focus: focus.map(Regex::new).transpose()?,
            ignore: ignore.map(Regex::new).transpose()?,
            library: None,
            by_stack: false,
        })
    }

    /// These rules, with a report row for each whole stack (`by_stack`) or,
    /// by default, one for each culprit line: sites whose stacks differ but
    /// whose culprits are the same line of code are then one row.
    pub fn with_rows_by_stack(mut self, by_stack: bool) -> CulpritRules {
        self.by_stack = by_stack;
        self
    }

    /// Whether reports keep one row per whole stack; see
    /// [`with_rows_by_stack`](CulpritRules::with_rows_by_stack).
    pub fn rows_by_stack(&self) -> bool {
        self.by_stack
    }

    /// These rules, with frames whose `function file:line` matches `library`
    /// counted as a library's (a company's own framework, say), never as the
    /// program's.
    ///
    /// # Errors
    ///
    /// When the pattern is not a valid regular expression.
    pub fn with_library(mut self, library: Option<&str>) -> Result<CulpritRules, regex::Error> {
        self.library = library.map(Regex::new).transpose()?;
        Ok(self)
    }

    fn matches(re: &Option<Regex>, f: &Frame) -> bool {
        re.as_ref()
            .is_some_and(|re| re.is_match(&format!("{} {}:{}", f.name, f.file, f.line)))
    }

    /// Whether `f` is a frame `--ignore` leaves out.
    pub fn ignored(&self, f: &Frame) -> bool {
        Self::matches(&self.ignore, f)
    }

    /// Whether `f` is the program's own code (see [`crate::classify`]), and not
    /// left out by `--ignore` or `--library`.
    pub fn is_user(&self, f: &Frame) -> bool {
        self.role(f).user
    }

    /// What `f` is to these rules. A snapshot's stacks share a few thousand
    /// distinct frames, so callers describing many stacks work this out once
    /// per frame and pass it to [`CulpritRules::culprit_of`].
    pub fn role(&self, f: &Frame) -> FrameRole {
        self.role_known(f, is_noise(f))
    }

    /// [`CulpritRules::role`], whether `f` is noise known already (a
    /// snapshot's [`crate::StackKeys`] know it of each of its frames).
    pub(crate) fn role_known(&self, f: &Frame, noise: bool) -> FrameRole {
        let ignored = self.ignored(f);
        let forward_marker = f.is_forward_marker();
        let class = classify_known(f, noise);
        let user =
            !forward_marker && class.is_program() && !ignored && !Self::matches(&self.library, f);
        FrameRole {
            forward_marker,
            noise: class == FrameClass::Noise,
            user,
            entry: user && class == FrameClass::User,
            named_like_package: user && named_like_package(&f.file),
            ignored,
            focus: Self::matches(&self.focus, f),
            plumbing: PLUMBING.iter().any(|p| f.name.contains(p)),
        }
    }

    /// The culprit of a stack, innermost frame first.
    pub fn culprit<'a>(&self, frames: impl IntoIterator<Item = &'a Frame>) -> Culprit {
        let frames: Vec<_> = frames.into_iter().map(|f| (f, self.role(f))).collect();
        self.culprit_of(frames.into_iter())
    }

    /// The culprit of a stack whose frames' roles are known, innermost first.
    pub fn culprit_of<'a>(
        &self,
        frames: impl Iterator<Item = (&'a Frame, FrameRole)> + Clone,
    ) -> Culprit {
        match self.culprit_frame(frames) {
            Some((f, kind)) => Culprit {
                name: f.name.to_string(),
                file: f.file.to_string(),
                line: f.line,
                kind,
            },
            None => Culprit {
                name: String::new(),
                file: String::new(),
                line: 0,
                kind: CulpritKind::NoStack,
            },
        }
    }

    /// The frame [`culprit_of`](CulpritRules::culprit_of) names, not
    /// copied, and how it was chosen; `None` for no stack.
    pub(crate) fn culprit_frame<'a>(
        &self,
        frames: impl Iterator<Item = (&'a Frame, FrameRole)> + Clone,
    ) -> Option<(&'a Frame, CulpritKind)> {
        if self.focus.is_some()
            && let Some((f, _)) = frames.clone().find(|(_, r)| r.focus)
        {
            return Some((f, CulpritKind::Focus));
        }
        // The program's script: its outermost frame of its own code in no
        // folder named like a library, else its outermost frame of its own
        // code (a checkout named `lightning`). Library copies inside its
        // tree are told from its own files by it. The first choice holds
        // when a stack is cut short of the script: a copy of transformers
        // calling the program's layer calling the copy again. Looked for
        // only when such a folder is met: a walk for it, one for the focus
        // and one for the forward marker on every stack made naming the
        // culprits of 20,000 sites take twice as long.
        let outermost = |named: bool| {
            frames
                .clone()
                .filter(|(_, r)| r.entry && (named || !r.named_like_package))
                .last()
                .map(|(f, _)| f.file.as_str())
        };
        let entry = std::cell::OnceCell::new();
        let entry = || *entry.get_or_init(|| outermost(false).or_else(|| outermost(true)));
        let own = |f: &Frame, r: &FrameRole| {
            r.user && !(r.named_like_package && entry().is_some_and(|e| is_vendored(&f.file, e)))
        };
        // The first frame of the program's own after the forward marker,
        // else the first of all, in one walk.
        let mut first_own = None;
        let mut after_marker = false;
        for (f, r) in frames.clone() {
            after_marker |= r.forward_marker;
            if (after_marker || first_own.is_none()) && own(f, &r) {
                if after_marker {
                    return Some((f, CulpritKind::Forward));
                }
                first_own = Some(f);
            }
        }
        if let Some(f) = first_own {
            return Some((f, CulpritKind::User));
        }
        let meaningful = || frames.clone().filter(|(_, r)| !r.noise && !r.ignored);
        let fallback = meaningful()
            .find(|(_, r)| !r.plumbing)
            .or_else(|| meaningful().next());
        fallback.map(|(f, _)| (f, CulpritKind::Fallback))
    }
}

/// What one frame is to a set of [`CulpritRules`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameRole {
    /// Allocator, interpreter or dispatcher: left out of stack keys.
    pub noise: bool,
    /// The program's own code by where it lies, not ignored and not
    /// `--library` (a copy of a library inside the program's tree is
    /// told apart per stack, by the folder it shares with the script).
    pub user: bool,
    /// The program's own code, not a notebook cell: a frame that can be
    /// its script, the stack's entry.
    pub entry: bool,
    /// The program's own code in a folder named like a library.
    pub named_like_package: bool,
    /// Left out by `--ignore`.
    pub ignored: bool,
    /// Matched by `--focus`.
    pub focus: bool,
    /// Allocation plumbing, passed over by the fallback.
    pub plumbing: bool,
    /// The frame after which a backward allocation's stack goes on with the
    /// forward pass that caused it ([`Frame::forward_marker`]).
    pub forward_marker: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack_key::test_frame as frame;

    #[test]
    fn picks_the_innermost_user_frame() {
        let stack = [
            frame("torch::unwind::unwind()", "??", 0),
            frame("at::native::empty_cuda(...)", "EmptyTensor.cpp", 0),
            frame(
                "forward",
                "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py",
                125,
            ),
            frame("layer", "/home/u/model.py", 40),
            frame("<module>", "/home/u/train.py", 9),
        ];
        let c = CulpritRules::default().culprit(&stack);
        assert_eq!(
            (c.name.as_str(), c.line, c.kind),
            ("layer", 40, CulpritKind::User)
        );
        assert_eq!(c.display(), "layer  /home/u/model.py:40");

        let rules = CulpritRules::new(None, Some("model\\.py")).unwrap();
        assert_eq!(rules.culprit(&stack).name, "<module>");
        let rules = CulpritRules::new(Some("linear\\.py"), None).unwrap();
        assert_eq!(rules.culprit(&stack).kind, CulpritKind::Focus);
    }

    /// Whose code a file is depends on where it lies beside the script,
    /// never on a folder's name above it.
    #[test]
    fn a_checkout_named_like_a_library_keeps_its_lines() {
        let torch = "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py";
        for root in ["/home/u/code/lightning", "/home/u/snapdiff", "/srv/torch"] {
            let stack = [
                frame("forward", torch, 125),
                frame("layer", &format!("{root}/model.py"), 40),
                frame("<module>", &format!("{root}/train.py"), 9),
                frame("<module>", "/venv/bin/python-launcher", 1),
            ];
            let c = CulpritRules::default().culprit(&stack);
            assert_eq!((c.name.as_str(), c.line), ("layer", 40), "{root}");
        }
        // A copy of transformers inside the program's tree is a library:
        // the script's line is named, as with an installed transformers.
        let stack = [
            frame("forward", torch, 125),
            frame(
                "forward",
                "/mnt/proj/lib/transformers/models/llama/modeling_llama.py",
                856,
            ),
            frame("validate", "/mnt/proj/validate_old.py", 63),
            frame("<module>", "/mnt/proj/validate_old.py", 90),
        ];
        let c = CulpritRules::default().culprit(&stack);
        assert_eq!((c.name.as_str(), c.line), ("validate", 63));
        // A stack cut short of the script: the copy calls the program's
        // layer, which calls the copy again.
        let copy = "/mnt/proj/lib/transformers/models/llama/modeling_llama.py";
        let stack = [
            frame("forward", torch, 125),
            frame("forward", copy, 405),
            frame("forward", "/mnt/proj/lib/select_n.py", 115),
            frame("forward", copy, 700),
        ];
        let c = CulpritRules::default().culprit(&stack);
        assert_eq!(
            (c.file.as_str(), c.line),
            ("/mnt/proj/lib/select_n.py", 115)
        );
    }

    #[test]
    fn falls_back_past_allocation_plumbing() {
        let stack = [
            frame(
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
                "CUDACachingAllocator.cpp",
                0,
            ),
            frame("at::detail::empty_generic(c10::ArrayRef<long>)", "??", 0),
            frame(
                "at::_ops::sum_dim_IntList::call(at::Tensor const&)",
                "??",
                0,
            ),
            frame("torch::autograd::Engine::thread_main()", "??", 0),
        ];
        let c = CulpritRules::default().culprit(&stack);
        assert_eq!(c.kind, CulpritKind::Fallback);
        assert_eq!(c.display(), "at::_ops::sum_dim_IntList::call");
        assert_eq!(
            CulpritRules::default().culprit(&[]).kind,
            CulpritKind::NoStack
        );
    }

    #[test]
    fn paths_are_shown_from_the_folder_that_holds_them() {
        let files = ["/home/ana/proj/train.py", "/home/ana/proj/lib/model.py"];
        assert_eq!(common_base(files, None), "/home/ana/proj/");
        assert_eq!(common_base(files, Some("/home/ana")), "/home/ana/");
        assert_eq!(common_base(files, Some("/srv")), "/home/ana/proj/");
        assert_eq!(common_base(["/a/x.py", "/b/y.py"], None), "");
        let windows = [
            "C:\\Users\\ana\\proj\\train.py",
            "C:\\Users\\ana\\proj\\lib\\m.py",
        ];
        assert_eq!(common_base(windows, None), "C:\\Users\\ana\\proj\\");
        let c = Culprit {
            name: "forward".into(),
            file: windows[1].into(),
            line: 3,
            kind: CulpritKind::User,
        };
        assert_eq!(
            c.display_from(&common_base(windows, None)),
            "forward  lib/m.py:3"
        );
        assert_eq!(
            c.display_from("/elsewhere/"),
            format!("forward  {}:3", windows[1])
        );
    }

    #[test]
    fn shortens_cpp_names() {
        assert_eq!(short_name("a::b(int, std::function<void (int)>)"), "a::b");
        assert_eq!(short_name("plain"), "plain");
        assert_eq!(
            short_name("torch::autograd::InputMetadata::reduce_grad(at::Tensor&) const"),
            "torch::autograd::InputMetadata::reduce_grad"
        );
        assert_eq!(
            short_name("<F as core::ops::Fn<()>>::call()"),
            "<F as core::ops::Fn<()>>::call()"
        );
    }
}
