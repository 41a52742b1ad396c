//! Stable 64-bit keys for stacks, computed from symbolized frames.
//!
//! Two allocations come from the same place when their stacks have the same
//! key. The key must be the same in every process, on every machine and in
//! every build, so it is computed from frame names, files and lines (never
//! from addresses), after dropping the frames that differ between runs of
//! the same code: the allocator's own frames, the Python interpreter's, and
//! PyTorch's operator dispatcher. The hash is FNV-1a over a byte encoding
//! specified in `docs/format.md`, so that any tool can compute the same keys.

use std::fmt;
use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickKind, packed};

use serde::{Serialize, Serializer};
use snapdiff_format::{Frame, FrameId, Snapshot, StackId};

/// The key of a stack: equal keys mean the same allocation site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey(pub u64);

impl StackKey {
    /// The key of allocations with no recorded stack.
    pub const NONE: StackKey = StackKey(FNV_OFFSET);
}

impl fmt::Display for StackKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl Serialize for StackKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, written out because the key is specified byte for byte: std's
/// `Hash` adds its own bytes and uses native endianness, so it is not stable.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Function names containing these are the allocator's, the interpreter's
/// or the dispatcher's, never the program's. The first ones are PyTorch's own
/// viewer filter (`_frame_filter` in `torch/cuda/_memory_viz.py`).
const NOISE_NAMES: &[&str] = &[
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "__libc_",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
    "_PyEval",
    "_PyObject",
    "_PyFunction",
    "PyCode_",
    "PyRun_",
    "Py_RunMain",
    "Py_BytesMain",
    "_Py_",
    "CUDACachingAllocator::",
    "c10::impl::wrap_kernel_functor",
    "c10::impl::BoxedKernel",
    "c10::impl::make_boxed_from_unboxed",
    "c10::Dispatcher::",
    "c10::OperatorHandle::",
    "::redispatch(",
    "snapdiff_runtime::",
    "backtrace::",
    "std::rt::lang_start",
    "std::sys::backtrace::__rust_begin_short_backtrace",
    "std::panicking::",
    "std::panic::catch_unwind",
    "core::ops::function::FnOnce::call_once",
    "core::ops::function::impls::",
    "as core::ops::function::FnOnce",
    "as core::ops::function::Fn<",
    "as core::ops::function::FnMut",
];

/// Function names that are noise only as a whole name, in native frames (a
/// Python function may well be called `main`).
const NOISE_EXACT_NAMES: &[&str] = &[
    "_start",
    "__clone",
    "__clone3",
    "start_thread",
    "main",
    "??",
    "",
];

/// Files containing these are the interpreter's or the dispatcher's.
const NOISE_FILES: &[&str] = &[
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
];

/// [`NOISE_NAMES`] and [`NOISE_FILES`], each searched for all at once: a
/// step's dump has thousands of frames, and testing them one pattern at a
/// time was a sixth of `check`'s time on one.
static NOISE_NAME_SEARCH: LazyLock<Search> = LazyLock::new(|| Search::new(NOISE_NAMES));
static NOISE_FILE_SEARCH: LazyLock<Search> = LazyLock::new(|| Search::new(NOISE_FILES));

/// A search for any of a few dozen patterns. Where the processor has the
/// vector instructions for it (x86-64's SSSE3, AArch64's NEON), the
/// packed search (Teddy): the frames of a step's dump (100 KB of names)
/// in 30 µs, where the automaton takes 150 µs; each builds in about 0.1
/// ms. Else the automaton, quick to build (a DFA took longer to build than
/// a step's dump takes to search).
enum Search {
    Packed(packed::Searcher),
    Automaton(AhoCorasick),
}

impl Search {
    fn new(patterns: &[&str]) -> Search {
        packed::Searcher::new(patterns).map_or_else(|| Search::automaton(patterns), Search::Packed)
    }

    fn automaton(patterns: &[&str]) -> Search {
        let automaton = AhoCorasick::builder()
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .build(patterns)
            .expect("plain patterns");
        Search::Automaton(automaton)
    }

    /// Whether any pattern occurs in `text`.
    fn is_match(&self, text: &str) -> bool {
        match self {
            Search::Packed(search) => search.find(text).is_some(),
            Search::Automaton(search) => search.is_match(text),
        }
    }
}

/// Whether a frame belongs to the allocator, the interpreter or the
/// dispatcher: dropped before hashing and never shown as a culprit.
pub(crate) fn is_noise(frame: &Frame) -> bool {
    let name = frame.name.as_str();
    let file = frame.file.as_str();
    // Generated dispatcher files: `RegisterCUDA_0.cpp`, `.../RegisterBackendSelect.cpp`.
    let base = file.rsplit('/').next().unwrap_or(file);
    // CPython's C functions, symbolized without a file.
    let interpreter =
        (name.starts_with("Py") || name.starts_with("_Py")) && (file.is_empty() || file == "??");
    interpreter
        || frame.is_forward_marker()
        || (NOISE_EXACT_NAMES.contains(&name) && !file.ends_with(".py"))
        || NOISE_NAME_SEARCH.is_match(name)
        || NOISE_FILE_SEARCH.is_match(file)
        || (base.starts_with("Register") && base.ends_with(".cpp"))
        || base.starts_with("Redispatch")
        || base == "VariableType.cpp"
        || base.starts_with("VariableType_")
}

/// The key of a list of frames (innermost first), after dropping noise, as
/// [`StackKeys`] computes it for a snapshot's stacks.
#[cfg(test)]
fn key_of<'a>(frames: impl IntoIterator<Item = &'a Frame>) -> StackKey {
    let h = frames
        .into_iter()
        .filter(|f| !is_noise(f))
        .fold(FNV_OFFSET, hash_frame);
    StackKey(h)
}

/// Adds one frame to a key's hash.
fn hash_frame(mut h: u64, f: &Frame) -> u64 {
    h = fnv(h, f.name.as_bytes());
    h = fnv(h, &[0]);
    h = fnv(h, f.file.as_bytes());
    h = fnv(h, &[0]);
    h = fnv(h, &f.line.to_le_bytes());
    fnv(h, &[0xff])
}

/// The bytes [`hash_frame`] hashes for `f`, for hashing many stacks.
fn frame_bytes(f: &Frame) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(f.name.len() + f.file.len() + 7);
    bytes.extend_from_slice(f.name.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(f.file.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&f.line.to_le_bytes());
    bytes.push(0xff);
    bytes
}

/// One stack being hashed by [`hash_side_by_side`].
struct Lane<'a> {
    /// Its index in the chunk.
    stack: usize,
    /// Its frames not started yet.
    frames: &'a [FrameId],
    /// What is left of the frame being hashed.
    bytes: &'a [u8],
    hash: u64,
}

/// Writes the keys of `stacks` into `keys`, given each frame's bytes
/// (`encoded`, by frame id).
///
/// FNV-1a takes one byte at a time, each step waiting for the multiply
/// before it (4 cycles a byte, and real stacks are kilobytes of names and
/// paths), so four stacks are hashed side by side, each lane taking the
/// next stack when its own is done: the four multiplies overlap, and the
/// keys are 2-3 times faster to make. The bytes hashed are those of
/// [`hash_frame`], which the tests hold it to.
fn hash_side_by_side(stacks: &[Vec<FrameId>], encoded: &[Vec<u8>], keys: &mut [StackKey]) {
    let mut next = 0;
    let mut lanes: [Option<Lane>; 4] = [None, None, None, None];
    loop {
        // Give each lane bytes to hash, finishing and starting stacks.
        for lane in &mut lanes {
            loop {
                match lane {
                    Some(l) if !l.bytes.is_empty() => break,
                    Some(l) => match l.frames.split_first() {
                        Some((&f, rest)) => {
                            l.frames = rest;
                            l.bytes = &encoded[f as usize];
                        }
                        None => {
                            keys[l.stack] = StackKey(l.hash);
                            *lane = None;
                        }
                    },
                    None if next < stacks.len() => {
                        *lane = Some(Lane {
                            stack: next,
                            frames: &stacks[next],
                            bytes: &[],
                            hash: FNV_OFFSET,
                        });
                        next += 1;
                    }
                    None => break,
                }
            }
        }
        let [Some(a), Some(b), Some(c), Some(d)] = &mut lanes else {
            break;
        };
        let n = a
            .bytes
            .len()
            .min(b.bytes.len())
            .min(c.bytes.len())
            .min(d.bytes.len());
        let (mut ha, mut hb, mut hc, mut hd) = (a.hash, b.hash, c.hash, d.hash);
        let bytes = a.bytes[..n]
            .iter()
            .zip(&b.bytes[..n])
            .zip(&c.bytes[..n])
            .zip(&d.bytes[..n]);
        for (((&ba, &bb), &bc), &bd) in bytes {
            ha = (ha ^ u64::from(ba)).wrapping_mul(FNV_PRIME);
            hb = (hb ^ u64::from(bb)).wrapping_mul(FNV_PRIME);
            hc = (hc ^ u64::from(bc)).wrapping_mul(FNV_PRIME);
            hd = (hd ^ u64::from(bd)).wrapping_mul(FNV_PRIME);
        }
        for (lane, hash) in [(a, ha), (b, hb), (c, hc), (d, hd)] {
            lane.hash = hash;
            lane.bytes = &lane.bytes[n..];
        }
    }
    // Fewer stacks left than lanes: one at a time.
    for lane in lanes.into_iter().flatten() {
        let mut hash = fnv(lane.hash, lane.bytes);
        for &f in lane.frames {
            hash = fnv(hash, &encoded[f as usize]);
        }
        keys[lane.stack] = StackKey(hash);
    }
}

/// The key of every stack of a snapshot, indexed by [`StackId`].
#[derive(Clone, Debug)]
pub struct StackKeys {
    keys: Vec<StackKey>,
    /// Whether each frame is noise, by [`FrameId`]: worked out once for the
    /// keys, and asked again by the analyses that classify frames. Empty
    /// for [`StackKeys::of_live_blocks`].
    noise: Vec<bool>,
}

impl StackKeys {
    /// Computes the keys of all stacks of `snap`, in parallel: real snapshots
    /// have tens of thousands of stacks of up to ~260 frames, sharing a few
    /// thousand distinct frames, so each frame is tested for noise once.
    pub fn new(snap: &Snapshot) -> StackKeys {
        use rayon::prelude::*;
        // Whether each frame is noise, and what it adds to a key: nothing
        // for noise.
        let (noise, encoded): (Vec<bool>, Vec<Vec<u8>>) = snap
            .frames
            .par_iter()
            .map(|f| {
                if is_noise(f) {
                    (true, Vec::new())
                } else {
                    (false, frame_bytes(f))
                }
            })
            .unzip();
        let mut keys = vec![StackKey::NONE; snap.stacks.len()];
        const CHUNK: usize = 256;
        keys.par_chunks_mut(CHUNK)
            .zip(snap.stacks.par_chunks(CHUNK))
            .for_each(|(keys, stacks)| hash_side_by_side(stacks, &encoded, keys));
        StackKeys { keys, noise }
    }

    /// The keys of the stacks of `snap`'s live blocks only, each distinct
    /// frame tested for noise once: for reading many snapshots that carry
    /// far more stacks than their live blocks use (a dump's stack table
    /// holds every stack its trace ever saw). Other stacks' keys read as
    /// [`StackKey::NONE`]: use it for live blocks only.
    pub fn of_live_blocks(snap: &Snapshot) -> StackKeys {
        let mut keys = vec![StackKey::NONE; snap.stacks.len()];
        let mut noise: Vec<Option<bool>> = vec![None; snap.frames.len()];
        let live = snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state.is_active());
        for id in live.filter_map(|b| b.stack) {
            let key = &mut keys[id as usize];
            if *key != StackKey::NONE {
                continue;
            }
            let mut h = FNV_OFFSET;
            for &f in &snap.stacks[id as usize] {
                let frame = &snap.frames[f as usize];
                if !*noise[f as usize].get_or_insert_with(|| is_noise(frame)) {
                    h = hash_frame(h, frame);
                }
            }
            *key = StackKey(h);
        }
        StackKeys {
            keys,
            noise: Vec::new(),
        }
    }

    /// The key of stack `id`, or [`StackKey::NONE`] for no stack.
    pub fn key(&self, id: Option<StackId>) -> StackKey {
        id.map_or(StackKey::NONE, |id| self.keys[id as usize])
    }

    /// Whether frame `id` of `snap` (the snapshot these keys are of) is
    /// noise: as the keys found it, else tested now.
    pub(crate) fn is_noise(&self, snap: &Snapshot, id: FrameId) -> bool {
        (self.noise.get(id as usize).copied())
            .unwrap_or_else(|| is_noise(&snap.frames[id as usize]))
    }
}

/// A frame for tests.
#[cfg(test)]
pub(crate) fn test_frame(name: &str, file: &str, line: u32) -> Frame {
    Frame {
        name: name.into(),
        file: file.into(),
        line,
        extra: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::test_frame as frame;
    use super::*;

    #[test]
    fn the_packed_search_finds_the_noise_the_automaton_finds() {
        // Each pattern alone, inside other text, and cut short by a byte;
        // then the names and files of every frame of the real snapshots.
        let mut texts: Vec<String> = Vec::new();
        for p in NOISE_NAMES.iter().chain(NOISE_FILES) {
            texts.extend([
                p.to_string(),
                format!("x{p}y"),
                p[..p.len() - 1].to_string(),
            ]);
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let folders = [
            root.join("fixtures/torch-format"),
            root.join("../shared/fixtures/torch"),
        ];
        let files = (folders.iter().filter_map(|f| std::fs::read_dir(f).ok()))
            .flatten()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "pickle"));
        for file in files {
            let snap = snapdiff_format::read_path(&file).unwrap();
            texts.extend(
                snap.frames
                    .iter()
                    .flat_map(|f| [f.name.to_string(), f.file.to_string()]),
            );
        }
        for patterns in [NOISE_NAMES, NOISE_FILES] {
            let packed = Search::new(patterns);
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            assert!(matches!(packed, Search::Packed(_)), "no packed search here");
            let automaton = Search::automaton(patterns);
            let found = texts.iter().filter(|t| automaton.is_match(t)).count();
            assert!(
                found > patterns.len(),
                "only {found} of {} match",
                texts.len()
            );
            for text in &texts {
                assert_eq!(packed.is_match(text), automaton.is_match(text), "{text:?}");
            }
        }
    }

    #[test]
    fn key_is_fixed_by_the_specification() {
        // FNV-1a of "f\0a.py\0" + 7u32 LE + 0xff, computed independently with Python:
        // h=0xcbf29ce484222325
        // for b in b"f\x00a.py\x00" + (7).to_bytes(4,"little") + b"\xff": h=((h^b)*0x100000001b3)%2**64
        assert_eq!(
            key_of([&frame("f", "a.py", 7)]).to_string(),
            "7aa04b9b2a54b28b"
        );
    }

    #[test]
    fn noise_frames_do_not_change_the_key() {
        let user = frame("train_step", "/home/u/train.py", 12);
        let noisy = [
            frame("torch::unwind::unwind()", "??", 0),
            frame(
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
                "CUDACachingAllocator.cpp",
                0,
            ),
            user.clone(),
            frame("_PyEval_EvalFrameDefault", "??", 0),
            frame(
                "at::(anonymous namespace)::create_out(...)",
                "RegisterCUDA_0.cpp",
                0,
            ),
        ];
        assert_eq!(key_of(&noisy), key_of([&user]));
        assert_ne!(
            key_of([&user]),
            key_of([&frame("train_step", "/home/u/train.py", 13)])
        );
        assert_ne!(key_of([&user]), StackKey::NONE);
    }

    #[test]
    fn keys_of_a_snapshot_are_those_of_the_specification() {
        // Frames of different lengths, noise among them, and stacks of 0 to
        // 60 frames: more stacks than lanes, ending at different times.
        let mut frames: Vec<Frame> = (0..40)
            .map(|i| frame(&"f".repeat(i % 7 + 1), &format!("/src/m{i}.py"), i as u32))
            .collect();
        frames.push(frame("_PyEval_EvalFrameDefault", "??", 0));
        let stacks: Vec<Vec<FrameId>> = (0..300u32)
            .map(|s| (0..(s * 7) % 61).map(|k| (s * 13 + k * 5) % 41).collect())
            .collect();
        let snap = Snapshot {
            frames,
            stacks,
            ..Snapshot::default()
        };
        let keys = StackKeys::new(&snap);
        for (id, stack) in snap.stacks.iter().enumerate() {
            let expected = key_of(stack.iter().map(|&f| &snap.frames[f as usize]));
            assert_eq!(keys.key(Some(id as StackId)), expected, "stack {id}");
        }
    }
}
