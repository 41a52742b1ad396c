//! Unwinding from the call-frame information every Linux module carries
//! (`.eh_frame`, indexed by `.eh_frame_hdr`), with framehop.
//!
//! Rust, C and C++ code keeps this information whether or not it was built
//! with frame pointers (the C++ exception machinery needs it), so this works
//! for any user's build, where a frame-pointer walk would silently skip or
//! misread frames of code built without them. The loaded modules' tables are
//! found once with `dl_iterate_phdr` and used in place, where the loader
//! mapped them: nothing is read from disk or copied. framehop caches the rule
//! for each address it has unwound through (per thread here, see
//! [`CACHES`]), so a frame costs a cache look-up and two stack reads.
//!
//! A training loop allocates from the same places over and over, under the
//! same outer frames, so each thread keeps its last walk ([`LastWalk`]) and
//! a new walk stops unwinding at the first frame where it meets the last
//! one: same code address, same registers, and every stack word the last
//! walk read from there on still holding what it read. A walk is a function
//! of those alone, so the rest of it would come out the same; checking the
//! words costs a load each, against about 10 ns a frame unwound.
//!
//! Modules loaded after the tables were built (`dlopen`) are picked up when a
//! walk fails and the loader reports a change.

use std::cell::RefCell;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use framehop::{
    CacheNative, ExplicitModuleSectionInfo, FrameAddress, MayAllocateDuringUnwind, Module,
    UnwindRegsNative, Unwinder, UnwinderNative,
};

use super::MAX_FRAMES;

type Tables = UnwinderNative<&'static [u8], MayAllocateDuringUnwind>;

/// The unwind tables of the loaded modules, and the loader's count of loads
/// and unloads when they were built.
struct Loaded {
    tables: Tables,
    /// How many modules have tables.
    modules: usize,
    changes: u64,
    /// Which build of the tables this is: a [`LastWalk`] is only reused
    /// with the tables it was made with.
    generation: u64,
}

static LOADED: RwLock<Option<Loaded>> = RwLock::new(None);

/// How many times the tables have been built.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

/// framehop's rule cache is direct-mapped: 509 slots, a rule in slot
/// `address % 509`. Two hot return addresses with the same remainder, which
/// among a few dozen is likely (a birthday collision, decided afresh by each
/// run's load address), evict each other on every walk, and each eviction
/// costs a search of the tables: allocation with stacks took 1.3 µs in such
/// runs against 0.6 µs in the others. Each thread keeps this many caches and
/// looks an address up in the one its quotient by 509 picks, so two
/// addresses collide only if they share both remainders: as one cache of
/// 509 × 16 slots (12 KiB each, 200 KiB a thread that allocates).
const CACHES: u64 = 16;
/// framehop's slot count (`CACHE_ENTRY_COUNT`, private to it).
const CACHE_SLOTS: u64 = 509;

thread_local! {
    /// This thread's rule caches and walks.
    static WALKER: RefCell<Walker> = RefCell::new(Walker::new());
}

/// What a thread keeps between walks.
struct Walker {
    /// Caches of unwind rules by address (see [`CACHES`]).
    caches: Vec<CacheNative<MayAllocateDuringUnwind>>,
    /// The last walk, for the next to take its outer frames over.
    last: LastWalk,
    /// The frames of the walk under way, innermost first (kept to reuse
    /// their memory), with the words each read.
    steps: Vec<Step>,
    reads: Vec<(u64, u64)>,
}

impl Walker {
    fn new() -> Walker {
        Walker {
            caches: (0..CACHES).map(|_| CacheNative::new()).collect(),
            last: LastWalk::default(),
            steps: Vec::new(),
            reads: Vec::new(),
        }
    }
}

/// A walk, outermost frame first, so that the next walk replaces only its
/// inner end.
#[derive(Default)]
struct LastWalk {
    /// The tables' generation it was made with.
    generation: u64,
    /// Each frame, as it was before being unwound.
    steps: Vec<Step>,
    /// Every stack word read, as (address, value), the outermost frame's
    /// first.
    reads: Vec<(u64, u64)>,
    /// Whether the outermost step is not the stack's end: the walk stopped
    /// at [`MAX_FRAMES`].
    truncated: bool,
}

/// A frame of a walk, as it was before being unwound.
#[derive(Clone, Copy)]
struct Step {
    address: FrameAddress,
    /// The registers framehop's rules read ([`registers_read`]).
    regs: [u64; 3],
    /// The return address unwinding it found; 0 at the stack's end.
    found: usize,
    /// In [`LastWalk::reads`], where the reads of this frame and of those
    /// outside it end; in [`Walker::reads`], where this frame's end.
    reads_end: usize,
}

/// Walks the current thread's stack, pushing return addresses into `out`
/// (innermost first, this function's own frame left out). Returns false
/// when the stack could not be walked this way at all (no tables, or an
/// unknown thread stack), so that the caller can use another method.
#[inline(never)]
pub(super) fn walk(out: &mut Vec<usize>) -> bool {
    let (pc, sp, fp) = registers();
    let Some((_, high)) = super::thread_stack() else {
        return false;
    };
    // The tables are read under one shared lock for the whole walk.
    let complete = {
        let Ok(loaded) = LOADED.read() else {
            return false;
        };
        match loaded.as_ref() {
            Some(loaded) => {
                let complete = unwind(loaded, pc, sp, fp, high, out);
                complete || loader_changes() == Some(loaded.changes)
            }
            None => false,
        }
    };
    if !complete {
        // No tables yet, or a module loaded since they were built: build
        // them and walk once more.
        rebuild();
        out.clear();
        if let Ok(loaded) = LOADED.read()
            && let Some(loaded) = loaded.as_ref()
        {
            unwind(loaded, pc, sp, fp, high, out);
        }
    }
    !out.is_empty()
}

/// Whether this thread's stack can be walked from the tables: its bounds
/// are known and some module has tables.
pub(super) fn available() -> bool {
    if LOADED.read().is_ok_and(|l| l.is_none()) {
        rebuild();
    }
    super::thread_stack().is_some()
        && LOADED
            .read()
            .is_ok_and(|l| l.as_ref().is_some_and(|l| l.modules > 0))
}

/// Unwinds with `loaded`'s tables from the registers `pc`, `sp`, `fp` of
/// [`walk`]'s frame over the stack that ends at `high`. Returns whether the
/// walk reached the stack's end (or `MAX_FRAMES`) rather than an error.
fn unwind(loaded: &Loaded, pc: u64, sp: u64, fp: u64, high: usize, out: &mut Vec<usize>) -> bool {
    WALKER.with_borrow_mut(|walker| {
        if walker.last.generation != loaded.generation {
            walker.last = LastWalk {
                generation: loaded.generation,
                ..LastWalk::default()
            };
        }
        walker.steps.clear();
        walker.reads.clear();
        let stack = sp..high as u64;
        let (kept, truncated) = match unwind_until_met(loaded, walker, pc, sp, fp, &stack, out) {
            Ended::Met(at) => {
                // All but the stack's end, which only the outermost can be.
                let shared = &walker.last.steps[..=at];
                let shared = &shared[usize::from(shared[0].found == 0)..];
                let room = MAX_FRAMES - out.len();
                out.extend(shared.iter().rev().take(room).map(|s| s.found));
                #[cfg(test)]
                TAKEN_OVER.set(TAKEN_OVER.get() + out.len() - walker.steps.len());
                (at + 1, walker.last.truncated)
            }
            Ended::Top => (0, false),
            Ended::Truncated => (0, true),
            // The last walk still holds for the next.
            Ended::Failed => return false,
        };
        remember(walker, kept, truncated);
        true
    })
}

/// Makes the last walk the walk just done: its own frames inside the
/// last walk's outermost `kept`.
fn remember(walker: &mut Walker, kept: usize, truncated: bool) {
    let last = &mut walker.last;
    let kept_reads = kept.checked_sub(1).map_or(0, |i| last.steps[i].reads_end);
    last.steps.truncate(kept);
    last.reads.truncate(kept_reads);
    last.truncated = truncated;
    // Both copied in one pass each, reversed: a frame's reads are checked
    // all together, in any order. Those of the walk's frame `i` and outside
    // it were `reads[first_read(i)..]`.
    let reads = walker.reads.len();
    last.reads.extend(walker.reads.iter().rev());
    let steps = &walker.steps;
    last.steps.extend((0..steps.len()).rev().map(|i| {
        let first_read = i.checked_sub(1).map_or(0, |i| steps[i].reads_end);
        Step {
            reads_end: kept_reads + reads - first_read,
            ..steps[i]
        }
    }));
    // A stack deeper than the deepest recorded keeps only its inner
    // frames, as a walk of its own would, so that checking them stays
    // short.
    if let Some(excess) = last.steps.len().checked_sub(MAX_FRAMES + 1)
        && excess > 0
    {
        let dropped_reads = last.steps[excess - 1].reads_end;
        last.steps.drain(..excess);
        last.reads.drain(..dropped_reads);
        for step in &mut last.steps {
            step.reads_end -= dropped_reads;
        }
        last.truncated = true;
    }
}

#[cfg(test)]
thread_local! {
    /// How many return addresses this thread's walks have taken over from
    /// the walk before them.
    static TAKEN_OVER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How a walk ended.
enum Ended {
    /// At the stack's end.
    Top,
    /// At [`MAX_FRAMES`].
    Truncated,
    /// Where it met the last walk, at this step of it.
    Met(usize),
    /// At a frame that could not be unwound.
    Failed,
}

/// Unwinds frame after frame into `out`, recording each in the walker's
/// steps, until the stack's end or a frame where the walk meets the last.
fn unwind_until_met(
    loaded: &Loaded,
    walker: &mut Walker,
    pc: u64,
    sp: u64,
    fp: u64,
    stack: &std::ops::Range<u64>,
    out: &mut Vec<usize>,
) -> Ended {
    // A constant, not a local the closure captures: framehop runs the
    // closure out of line, where a captured divisor became a 64-bit `div`
    // on every word read (seen with `perf annotate`).
    const WORD: u64 = std::mem::size_of::<u64>() as u64;
    let Walker {
        caches,
        last,
        steps,
        reads,
    } = walker;
    let mut regs = initial_registers(pc, sp, fp);
    // The first frame is this walk's own instruction pointer: unwound
    // through, not pushed.
    let mut address = FrameAddress::from_instruction_pointer(pc);
    // The last walk's steps from `beside - 1` outward are at or above this
    // frame's stack pointer.
    let mut beside = last.steps.len();
    // The first read of the last walk found changed: meeting it at a step
    // outside which the stack has changed cannot succeed.
    let mut changed_at = usize::MAX;
    loop {
        if out.len() >= MAX_FRAMES {
            return Ended::Truncated;
        }
        let read = registers_read(&regs);
        while beside > 0 && last.steps[beside - 1].regs[0] < read[0] {
            beside -= 1;
        }
        if let Some(at) = beside.checked_sub(1)
            && let step = &last.steps[at]
            && step.reads_end <= changed_at
            && step.address == address
            && step.regs == read
            // Cut short at `MAX_FRAMES`, the last walk may lack frames
            // this one would find.
            && !(last.truncated && at + 1 < MAX_FRAMES - out.len())
        {
            match first_changed(&last.reads[..step.reads_end], stack) {
                None => return Ended::Met(at),
                Some(changed) => changed_at = changed,
            }
        }
        let mut read_stack = |addr: u64| {
            if stack.contains(&addr) && addr + WORD <= stack.end && addr.is_multiple_of(WORD) {
                // SAFETY: inside this thread's live stack, checked above.
                let value = unsafe { *(addr as *const u64) };
                reads.push((addr, value));
                Ok(value)
            } else {
                Err(())
            }
        };
        let lookup = address.address_for_lookup();
        let cache = &mut caches[((lookup / CACHE_SLOTS) % CACHES) as usize];
        let next = match loaded
            .tables
            .unwind_frame(address, &mut regs, cache, &mut read_stack)
        {
            Ok(Some(found)) => match FrameAddress::from_return_address(found) {
                Some(next) => Some((found, next)),
                None => return Ended::Failed,
            },
            Ok(None) => None,
            Err(_) => return Ended::Failed,
        };
        steps.push(Step {
            address,
            regs: read,
            found: next.map_or(0, |(found, _)| found as usize),
            reads_end: reads.len(),
        });
        let Some((found, next)) = next else {
            return Ended::Top;
        };
        out.push(found as usize);
        address = next;
    }
}

/// The index of the first of `reads` whose word on the stack holds
/// another value now (or lies outside `stack`), if any.
fn first_changed(reads: &[(u64, u64)], stack: &std::ops::Range<u64>) -> Option<usize> {
    reads.iter().position(|&(addr, value)| {
        // SAFETY: read only inside this thread's live stack, and aligned
        // (it was when recorded).
        !(stack.contains(&addr)
            && addr + 8 <= stack.end
            && unsafe { *(addr as *const u64) } == value)
    })
}

/// The registers that framehop's unwind rules read, stack pointer first:
/// on x86_64 the stack and frame pointers and the instruction pointer
/// (rules that pop other registers set them, and nothing reads them).
#[cfg(target_arch = "x86_64")]
fn registers_read(regs: &UnwindRegsNative) -> [u64; 3] {
    [regs.sp(), regs.bp(), regs.ip()]
}

/// On aarch64, the stack and frame pointers and the link register.
#[cfg(target_arch = "aarch64")]
fn registers_read(regs: &UnwindRegsNative) -> [u64; 3] {
    [regs.sp(), regs.fp(), regs.lr()]
}

#[cfg(target_arch = "x86_64")]
fn initial_registers(pc: u64, sp: u64, fp: u64) -> UnwindRegsNative {
    UnwindRegsNative::new(pc, sp, fp)
}

/// The program counter, stack pointer and frame pointer of the caller (this
/// is inlined into [`walk`], so they are `walk`'s own).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn registers() -> (u64, u64, u64) {
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: reads registers.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags)
        );
    }
    (pc, sp, fp)
}

#[cfg(target_arch = "aarch64")]
fn initial_registers(_pc: u64, sp: u64, fp: u64) -> UnwindRegsNative {
    let lr: u64;
    // SAFETY: reads a register. `walk` has called functions since its
    // start, so the value is stale, but the unwind rules of a non-leaf
    // frame always take the return address from the stack.
    unsafe {
        std::arch::asm!("mov {}, x30", out(reg) lr, options(nomem, nostack, preserves_flags))
    };
    UnwindRegsNative::new(lr, sp, fp)
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn registers() -> (u64, u64, u64) {
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: reads registers.
    unsafe {
        std::arch::asm!(
            "adr {pc}, .",
            "mov {sp}, sp",
            "mov {fp}, x29",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags)
        );
    }
    (pc, sp, fp)
}

/// Builds the tables of the modules loaded now.
#[cold]
fn rebuild() {
    let mut tables = Tables::new();
    let mut modules = 0;
    let mut changes = None;
    for_each_module(|info| {
        changes.get_or_insert(info.dlpi_adds + info.dlpi_subs);
        if let Some(module) = module_of(info) {
            tables.add_module(module);
            modules += 1;
        }
    });
    if let Ok(mut loaded) = LOADED.write() {
        *loaded = Some(Loaded {
            tables,
            modules,
            changes: changes.unwrap_or(0),
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1,
        });
    }
}

/// The loader's count of modules loaded and unloaded so far.
fn loader_changes() -> Option<u64> {
    let mut changes = None;
    for_each_module(|info| {
        changes.get_or_insert(info.dlpi_adds + info.dlpi_subs);
    });
    changes
}

/// Calls `f` with each loaded module's description.
fn for_each_module(mut f: impl FnMut(&libc::dl_phdr_info)) {
    unsafe extern "C" fn call(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `&mut dyn FnMut` passed below, and the
        // loader passes a valid description for the length of the call.
        unsafe {
            let f = &mut *(data as *mut &mut dyn FnMut(&libc::dl_phdr_info));
            f(&*info);
        }
        0
    }
    let mut f: &mut dyn FnMut(&libc::dl_phdr_info) = &mut f;
    // SAFETY: the callback only runs during this call, with `f` alive.
    unsafe { libc::dl_iterate_phdr(Some(call), &mut f as *mut _ as *mut libc::c_void) };
}

/// The module `info` describes, with its unwind tables as the loader mapped
/// them; `None` when it has no `.eh_frame_hdr`.
fn module_of(info: &libc::dl_phdr_info) -> Option<Module<&'static [u8]>> {
    let base = info.dlpi_addr;
    // SAFETY: the loader's program headers of a loaded module.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let loads = headers.iter().filter(|h| h.p_type == libc::PT_LOAD);
    let start = loads.clone().map(|h| h.p_vaddr).min()?;
    let end = loads.clone().map(|h| h.p_vaddr + h.p_memsz).max()?;
    let hdr = headers.iter().find(|h| h.p_type == libc::PT_GNU_EH_FRAME)?;
    // SAFETY: a loaded module's segments stay mapped while it is loaded;
    // modules are not unloaded under a running allocation.
    let hdr_data: &'static [u8] = unsafe {
        std::slice::from_raw_parts((base + hdr.p_vaddr) as *const u8, hdr.p_memsz as usize)
    };
    let eh_frame_svma = eh_frame_address(hdr_data, hdr.p_vaddr)?;
    // `.eh_frame` runs to the end of its segment at most.
    let segment = loads
        .clone()
        .find(|h| (h.p_vaddr..h.p_vaddr + h.p_filesz).contains(&eh_frame_svma))?;
    let eh_frame_len = segment.p_vaddr + segment.p_filesz - eh_frame_svma;
    // SAFETY: as above; the range lies inside a mapped segment.
    let eh_frame: &'static [u8] = unsafe {
        std::slice::from_raw_parts((base + eh_frame_svma) as *const u8, eh_frame_len as usize)
    };
    // SAFETY: the loader's name of the module, a C string.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
        .to_string_lossy()
        .into_owned();
    Some(Module::new(
        name,
        base + start..base + end,
        base,
        ExplicitModuleSectionInfo {
            base_svma: 0,
            eh_frame_hdr_svma: Some(hdr.p_vaddr..hdr.p_vaddr + hdr.p_memsz),
            eh_frame_hdr: Some(hdr_data),
            eh_frame_svma: Some(eh_frame_svma..eh_frame_svma + eh_frame_len),
            eh_frame: Some(eh_frame),
            ..Default::default()
        },
    ))
}

/// The address `.eh_frame_hdr` (at `hdr_svma`) gives for `.eh_frame`: its
/// second byte says how the pointer at offset 4 is encoded (DWARF's
/// `DW_EH_PE_*`: a size in the low bits, relative to the pointer's own
/// address with 0x10). Linkers write 0x1b (relative, signed 4 bytes).
fn eh_frame_address(hdr: &[u8], hdr_svma: u64) -> Option<u64> {
    let encoding = *hdr.get(1)?;
    let field = hdr.get(4..)?;
    let value = match encoding & 0x0f {
        0x00 | 0x04 => u64::from_le_bytes(field.get(..8)?.try_into().ok()?),
        0x03 => u64::from(u32::from_le_bytes(field.get(..4)?.try_into().ok()?)),
        0x0b => i32::from_le_bytes(field.get(..4)?.try_into().ok()?) as i64 as u64,
        _ => return None,
    };
    match encoding & 0x70 {
        0x00 => Some(value),
        0x10 => Some((hdr_svma + 4).wrapping_add(value)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::hint::black_box;

    use super::{MAX_FRAMES, TAKEN_OVER, WALKER, walk};

    /// Walks from here twice: meeting this thread's last walk, then afresh
    /// (the last walk put aside, so that the next call meets this one's).
    #[inline(never)]
    fn walk_both() -> (Vec<usize>, Vec<usize>) {
        let (mut met, mut fresh) = (Vec::new(), Vec::new());
        assert!(walk(&mut met));
        let kept = WALKER.with_borrow(|w| w.last.steps.len());
        assert!(kept <= MAX_FRAMES + 1, "{kept} frames kept");
        let last = WALKER.with_borrow_mut(|w| std::mem::take(&mut w.last));
        assert!(walk(&mut fresh));
        WALKER.with_borrow_mut(|w| w.last = last);
        (met, fresh)
    }

    #[inline(never)]
    fn nested(depth: usize) -> (Vec<usize>, Vec<usize>) {
        let walks = if depth == 0 {
            walk_both()
        } else {
            nested(depth - 1)
        };
        black_box(depth);
        walks
    }

    /// Two callers alike but for their return addresses: walks under one
    /// meet walks under the other at every frame below them.
    #[inline(never)]
    fn from_left(depth: usize) -> (Vec<usize>, Vec<usize>) {
        let walks = nested(depth);
        black_box(1);
        walks
    }

    #[inline(never)]
    fn from_right(depth: usize) -> (Vec<usize>, Vec<usize>) {
        let walks = nested(depth);
        black_box(2);
        walks
    }

    #[test]
    fn a_walk_that_meets_the_last_one_finds_what_a_fresh_walk_finds() {
        let taken_before = TAKEN_OVER.get();
        for (depth, left) in [
            (6, true),
            (6, true),
            (6, false),
            (6, true),
            (9, true),
            (3, false),
            (3, true),
            (70, true),
            (70, true),
            (71, false),
            // Shallower under the same caller: the last walk, cut at
            // `MAX_FRAMES`, lacks the outer frames these have room for.
            (69, false),
            (67, false),
            // Deeper and deeper: each walk keeps only the inner frames.
            (68, false),
            (69, false),
            (70, false),
            (0, false),
        ] {
            let (met, fresh) = if left {
                from_left(depth)
            } else {
                from_right(depth)
            };
            // The first return address is the call in `walk_both`.
            assert_eq!(met[1..], fresh[1..], "depth {depth}, left {left}");
            assert!(fresh.len() > depth.min(60), "{fresh:?}");
        }
        assert!(
            TAKEN_OVER.get() - taken_before > 100,
            "walks met the last one and took its frames over"
        );
    }

    #[test]
    fn eh_frame_pointers_are_decoded() {
        // Relative, signed 4 bytes: -0x100 from the field at 0x2004.
        let hdr = [1, 0x1b, 0x03, 0x3b, 0x00, 0xff, 0xff, 0xff];
        assert_eq!(super::eh_frame_address(&hdr, 0x2000), Some(0x2004 - 0x100));
        // Absolute, 4 bytes.
        let hdr = [1, 0x03, 0x03, 0x3b, 0x00, 0x30, 0x00, 0x00];
        assert_eq!(super::eh_frame_address(&hdr, 0x2000), Some(0x3000));
        // An encoding this reader does not know.
        assert_eq!(
            super::eh_frame_address(&[1, 0x50, 0, 0, 0, 0, 0, 0], 0),
            None
        );
    }
}
