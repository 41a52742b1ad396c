//! Stacks of allocations: captured cheaply, interned, symbolized lazily.
//!
//! At allocation only raw return addresses are taken, and identical stacks
//! share one id. Turning addresses into function, file and line is slow (the
//! first lookup parses the binary's debug information), so it happens when a
//! snapshot is built, once per address, with the result cached for later
//! snapshots. Addresses differ between processes, so snapshots store the
//! symbolized frames, never the addresses.

use std::cell::Cell;

use hashbrown::HashTable;
use rustc_hash::{FxBuildHasher, FxHashMap};
use snapdiff_format::Frame;
use std::hash::BuildHasher;

/// The deepest stack recorded; deeper stacks keep their innermost frames.
pub(crate) const MAX_FRAMES: usize = 64;

/// How return addresses are collected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackCapture {
    /// Unwind with the call-frame information (`.eh_frame`) that every
    /// module carries, whatever its build, through framehop's unwind rules,
    /// cached per address, and stopping where the walk meets the thread's
    /// last one: about 0.3 µs for 50 frames in a loop that allocates from
    /// one place (see docs/performance.md). Falls back to [`StackCapture::Unwind`] where
    /// the tables cannot be read (outside Linux on x86_64 and aarch64).
    Cfi,
    /// Walk frame pointers: tens of nanoseconds for a deep stack, but it
    /// needs every frame on the way to keep a frame pointer (build with
    /// `-C force-frame-pointers=yes`; see docs/runtime.md). Falls back to
    /// [`StackCapture::Cfi`] where this crate was built without them.
    FramePointers,
    /// Unwind with the system unwinder (the `backtrace` crate, which reads
    /// the same tables without caching): works everywhere, about 5 µs for
    /// 30 frames.
    Unwind,
}

impl StackCapture {
    /// The method this one comes to in this process: frame pointers become
    /// [`StackCapture::Cfi`] when the build has none, and the tables become
    /// [`StackCapture::Unwind`] where they cannot be read.
    ///
    /// ```
    /// use snapdiff_runtime::StackCapture;
    /// # #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    /// assert_eq!(StackCapture::Cfi.in_effect(), StackCapture::Cfi);
    /// ```
    pub fn in_effect(self) -> StackCapture {
        match self {
            StackCapture::FramePointers if frame_pointers::usable() => StackCapture::FramePointers,
            StackCapture::FramePointers | StackCapture::Cfi if cfi_available() => StackCapture::Cfi,
            _ => StackCapture::Unwind,
        }
    }
}

/// Captures the current thread's return addresses into `out`, innermost first.
#[inline(never)]
pub(crate) fn capture(method: StackCapture, out: &mut Vec<usize>) {
    out.clear();
    match method {
        StackCapture::FramePointers if frame_pointers::usable() => frame_pointers::walk(out),
        StackCapture::FramePointers | StackCapture::Cfi if cfi_walk(out) => {}
        _ => {
            out.clear();
            // SAFETY: on Linux this is `_Unwind_Backtrace`, which is thread-safe;
            // the crate's lock only matters for Windows' dbghelp.
            unsafe {
                backtrace::trace_unsynchronized(|frame| {
                    out.push(frame.ip() as usize);
                    out.len() < MAX_FRAMES
                })
            };
        }
    }
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod cfi;

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn cfi_walk(out: &mut Vec<usize>) -> bool {
    cfi::walk(out)
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn cfi_available() -> bool {
    cfi::available()
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn cfi_walk(_out: &mut Vec<usize>) -> bool {
    false
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn cfi_available() -> bool {
    false
}

thread_local! {
    /// This thread's stack range, looked up once.
    static STACK: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// The current thread's stack, as `[low, high)`.
fn thread_stack() -> Option<(usize, usize)> {
    STACK.with(|s| {
        if s.get().is_none() {
            s.set(query_stack_range());
        }
        s.get()
    })
}

#[cfg(target_os = "linux")]
fn query_stack_range() -> Option<(usize, usize)> {
    // SAFETY: plain libc calls on an attribute object we own.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr = std::ptr::null_mut();
        let mut size = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        ok.then(|| (addr as usize, addr as usize + size))
    }
}

#[cfg(not(target_os = "linux"))]
fn query_stack_range() -> Option<(usize, usize)> {
    None
}

/// Frame-pointer walking, where the architecture keeps the chain in a register.
mod frame_pointers {
    use super::{MAX_FRAMES, thread_stack as stack_range};

    /// Whether this build keeps frame pointers, checked once: a walk from a
    /// known function must find its return address inside the caller's code.
    /// Without frame pointers the walk finds some outer frame instead (or
    /// nothing), and capture falls back to unwinding.
    pub(super) fn usable() -> bool {
        static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *USABLE.get_or_init(|| {
            if stack_range().is_none() {
                return false;
            }
            let mut out = Vec::new();
            probe(&mut out);
            let start = probe as fn(&mut Vec<usize>) as usize;
            // `probe` is a few dozen bytes; its call to `walk` returns inside it.
            out.first()
                .is_some_and(|&ret| ret > start && ret < start + 256)
        })
    }

    #[inline(never)]
    fn probe(out: &mut Vec<usize>) {
        walk(out);
        std::hint::black_box(&out);
    }

    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    #[inline(always)]
    fn frame_pointer() -> usize {
        let fp: usize;
        // SAFETY: reads a register.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            std::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags));
            #[cfg(target_arch = "aarch64")]
            std::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags));
        }
        fp
    }

    /// Follows the chain of saved frame pointers: each frame record holds the
    /// caller's frame pointer and, just above it, the return address. Every
    /// pointer is checked to lie inside this thread's stack and to move
    /// outwards, so a frame without a frame pointer ends the walk early
    /// instead of reading stray memory.
    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    #[inline(never)]
    pub(super) fn walk(out: &mut Vec<usize>) {
        let Some((low, high)) = stack_range() else {
            return;
        };
        // Frames of callers lie between here and the top of the stack, a
        // range that is all mapped; below here may not be (the main thread's
        // stack grows on demand), so a stray frame pointer must not go there.
        let here = 0u8;
        let low = low.max(std::ptr::addr_of!(here) as usize);
        let mut fp = frame_pointer();
        let word = std::mem::size_of::<usize>();
        while out.len() < MAX_FRAMES {
            if fp < low || fp + 2 * word > high || !fp.is_multiple_of(word) {
                break;
            }
            // SAFETY: `fp` and `fp + word` lie in this thread's live stack, checked above.
            let (next, ret) = unsafe { (*(fp as *const usize), *((fp + word) as *const usize)) };
            if ret == 0 {
                break;
            }
            out.push(ret);
            if next <= fp {
                break;
            }
            fp = next;
        }
    }

    #[cfg(not(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )))]
    pub(super) fn walk(_out: &mut Vec<usize>) {}
}

/// Id of an interned stack of return addresses.
pub(crate) type RawStackId = u32;

/// Stacks of return addresses, each stored once.
#[derive(Default)]
pub(crate) struct StackTable {
    stacks: Vec<Box<[usize]>>,
    index: HashTable<RawStackId>,
}

impl StackTable {
    /// The id of the stack `ips`, adding it if new.
    pub(crate) fn intern(&mut self, ips: &[usize]) -> RawStackId {
        let hash = FxBuildHasher.hash_one(ips);
        let stacks = &self.stacks;
        if let Some(&id) = self.index.find(hash, |&i| &*stacks[i as usize] == ips) {
            return id;
        }
        let id = self.stacks.len() as RawStackId;
        self.stacks.push(ips.into());
        let stacks = &self.stacks;
        self.index
            .insert_unique(hash, id, |&i| FxBuildHasher.hash_one(&*stacks[i as usize]));
        id
    }

    pub(crate) fn get(&self, id: RawStackId) -> &[usize] {
        &self.stacks[id as usize]
    }
}

/// Whether a symbolized frame is the runtime's own (or the unwinder's): they
/// say nothing about the program, so snapshots leave them out. Inlined
/// frames carry only a function's bare name (`alloc`, or the `backtrace`
/// crate's `trace` in a release build), so the source file decides too:
/// anything under this crate's `src/` or the `backtrace` crate's.
fn is_own_frame(frame: &Frame) -> bool {
    const OWN_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/");
    let name = frame.name.as_str();
    name.contains("snapdiff_runtime::")
        || name.starts_with("backtrace::")
        || name.starts_with("<backtrace::")
        || frame.file.starts_with(OWN_SOURCES)
        || is_backtrace_source(&frame.file)
}

/// Whether `file` is a source of the `backtrace` crate, as Cargo unpacks it
/// (`…/backtrace-0.3.77/src/backtrace/libunwind.rs`).
fn is_backtrace_source(file: &str) -> bool {
    let mut dirs = file.split(['/', '\\']);
    while let Some(dir) = dirs.next() {
        let is_crate_dir = dir
            .strip_prefix("backtrace-")
            .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()));
        if is_crate_dir {
            return dirs.next() == Some("src");
        }
    }
    false
}

/// Symbolized frames per return address, kept for the life of the process.
#[derive(Default)]
pub(crate) struct Symbolizer {
    cache: FxHashMap<usize, Vec<Frame>>,
}

impl Symbolizer {
    /// The frames of return address `ip`: several when calls were inlined,
    /// innermost first; none when it belongs to the runtime itself.
    pub(crate) fn frames(&mut self, ip: usize) -> &[Frame] {
        self.cache.entry(ip).or_insert_with(|| {
            let mut frames = Vec::new();
            // `resolve` looks up `ip - 1`, the call instruction, so lines are call sites.
            backtrace::resolve(ip as *mut std::ffi::c_void, |sym| {
                let name = sym
                    .name()
                    .map_or_else(|| "??".to_owned(), |n| format!("{n:#}"));
                let file = sym
                    .filename()
                    .map_or_else(|| "??".to_owned(), |p| p.display().to_string());
                frames.push(Frame {
                    name: name.into(),
                    file: file.into(),
                    line: sym.lineno().unwrap_or(0),
                    extra: vec![],
                });
            });
            if frames.is_empty() {
                frames.push(Frame {
                    name: format!("0x{ip:x}").into(),
                    file: "??".into(),
                    line: 0,
                    extra: vec![],
                });
            }
            frames.retain(|f| !is_own_frame(f));
            frames
        })
    }
}

#[cfg(test)]
mod tests {
    use super::is_backtrace_source;

    /// The `backtrace` crate's sources are known by their unpacked folder,
    /// which a release build's inlined `trace` frame names; a user's folder
    /// that merely starts with the word is not one of them.
    #[test]
    fn backtrace_sources_are_known_by_their_crate_folder() {
        assert!(is_backtrace_source(
            "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/backtrace-0.3.77/src/backtrace/libunwind.rs"
        ));
        assert!(is_backtrace_source(
            r"C:\Users\me\.cargo\registry\src\index\backtrace-0.3.71\src\backtrace\dbghelp64.rs"
        ));
        assert!(!is_backtrace_source(
            "/home/me/backtrace-analysis/src/train.rs"
        ));
        assert!(!is_backtrace_source("/home/me/backtrace-2/notes/train.rs"));
        assert!(!is_backtrace_source("/home/me/project/src/main.rs"));
    }
}
