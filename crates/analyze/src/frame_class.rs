//! What a frame is: the program's own code, a library's, the standard
//! library's, native code, or noise. Culprits are chosen among the program's
//! own frames, so this decides which line a report names.
//!
//! Snapshots are recorded wherever people train, and paths come in every
//! form: `/` or `\` separators, drive letters and UNC shares, `Lib` or `lib`,
//! virtual environments of any name, conda environments and package caches,
//! Debian's `dist-packages`, eggs and zip imports, libraries installed in
//! editable mode from a checkout, and IPython's notebook cells. Matching is
//! on the path's segments, separators and ASCII case folded, without
//! allocating (it runs for every frame of every site).

use serde::Serialize;
use snapdiff_format::Frame;

use crate::stack_key::is_noise;

/// The kind of code a frame is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameClass {
    /// The program's own source: a culprit.
    User,
    /// A cell of a Jupyter notebook (a kernel names it `…/ipykernel_N/M.py`,
    /// IPython's terminal `<ipython-input-N-HASH>`): the program's own code
    /// too, shown as "notebook cell M" or, where its number is known, as
    /// IPython shows it: `cell In[N]`.
    NotebookCell,
    /// An installed or known library: torch, site-packages, crates.
    Library,
    /// The language's standard library, or code made from a string
    /// (`<frozen runpy>`, `<string>`).
    StandardLibrary,
    /// Code generated while the program ran: `torch.compile`'s Inductor
    /// output in its `torchinductor_*` cache folders (the `call` of a
    /// compiled graph). Never a culprit: the line that called the compiled
    /// model is; reports show the generated frame beside it.
    Generated,
    /// Native code without a source line: `??`, shared objects, object
    /// files, C and C++ sources (PyTorch's and libc's).
    Native,
    /// The allocator, the interpreter's eval loop, the dispatcher
    /// (`stack_key.rs`): dropped from stack keys.
    Noise,
}

impl FrameClass {
    /// Whether frames of this class can be a culprit.
    pub fn is_program(self) -> bool {
        matches!(self, FrameClass::User | FrameClass::NotebookCell)
    }
}

/// Python packages whose folder, found inside a program's own tree, is a
/// copy of the library (vendored: `proj/lib/transformers/…`), not the
/// program's code. Only folders below the one a frame shares with its
/// stack's entry count (see [`is_vendored`]): a checkout named `lightning`
/// or `torch` is the program's own, whatever its name.
const VENDORED_PACKAGES: &[&str] = &[
    "torch",
    "torchvision",
    "torchaudio",
    "torchtune",
    "torchao",
    "functorch",
    "transformers",
    "accelerate",
    "deepspeed",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "peft",
    "trl",
    "diffusers",
    "timm",
    "xformers",
    "flash_attn",
    "apex",
    "megatron",
    "triton",
    "bitsandbytes",
    "vllm",
    "fairscale",
    "colossalai",
    "safetensors",
    "tokenizers",
    "einops",
    "numpy",
    "jax",
    "flax",
];

/// snapdiff's own Python package, by its folders and module files: it runs
/// the program (the pytest plugin, the notebook magic, the capture hook),
/// wherever it is installed or checked out. Named file by file, so that a
/// user's `snapdiff/train.py` stays the user's.
const SNAPDIFF_PACKAGE: &[(&str, &[&str])] = &[
    (
        "snapdiff",
        &[
            "__init__.py",
            "__main__.py",
            "_api.py",
            "_cli.py",
            "_fleet.py",
            "_limits.py",
            "_notebook.py",
            "_ray.py",
            "_recording.py",
            "pytest_plugin.py",
        ],
    ),
    (
        "hook",
        &[
            "__init__.py",
            "sitecustomize.py",
            "snapdiff_capture.py",
            "snapdiff_cpu_recorder.py",
            "snapdiff_dumping.py",
            "snapdiff_files.py",
            "snapdiff_owners.py",
            "snapdiff_signals.py",
        ],
    ),
    (
        "integrations",
        &[
            "__init__.py",
            "_watch.py",
            "lightning.py",
            "transformers.py",
        ],
    ),
];

/// Folder-name prefixes of code that runs the program: the copy of
/// snapdiff's hook that `snapdiff capture` puts in a temporary folder.
const RUNNER_FOLDER_PREFIXES: &[&str] = &["snapdiff-hook-"];

/// Path segments (case folded) of installed packages.
const INSTALL_FOLDERS: &[&str] = &["site-packages", "dist-packages", ".cargo"];

/// Function-name prefixes of the Rust standard library.
const RUST_STD_NAMES: &[&str] = &[
    "std::", "core::", "alloc::", "<std::", "<core::", "<alloc::",
];

/// Function-name prefixes of snapdiff's own crates.
const SNAPDIFF_NAMES: &[&str] = &["snapdiff_runtime::", "snapdiff::", "<snapdiff_runtime::"];

/// File suffixes of native code: object files, shared libraries, and C and
/// C++ sources.
const NATIVE_SUFFIXES: &[&str] = &[
    ".so", ".o", ".a", ".dll", ".dylib", ".pyd", ".exe", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp",
    ".cu", ".cuh", ".s",
];

/// Classifies `frame`.
pub fn classify(frame: &Frame) -> FrameClass {
    classify_known(frame, is_noise(frame))
}

/// [`classify`], whether `frame` is noise known already (a snapshot's
/// [`crate::StackKeys`] know it of each of its frames).
pub(crate) fn classify_known(frame: &Frame, noise: bool) -> FrameClass {
    if noise {
        return FrameClass::Noise;
    }
    let file = frame.file.as_str();
    let name = frame.name.as_str();
    if SNAPDIFF_NAMES.iter().any(|p| name.starts_with(p)) {
        return FrameClass::Library;
    }
    if file.is_empty() || file == "??" || is_native_file(file) {
        return FrameClass::Native;
    }
    if RUST_STD_NAMES.iter().any(|p| name.starts_with(p)) {
        return FrameClass::StandardLibrary;
    }
    if notebook_cell(file).is_some() {
        return FrameClass::NotebookCell;
    }
    if file.starts_with('<') {
        // `<frozen runpy>`, `<string>`, `<stdin>`, `<built-in>`.
        return FrameClass::StandardLibrary;
    }
    if is_generated_file(file) {
        return FrameClass::Generated;
    }
    let segments: Vec<&str> = segments(file).collect();
    let folded = |i: usize, s: &str| segments[i].eq_ignore_ascii_case(s);
    for i in 0..segments.len().saturating_sub(1) {
        let segment = segments[i];
        if INSTALL_FOLDERS.iter().any(|f| folded(i, f))
            || has_suffix_ci(segment, ".egg")
            || has_suffix_ci(segment, ".zip")
            || has_suffix_ci(segment, ".whl")
        {
            return FrameClass::Library;
        }
        // conda's package cache: `…/miniconda3/pkgs/NAME/…`.
        if folded(i, "pkgs") && i > 0 && is_python_home(segments[i - 1]) {
            return FrameClass::Library;
        }
        // Crates from a registry or git, where CARGO_HOME is not `.cargo`.
        if folded(i, "cargo") && (folded(i + 1, "registry") || folded(i + 1, "git")) {
            return FrameClass::Library;
        }
        if folded(i, "rustc") && i == 0 {
            return FrameClass::StandardLibrary;
        }
        if folded(i, "include") && i > 0 && folded(i - 1, "usr") {
            return FrameClass::Library;
        }
    }
    // The standard library: `lib/python3.11/…` (`lib64`, `pypy`), or `Lib\…`
    // right under a Python installation on Windows. (Packages under them
    // were caught above.)
    for i in 0..segments.len().saturating_sub(1) {
        let lib = folded(i, "lib") || folded(i, "lib64");
        if lib {
            let next = segments[i + 1];
            if starts_with_ci(next, "python") || starts_with_ci(next, "pypy") {
                return FrameClass::StandardLibrary;
            }
            if i > 0 && is_python_home(segments[i - 1]) {
                return FrameClass::StandardLibrary;
            }
        }
    }
    if is_snapdiff_package(&segments)
        || folders_of(&segments)
            .iter()
            .any(|s| RUNNER_FOLDER_PREFIXES.iter().any(|p| s.starts_with(p)))
        || is_console_script(&segments)
    {
        return FrameClass::Library;
    }
    FrameClass::User
}

/// The folders of a path's segments: all but the last.
fn folders_of<'s, 'a>(segments: &'s [&'a str]) -> &'s [&'a str] {
    &segments[..segments.len().saturating_sub(1)]
}

/// Whether a path is a module of snapdiff's own Python package
/// ([`SNAPDIFF_PACKAGE`]): `…/snapdiff/_recording.py`,
/// `…/snapdiff/hook/snapdiff_capture.py`.
fn is_snapdiff_package(segments: &[&str]) -> bool {
    let [.., grandparent, parent, file] = segments else {
        return false;
    };
    SNAPDIFF_PACKAGE.iter().any(|(folder, files)| {
        let in_package = if *folder == "snapdiff" {
            *parent == "snapdiff"
        } else {
            parent == folder && *grandparent == "snapdiff"
        };
        in_package && files.contains(file)
    })
}

/// Whether a path is a console script an installer wrote: a file without
/// an extension in a `bin` or `Scripts` folder (`venv/bin/pytest`,
/// `/opt/conda/bin/torchrun`). It only starts the program.
fn is_console_script(segments: &[&str]) -> bool {
    let [.., folder, file] = segments else {
        return false;
    };
    (folder.eq_ignore_ascii_case("bin") || folder.eq_ignore_ascii_case("scripts"))
        && !file.contains('.')
}

/// Whether a folder of `file` is named like a library that programs copy
/// into their own tree ([`VENDORED_PACKAGES`]). Cheap to ask once per
/// distinct frame; [`is_vendored`] then decides for a stack.
pub(crate) fn named_like_package(file: &str) -> bool {
    let segments: Vec<&str> = segments(file).collect();
    folders_of(&segments)
        .iter()
        .any(|s| VENDORED_PACKAGES.contains(s))
}

/// Whether `file`, the program's own code by where it lies, is a copy of a
/// library inside the program's tree: a folder named like a library
/// ([`VENDORED_PACKAGES`]) lies below the folder it shares with `entry`,
/// the script of the same stack (chosen in culprit.rs). So `/mnt/proj/lib/transformers/modeling_llama.py` is a copy of
/// transformers when the job ran `/mnt/proj/validate.py`, while every file
/// of a checkout in `~/code/lightning/` stays the program's own when it
/// ran `~/code/lightning/train.py`: the folder's name is above the shared one.
pub(crate) fn is_vendored(file: &str, entry: &str) -> bool {
    let shared = file
        .bytes()
        .zip(entry.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    // Back to the end of the last whole folder they share.
    // (Bytes, not chars: the shared prefix may end inside a character.)
    let shared = file.as_bytes()[..shared]
        .iter()
        .rposition(|&b| b == b'/' || b == b'\\')
        .map_or(0, |i| i + 1);
    let below: Vec<&str> = segments(&file[shared..]).collect();
    folders_of(&below)
        .iter()
        .any(|s| VENDORED_PACKAGES.contains(s))
}

/// A notebook cell, named by its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotebookCell<'a> {
    /// A kernel's cell file, by the id in its name: `3105878423` of
    /// `/tmp/ipykernel_4181/3105878423.py` (or a bare `3105878423.py`).
    Id(&'a str),
    /// A cell whose number IPython gave: `3` of `<ipython-input-3-1f0a9c>`
    /// (IPython's terminal names cells so, and snapdiff's notebook magic
    /// names a kernel's cells so in its dumps).
    Number(&'a str),
}

impl std::fmt::Display for NotebookCell<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotebookCell::Id(id) => write!(f, "notebook cell {id}"),
            NotebookCell::Number(n) => write!(f, "cell In[{n}]"),
        }
    }
}

/// The notebook cell whose code `file` holds, if it is one.
pub(crate) fn notebook_cell(file: &str) -> Option<NotebookCell<'_>> {
    if let Some(rest) = file.strip_prefix("<ipython-input-") {
        let (number, _) = rest.strip_suffix('>')?.split_once('-')?;
        let digits = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
        return digits.then_some(NotebookCell::Number(number));
    }
    let base = segments(file).last()?;
    let cell = base.strip_suffix(".py")?;
    if cell.is_empty() || !cell.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let parent = segments(file).rev().nth(1);
    match parent {
        None => Some(NotebookCell::Id(cell)),
        Some(p) if starts_with_ci(p, "ipykernel_") => Some(NotebookCell::Id(cell)),
        Some(_) => None,
    }
}

/// Whether `file` is code generated at run time: under a folder of
/// Inductor's cache (`/tmp/torchinductor_ana/fy/cfy….py`, or wherever
/// `TORCHINDUCTOR_CACHE_DIR` points, which keeps the name).
pub fn is_generated_file(file: &str) -> bool {
    let mut folders = segments(file).rev().skip(1);
    folders.any(|s| starts_with_ci(s, "torchinductor_"))
}

/// Whether a folder name is a Python installation or environment home:
/// `Python311`, `python3.11`, `miniconda3`, `anaconda3`, `miniforge3`,
/// `mambaforge`, `.venv`, `venv`.
fn is_python_home(segment: &str) -> bool {
    [
        "python",
        "miniconda",
        "anaconda",
        "miniforge",
        "mambaforge",
        "micromamba",
        "conda",
    ]
    .iter()
    .any(|p| starts_with_ci(segment, p))
}

/// Whether `file` names native code by its suffix; `libc.so.6` and
/// `libstdc++.so.6.0.30` count, as do `.o` files named after threads.
fn is_native_file(file: &str) -> bool {
    let base = segments(file).last().unwrap_or(file);
    if NATIVE_SUFFIXES.iter().any(|s| has_suffix_ci(base, s)) {
        return true;
    }
    // Versioned shared objects: `libc.so.6`.
    base.split('.')
        .skip(1)
        .collect::<Vec<_>>()
        .windows(2)
        .any(|w| w[0].eq_ignore_ascii_case("so") && w[1].bytes().all(|b| b.is_ascii_digit()))
}

/// The segments of a path, split at `/` and `\`, empty ones (and a drive
/// letter's `C:`) left out.
fn segments(file: &str) -> impl DoubleEndedIterator<Item = &str> {
    let is_drive = |s: &str| s.len() == 2 && s.ends_with(':');
    file.split(['/', '\\'])
        .filter(move |s| !s.is_empty() && !is_drive(s))
}

fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn has_suffix_ci(s: &str, suffix: &str) -> bool {
    s.len() >= suffix.len()
        && s.as_bytes()[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack_key::test_frame as frame;
    use FrameClass::*;

    /// Real-looking frames of every form users record in, with their class.
    const FRAMES: &[(&str, &str, u32, FrameClass)] = &[
        // The program's own code, on every OS.
        ("train_step", "/home/ana/proj/train.py", 88, User),
        ("forward", "/home/ana/proj/model.py", 40, User),
        ("forward", "C:\\research\\proj\\model.py", 40, User),
        ("forward", "D:/Dev/proj/src/model.py", 12, User),
        ("forward", "\\\\fileserver\\share\\proj\\model.py", 7, User),
        ("main", "/Users/bo/code/train.py", 3, User),
        ("step", "./train.py", 9, User),
        ("step", "train.py", 9, User),
        ("collate", "/home/ana/proj/lib/data.py", 21, User),
        ("load", "/home/ana/torch-experiments/load.py", 5, User),
        ("run", "/srv/jobs/my_models/run.py", 14, User),
        // torch.compile's generated code, in Inductor's cache.
        (
            "call",
            "/tmp/torchinductor_isabella/fy/cfynmy2umdm44otb4irtcaejxvr3a4q7la7mz6lrzbnotuwxnyn5.py",
            165,
            Generated,
        ),
        (
            "call",
            "C:\\Users\\ana\\AppData\\Local\\Temp\\torchinductor_ana\\ab\\cab.py",
            9,
            Generated,
        ),
        ("step", "/home/ana/torchinductor_notes.py", 3, User),
        ("train::main", "/home/ana/proj/src/main.rs", 30, User),
        ("train::step", "/home/ana/cargo/src/step.rs", 30, User),
        // Notebook cells.
        (
            "<module>",
            "/tmp/ipykernel_4181/3105878423.py",
            5,
            NotebookCell,
        ),
        (
            "train",
            "C:\\Users\\ana\\AppData\\Local\\Temp\\ipykernel_9120\\2954613.py",
            2,
            NotebookCell,
        ),
        ("<module>", "3105878423.py", 1, NotebookCell),
        ("<module>", "<ipython-input-3-1f0a9c2b>", 4, NotebookCell),
        // Libraries: virtual environments, conda, Debian, user site, eggs, zips.
        (
            "convert",
            "C:\\research\\proj\\.venv\\lib\\site-packages\\torch\\nn\\modules\\module.py",
            1357,
            Library,
        ),
        (
            "einsum",
            "D:\\Dev\\proj\\.venv\\Lib\\site-packages\\torch\\functional.py",
            402,
            Library,
        ),
        (
            "forward",
            "/home/ana/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
            125,
            Library,
        ),
        (
            "forward",
            "/home/ana/envs/exp/lib/python3.10/site-packages/transformers/models/llama/modeling_llama.py",
            310,
            Library,
        ),
        (
            "forward",
            "/opt/conda/envs/train/lib/python3.11/site-packages/torch/nn/modules/conv.py",
            456,
            Library,
        ),
        (
            "forward",
            "/home/ana/miniconda3/pkgs/pytorch-2.1.0/lib/python3.11/site-packages/torch/nn/functional.py",
            2,
            Library,
        ),
        (
            "f",
            "/home/ana/miniconda3/pkgs/some-tool/tool.py",
            2,
            Library,
        ),
        (
            "forward",
            "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py",
            125,
            Library,
        ),
        (
            "forward",
            "/home/ana/.local/lib/python3.11/site-packages/accelerate/accelerator.py",
            1,
            Library,
        ),
        (
            "f",
            "/usr/lib/python3.11/site-packages/foo-1.0-py3.11.egg/foo/bar.py",
            3,
            Library,
        ),
        ("f", "/home/ana/deps/bundle.zip/pkg/mod.py", 3, Library),
        (
            "f",
            "C:\\Users\\ana\\AppData\\Roaming\\Python\\Python311\\site-packages\\peft\\tuners\\lora.py",
            8,
            Library,
        ),
        // Checkouts and editable installs of libraries: the program's own
        // code by where it lies (a copy inside a program's tree is told
        // apart per stack, in culprit.rs).
        (
            "forward",
            "/home/ana/src/transformers/src/transformers/models/gpt2/modeling_gpt2.py",
            50,
            User,
        ),
        (
            "backward",
            "/home/ana/src/pytorch/torch/autograd/__init__.py",
            200,
            User,
        ),
        ("train", "/home/ana/code/lightning/train.py", 12, User),
        ("main", "/home/ana/code/snapdiff/train.py", 3, User),
        ("main", "/srv/torch/scripts/run.py", 3, User),
        // Rust crates and snapdiff.
        (
            "serde_json::de::from_str",
            "/home/ana/.cargo/registry/src/index.crates.io-6f17d22bba15001f/serde_json-1.0.0/src/de.rs",
            2,
            Library,
        ),
        (
            "snapdiff::testing::assert_no_leak",
            "/work/crates/snapdiff/src/testing.rs",
            100,
            Library,
        ),
        (
            "snapdiff_runtime::Allocator::alloc",
            "/work/crates/runtime/src/allocator.rs",
            100,
            Noise,
        ),
        // The standard library.
        (
            "_run_module_as_main",
            "<frozen runpy>",
            198,
            StandardLibrary,
        ),
        (
            "_call_with_frames_removed",
            "<frozen importlib._bootstrap>",
            241,
            StandardLibrary,
        ),
        ("<module>", "<string>", 1, StandardLibrary),
        ("<module>", "<stdin>", 1, StandardLibrary),
        (
            "run",
            "/usr/lib/python3.11/threading.py",
            975,
            StandardLibrary,
        ),
        (
            "run",
            "/opt/conda/envs/train/lib/python3.11/multiprocessing/process.py",
            108,
            StandardLibrary,
        ),
        (
            "run",
            "C:\\Python311\\Lib\\threading.py",
            975,
            StandardLibrary,
        ),
        (
            "run",
            "C:\\Users\\ana\\miniconda3\\Lib\\threading.py",
            975,
            StandardLibrary,
        ),
        (
            "run",
            "/usr/local/lib/pypy3.10/threading.py",
            975,
            StandardLibrary,
        ),
        (
            "std::thread::spawn",
            "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/thread/mod.rs",
            1,
            StandardLibrary,
        ),
        (
            "std::thread::spawn",
            "/home/ana/std/mod.rs",
            1,
            StandardLibrary,
        ),
        // Native code without a source line.
        ("start_worker", "thread48.o", 0, Native),
        ("memcpy", "/lib/x86_64-linux-gnu/libc.so.6", 0, Native),
        (
            "std::__1::vector",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30",
            0,
            Native,
        ),
        ("at::native::add_kernel", "BinaryOpsKernel.cpp", 0, Native),
        ("cublasGemmEx", "??", 0, Native),
        ("some_symbol", "", 0, Native),
        ("kernel", "C:\\Windows\\System32\\nvcuda.dll", 0, Native),
        ("f", "/usr/local/cuda/include/cuda_runtime.h", 1, Native),
        // What runs the program: console scripts, snapdiff's own package
        // and hook, wherever they are installed.
        ("<module>", "/home/ana/venv/bin/pytest", 8, Library),
        ("<module>", "C:\\Python311\\Scripts\\torchrun", 8, Library),
        (
            "step",
            "/work/snapdiff/python/snapdiff/_recording.py",
            80,
            Library,
        ),
        (
            "write",
            "/tmp/snapdiff-hook-Ab12Cd/snapdiff_capture.py",
            612,
            Library,
        ),
        (
            "on_train_batch_end",
            "/home/ana/snapdiff/python/snapdiff/integrations/lightning.py",
            60,
            Library,
        ),
        (
            "step",
            "/home/ana/snapdiff/python/snapdiff/step.py",
            1,
            User,
        ),
        // Noise.
        ("torch::unwind::unwind()", "??", 0, Noise),
        ("_PyEval_EvalFrameDefault", "ceval.c", 0, Noise),
    ];

    #[test]
    fn every_path_form_is_classified() {
        assert!(FRAMES.len() >= 40);
        let wrong: Vec<String> = FRAMES
            .iter()
            .filter_map(|&(name, file, line, expected)| {
                let got = classify(&frame(name, file, line));
                (got != expected)
                    .then(|| format!("{name} {file}:{line}: {got:?}, not {expected:?}"))
            })
            .collect();
        assert!(wrong.is_empty(), "misclassified:\n{}", wrong.join("\n"));
    }

    /// Every module of snapdiff's Python package is known as snapdiff's,
    /// so that the list cannot fall behind the package.
    #[test]
    fn snapdiff_package_is_known_file_by_file() {
        let package =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/snapdiff");
        let mut unknown = Vec::new();
        let mut seen = 0;
        for folder in [
            package.clone(),
            package.join("hook"),
            package.join("integrations"),
        ] {
            for entry in std::fs::read_dir(&folder).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "py") {
                    seen += 1;
                    let file = path.to_str().unwrap();
                    if classify(&frame("f", file, 1)) != Library {
                        unknown.push(file.to_owned());
                    }
                }
            }
        }
        assert!(seen >= 20, "{seen} modules");
        assert!(unknown.is_empty(), "not known as snapdiff's: {unknown:?}");
    }

    #[test]
    fn copies_inside_the_tree_are_vendored_names_above_it_are_not() {
        let entry = "/mnt/mcx/select_n/validate_old.py";
        let copy = "/mnt/mcx/select_n/lib/transformers/models/llama/modeling_llama.py";
        assert!(is_vendored(copy, entry));
        assert!(!is_vendored("/mnt/mcx/select_n/lib/select_n.py", entry));
        // A checkout named like a library: the name is above the shared folder.
        let entry = "/home/ana/code/lightning/train.py";
        assert!(!is_vendored("/home/ana/code/lightning/model.py", entry));
        assert!(!is_vendored(
            "/home/ana/code/lightning/torch/ops.py",
            "/home/ana/code/lightning/torch/run.py"
        ));
        // Working on a library with a script beside it: the library's own
        // package below the checkout is a library to that script.
        let entry = "/home/ana/src/transformers/examples/run.py";
        assert!(is_vendored(
            "/home/ana/src/transformers/src/transformers/models/gpt2/modeling_gpt2.py",
            entry
        ));
        assert!(!is_vendored(
            "/home/ana/src/transformers/examples/utils.py",
            entry
        ));
        // Paths that share part of a multi-byte name.
        assert!(!is_vendored("/home/añ/x.py", "/home/aÑ/y.py"));
        assert!(named_like_package("/x/lightning/y.py"));
        assert!(!named_like_package("/x/y/lightning.py"));
    }

    #[test]
    fn notebook_cells_are_numbered() {
        let shown = |file| notebook_cell(file).map(|c| c.to_string());
        assert_eq!(
            shown("/tmp/ipykernel_4181/3105878423.py").as_deref(),
            Some("notebook cell 3105878423")
        );
        assert_eq!(
            shown("3105878423.py").as_deref(),
            Some("notebook cell 3105878423")
        );
        assert_eq!(
            shown("<ipython-input-12-a3f09c1e>").as_deref(),
            Some("cell In[12]")
        );
        assert_eq!(shown("/home/ana/2024.py"), None);
        assert_eq!(shown("/tmp/ipykernel_1/cell.py"), None);
        assert_eq!(shown("<ipython-input-x-a3f09c1e>"), None);
        assert_eq!(shown("<ipython-input-3>"), None);
        assert_eq!(shown("<string>"), None);
    }
}
