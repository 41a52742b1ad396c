//! The files a command is given: which are snapshots (folders opened,
//! capture's own files passed over), and reading them, with progress on a
//! terminal for large ones and their memory handed back when done.

use std::path::PathBuf;

use snapdiff_format::names::{SNAPSHOT_EXTENSIONS, is_capture_file, is_snapshot_name};
use snapdiff_format::{Parts, Reader};

/// Files at least this large show their progress on stderr while they are
/// read, when stderr is a terminal.
const PROGRESS_FROM_BYTES: u64 = 64 << 20;

/// Reads a snapshot file, showing progress on stderr for large files when
/// stderr is a terminal.
pub(crate) fn read(path: &std::path::Path) -> snapdiff_format::Result<snapdiff_format::Snapshot> {
    read_parts(path, Parts::All)
}

/// The progress lines of the files being read, one each, shared by the
/// threads that read several files at once.
fn progress_lines() -> &'static indicatif::MultiProgress {
    static LINES: std::sync::OnceLock<indicatif::MultiProgress> = std::sync::OnceLock::new();
    LINES.get_or_init(indicatif::MultiProgress::new)
}

/// [`read`] of the `parts` a command needs. A large file's line shows a bar
/// over the bytes parsed (with rate and time left); the line goes when the
/// file is read. The memory that reading a large file used and freed goes
/// back to the operating system, so that it does not add to the analysis's
/// peak.
pub(crate) fn read_parts(
    path: &std::path::Path,
    parts: Parts,
) -> snapdiff_format::Result<snapdiff_format::Snapshot> {
    read_parts_with(path, parts, Reader::new())
}

/// [`read_parts`] for a file read beside others, each on a thread of its
/// own: a large pickle is then read on its one thread, not two.
pub(crate) fn read_beside(
    path: &std::path::Path,
    parts: Parts,
) -> snapdiff_format::Result<snapdiff_format::Snapshot> {
    read_parts_with(path, parts, Reader::new().one_thread())
}

fn read_parts_with(
    path: &std::path::Path,
    parts: Parts,
    reader: Reader,
) -> snapdiff_format::Result<snapdiff_format::Snapshot> {
    let len = content_size_guess(path);
    if len < RETURN_AT_ONCE_FROM_BYTES {
        // What a small file's reading frees (a few MB at most) is kept for
        // the analysis: handed back, the analysis would fault it in again,
        // a twentieth of `check`'s time on one step's dump.
        return read_with_progress(path, reader.parts(parts));
    }
    let snap = {
        let _at_once = ReturnAtOnce::new();
        read_with_progress(path, reader.parts(parts))
    };
    return_freed_memory();
    snap
}

/// About how many bytes of snapshot `path` holds: its size, or for a
/// compressed file or a `.snap` (zstd inside) a high guess at its
/// content's (snapshot pickles compress 3 to 20 times; returning memory at
/// once for one smaller file costs nothing that shows).
fn content_size_guess(path: &std::path::Path) -> u64 {
    use std::io::Read;
    let Ok(mut file) = snapdiff_format::open_regular(path) else {
        return 0; // the reader says why
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let mut head = [0u8; 6];
    let compressed = file.read_exact(&mut head).is_ok_and(|()| {
        snapdiff_format::Compression::detect(&head).is_some()
            || head[..] == snapdiff_format::MAGIC[..head.len()]
    });
    if compressed {
        len.saturating_mul(16)
    } else {
        len
    }
}

/// Files of at least this much content are read with freed memory going
/// back to the operating system at once (see [`ReturnAtOnce`]). Below it,
/// what the parse frees lingers for mimalloc's purge delay, so the peak
/// would depend on how busy the machine is: a 36 MB trace peaked at 40 MiB
/// or 48 MiB from run to run; at once it is 40 MiB every time, in the same
/// time (six such files in `trend`: 0.45 s either way).
const RETURN_AT_ONCE_FROM_BYTES: u64 = 16 << 20;

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_e`, which
/// libmimalloc-sys does not name): how long freed memory is kept before it
/// goes back to the system, 10 ms by default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// mimalloc's `mi_option_destroy_on_exit`, as [`MI_OPTION_PURGE_DELAY`]:
/// above 1, mimalloc does nothing at the process's exit.
const MI_OPTION_DESTROY_ON_EXIT: libmimalloc_sys::mi_option_t = 22;

/// Has mimalloc leave its memory as it is when the process exits, as the
/// system takes it back whole. By default it first hands its freed pages
/// back one range at a time: forty `madvise` calls at the exit of `snapdiff
/// check` of one step's dump, 0.1 to 0.5 ms of its 6.
pub(crate) fn leave_memory_at_exit() {
    // SAFETY: setting an option of the allocator is allowed at any time
    // from any thread.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_DESTROY_ON_EXIT, 2) };
}

/// While one lives, memory freed goes back to the system at once. Reading a
/// large pickle frees its parse's blocks chunk by chunk as its segments take
/// them, and returning them at once keeps them out of the peak: 488 MB →
/// 370 MB on a 213 MB file of a million blocks, in the same time. Not for
/// many small files (a fleet's), which reuse what they free: there it cost
/// a sixth more time. Threads reading large files at once share one.
pub(crate) struct ReturnAtOnce;

/// Large reads under way, and the purge delay to restore after the last.
static AT_ONCE: std::sync::Mutex<(usize, std::ffi::c_long)> = std::sync::Mutex::new((0, 0));

impl ReturnAtOnce {
    pub(crate) fn new() -> ReturnAtOnce {
        if let Ok(mut at_once) = AT_ONCE.lock() {
            if at_once.0 == 0 {
                // SAFETY: reading and setting an option of the allocator is
                // allowed at any time from any thread.
                at_once.1 = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
                unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
            }
            at_once.0 += 1;
        }
        ReturnAtOnce
    }
}

impl Drop for ReturnAtOnce {
    fn drop(&mut self) {
        if let Ok(mut at_once) = AT_ONCE.lock() {
            at_once.0 = at_once.0.saturating_sub(1);
            if at_once.0 == 0 {
                // SAFETY: as in `new`.
                unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, at_once.1) };
            }
        }
    }
}

/// Reads `path` on one thread (a fleet reads many files at once), without
/// a progress bar of its own (a fleet shows one for all its files): its
/// state at dump time, and its traces' events too when `whole` (a fleet
/// judges a rank by its series of dumps, and a rank of one file by its
/// trace).
pub(crate) fn read_quietly(
    path: &std::path::Path,
    whole: bool,
) -> snapdiff_format::Result<snapdiff_format::Snapshot> {
    let parts = if whole {
        Parts::All
    } else {
        Parts::WithoutEvents
    };
    Reader::new().one_thread().parts(parts).read_path(path)
}

fn read_with_progress(
    path: &std::path::Path,
    reader: Reader,
) -> snapdiff_format::Result<snapdiff_format::Snapshot> {
    use std::io::IsTerminal;
    if path.is_dir() {
        return Err(snapdiff_format::Error::new(
            snapdiff_format::ErrorKind::Io,
            "is a folder, not a snapshot file (snapdiff trend FOLDER reads the snapshots in one)",
        )
        .with_path(path));
    }
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    if len < PROGRESS_FROM_BYTES || !std::io::stderr().is_terminal() {
        return reader.read_path(path);
    }
    let bar = progress_lines().add(indicatif::ProgressBar::new(len));
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(format!("reading {}", path.display()));
    let shown = bar.clone();
    let result = reader
        .progress(move |done, _| shown.set_position(done))
        .read_path(path);
    bar.finish_and_clear();
    progress_lines().remove(&bar);
    result
}

/// Returns the memory freed so far to the operating system at once.
/// mimalloc keeps freed pages for a moment in case they are wanted again;
/// after reading a large file, keeping them would add its reading's
/// transient peak (the buffer of its longest trace column, say) to the
/// analysis's or the next file's.
pub(crate) fn return_freed_memory() {
    // SAFETY: mi_collect only walks the allocator's own free lists; it is
    // safe to call at any time from any thread.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Hands a loaded snapshot to the operating system instead of freeing it
/// piece by piece: the process exits right after printing, and dropping
/// millions of trace events one by one costs tens of milliseconds for nothing.
pub(crate) fn release(snapshots: impl IntoIterator<Item = snapdiff_format::Snapshot>) {
    for snap in snapshots {
        std::mem::forget(snap);
    }
}

/// `files`, with each folder among them replaced by the snapshot files in
/// it (by their extension; `manifest.jsonl` and others are passed over),
/// and capture's own files passed over.
pub(crate) fn snapshot_files(files: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for path in files {
        if !path.is_dir() {
            if !is_capture_file(path) {
                out.push(path.clone());
            }
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| anyhow::anyhow!("{}: cannot read the folder: {e}", path.display()))?
            .filter_map(|entry| Some(entry.ok()?.path()))
            .filter(|p| p.is_file() && is_snapshot_name(p))
            .collect();
        if found.is_empty() {
            anyhow::bail!(
                "{}: no snapshot files in this folder (looked for .{})",
                path.display(),
                SNAPSHOT_EXTENSIONS.join(", .")
            );
        }
        found.sort();
        out.extend(found);
    }
    if out.is_empty()
        && let Some(first) = files.first()
    {
        anyhow::bail!(
            "{}: a file capture writes beside its dumps, not a snapshot (give the snapshots, \
             or their folder)",
            first.display()
        );
    }
    Ok(out)
}
