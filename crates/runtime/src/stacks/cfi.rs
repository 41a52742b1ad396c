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
//! [`CACHES`]), so the steady
//! state of a training loop, which allocates from the same places over and
//! over, costs a cache look-up and two stack reads per frame.
//!
//! Modules loaded after the tables were built (`dlopen`) are picked up when a
//! walk fails and the loader reports a change.

use std::cell::RefCell;
use std::sync::RwLock;

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
}

static LOADED: RwLock<Option<Loaded>> = RwLock::new(None);

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
    /// This thread's caches of unwind rules by address.
    static CACHE: RefCell<Vec<CacheNative<MayAllocateDuringUnwind>>> =
        RefCell::new((0..CACHES).map(|_| CacheNative::new()).collect());
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
/// [`walk`]'s frame over the stack that ends at `high`. Returns whether the walk reached the stack's
/// end (or `MAX_FRAMES`) rather than an error.
fn unwind(loaded: &Loaded, pc: u64, sp: u64, fp: u64, high: usize, out: &mut Vec<usize>) -> bool {
    // A constant, not a local the closure captures: framehop runs the
    // closure out of line, where a captured divisor became a 64-bit `div`
    // on every word read (seen with `perf annotate`).
    const WORD: u64 = std::mem::size_of::<u64>() as u64;
    // Everything between the stack pointer and the stack's top is mapped;
    // the unwinder reads only there.
    let high = high as u64;
    let mut read_stack = move |addr: u64| {
        if addr >= sp && addr + WORD <= high && addr.is_multiple_of(WORD) {
            // SAFETY: inside this thread's live stack, checked above.
            Ok(unsafe { *(addr as *const u64) })
        } else {
            Err(())
        }
    };
    CACHE.with_borrow_mut(|caches| {
        let mut regs = initial_registers(pc, sp, fp);
        // The first frame is this walk's own instruction pointer: unwound
        // through, not pushed.
        let mut address = FrameAddress::from_instruction_pointer(pc);
        while out.len() < MAX_FRAMES {
            let lookup = address.address_for_lookup();
            let cache = &mut caches[((lookup / CACHE_SLOTS) % CACHES) as usize];
            match loaded
                .tables
                .unwind_frame(address, &mut regs, cache, &mut read_stack)
            {
                Ok(Some(return_address)) => {
                    let Some(next) = FrameAddress::from_return_address(return_address) else {
                        return false;
                    };
                    out.push(return_address as usize);
                    address = next;
                }
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
        true
    })
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
