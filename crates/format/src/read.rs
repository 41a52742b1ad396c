//! Reading snapshot files from disk.
//!
//! A large file is mapped rather than copied into memory, and while a
//! pickle is parsed (or a `.snap` file decompressed) the pages already
//! behind the reader are handed back to the system: a pickle of a gigabyte
//! would otherwise hold the whole file in memory beside everything built
//! from it. The parser looks back at earlier bytes now and then (strings it
//! borrows, frame lists it has seen); those pages are read in again from the
//! file, which is unchanged.

use std::path::Path;

use crate::error::{Error, Result};
use crate::progress::{Pages, Progress};
use crate::{Parts, Snapshot, read_bytes_parts_with};

/// Files from this size are mapped rather than read into memory.
const MAP_FROM_BYTES: u64 = 32 << 20;
/// Compressed files from this size are mapped too: their pages go back as
/// they are decompressed, instead of the whole file staying in memory
/// beside the parse of its content (a 110 MB pickle gzipped to 18 MB
/// peaked 20 – 33 MiB above the plain file).
const MAP_COMPRESSED_FROM_BYTES: u64 = 1 << 20;

/// How a snapshot is read: which parts of it, and who is told how far the
/// reading has got. `Reader::new().read_path(path)` reads everything, as
/// [`read_path`] does.
///
/// ```no_run
/// use snapdiff_format::{Parts, Reader};
/// let state = Reader::new()
///     .parts(Parts::WithoutEvents)
///     .progress(|done, total| eprintln!("{done} of {total} bytes"))
///     .read_path("step-200.pickle")?;
/// # Ok::<(), snapdiff_format::Error>(())
/// ```
#[derive(Default)]
pub struct Reader {
    parts: Parts,
    progress: Option<Box<dyn FnMut(u64, u64)>>,
    threads: Threads,
}

/// How many threads may read one pickle: a large one is read in two halves
/// on two (see `pickle/halves.rs`) unless its reader says one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Threads {
    One,
    #[default]
    Two,
}

impl Reader {
    /// A reader of everything a file holds, telling no one its progress.
    pub fn new() -> Reader {
        Reader::default()
    }

    /// Reads only `parts` of the file (its state without the trace's
    /// events, say, which a `.snap` file steps over).
    pub fn parts(mut self, parts: Parts) -> Reader {
        self.parts = parts;
        self
    }

    /// Calls `progress(done, total)` with the bytes of a file read so far:
    /// for a large pickle or `.snap` file every few megabytes, and for
    /// every file once when it is read (`done == total`).
    pub fn progress(mut self, progress: impl FnMut(u64, u64) + 'static) -> Reader {
        self.progress = Some(Box::new(progress));
        self
    }

    /// Reads on the calling thread only, where a large pickle would take a
    /// second: for callers that read several files at once, each on a
    /// thread of its own, and would gain nothing from more threads than
    /// cores.
    pub fn one_thread(mut self) -> Reader {
        self.threads = Threads::One;
        self
    }

    /// Reads the snapshot file at `path`, whatever its kind (a large file
    /// mapped, its pages handed back as they are passed). Errors name the
    /// file.
    pub fn read_path(self, path: impl AsRef<Path>) -> Result<Snapshot> {
        let progress = self.progress.unwrap_or_else(|| Box::new(|_, _| {}));
        read_path_with(path.as_ref(), self.parts, self.threads, progress)
    }

    /// Reads a snapshot from bytes of any supported kind (progress is told
    /// as for a file of those bytes, but for the final call).
    pub fn read_bytes(self, data: &[u8]) -> Result<Snapshot> {
        let total = data.len() as u64;
        let progress = self
            .progress
            .map(|mut told| Progress::new(move |done| told(done as u64, total)));
        read_bytes_parts_with(data, self.parts, self.threads, progress)
    }
}

/// Reads the snapshot file at `path`, whatever its kind: the shorthand for
/// `Reader::new().read_path(path)`. Errors name the file.
pub fn read_path(path: impl AsRef<Path>) -> Result<Snapshot> {
    Reader::new().read_path(path)
}

fn read_path_with(
    path: &Path,
    parts: Parts,
    threads: Threads,
    progress: Box<dyn FnMut(u64, u64)>,
) -> Result<Snapshot> {
    let cannot_read = |e| Error::io("cannot read", e).with_path(path);
    let file = crate::open_regular(path).map_err(cannot_read)?;
    let meta = file.metadata().map_err(cannot_read)?;
    let total = meta.len();
    let progress = std::rc::Rc::new(std::cell::RefCell::new(progress));
    let map_from = match is_compressed(&file) {
        true => MAP_COMPRESSED_FROM_BYTES,
        false => MAP_FROM_BYTES,
    };
    let snap = if total >= map_from {
        // SAFETY: the mapping is read-only and private. Snapshot files are
        // written under a temporary name and renamed into place (by
        // snapdiff, its runtime and the capture hook), so a file being read
        // is not rewritten in place; if another program truncated it
        // meanwhile, reading past the new end would fault, as for any
        // memory-mapped reader (ripgrep documents the same).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(cannot_read)?;
        let told = progress.clone();
        read_bytes_parts_with(
            &map,
            parts,
            threads,
            Some(Progress::with_pages(
                move |done| (told.borrow_mut())(done as u64, total),
                Some(Pages::of(&map)),
            )),
        )
    } else {
        // From the file opened and checked, not by its name again.
        use std::io::{Read, Seek};
        let mut data = Vec::with_capacity(total as usize);
        let mut file = file;
        file.rewind()
            .and_then(|()| file.read_to_end(&mut data))
            .map_err(cannot_read)?;
        read_bytes_parts_with(&data, parts, threads, None)
    };
    let snap = snap.map_err(|e| e.with_path(path))?;
    (progress.borrow_mut())(total, total);
    Ok(snap)
}

/// Whether `file` starts as a compressed file does (its position moves:
/// it is mapped or read again from its start after).
fn is_compressed(mut file: &std::fs::File) -> bool {
    use std::io::Read;
    let mut head = [0u8; 6];
    file.read_exact(&mut head).is_ok() && crate::compressed::Compression::detect(&head).is_some()
}

#[cfg(test)]
mod tests {
    use crate::{Action, DeviceTrace, Frame, Snapshot, TraceEvent};

    /// A pickle large enough to be mapped, its pages handed back as it is
    /// parsed, reads exactly as the same bytes read from memory.
    #[test]
    fn a_mapped_pickle_reads_as_the_same_bytes_in_memory() {
        let mut snap = Snapshot {
            frames: (0..2000)
                .map(|i| Frame {
                    name: format!("function_{i}").into(),
                    file: format!("/home/user/project/module_{}.py", i % 97).into(),
                    line: i,
                    extra: vec![],
                })
                .collect(),
            ..Snapshot::default()
        };
        snap.stacks = (0..500u32)
            .map(|s| (0..30).map(|k| (s * 7 + k * 13) % 2000).collect())
            .collect();
        let events = (0..1_600_000u64)
            .map(|i| TraceEvent {
                action: if i % 2 == 0 {
                    Action::Alloc
                } else {
                    Action::FreeCompleted
                },
                address: 0x7f00_0000_0000 + (i / 2) * 512,
                size: 512 + i % 4096,
                stream: 0,
                time_us: Some(1_700_000_000_000_000 + i as i64),
                stack: Some((i % 500) as u32),
                compile_context: None,
                user_metadata: None,
                alloc_seq: None,
                details: None,
            })
            .collect();
        snap.traces.push(DeviceTrace { device: 0, events });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("large.pickle");
        let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        crate::write_torch_pickle(&snap, &mut file).unwrap();
        drop(file);
        let mapped = read_mapped_with_progress(&path);
        assert_eq!(mapped.trace_len(), 1_600_000);
        // Without events, on two threads and on one, the trace is stepped
        // over with its pages handed back behind the skim.
        for reader in [super::Reader::new(), super::Reader::new().one_thread()] {
            let without = reader
                .parts(crate::Parts::WithoutEvents)
                .progress(|_, _| {})
                .read_path(&path)
                .unwrap();
            let device = DeviceTrace {
                device: 0,
                events: crate::Events::new(),
            };
            assert_eq!(without.traces, [device]);
            assert_eq!(without.meta, mapped.meta);
        }
    }

    /// A `.snap` file large enough to be mapped tells its progress as it
    /// is decompressed, and reads as the same bytes read from memory.
    #[test]
    fn a_mapped_snap_tells_its_progress() {
        // Events of random addresses and sizes, which zstd cannot shrink:
        // a file of about 40 MiB.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let events = (0..3_600_000)
            .map(|_| TraceEvent {
                action: Action::Alloc,
                address: random(),
                size: random() >> 40,
                ..TraceEvent::default()
            })
            .collect();
        let snap = Snapshot {
            traces: vec![DeviceTrace { device: 0, events }],
            ..Snapshot::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("large.snap");
        crate::write_snap(&snap, std::fs::File::create(&path).unwrap()).unwrap();
        let mapped = read_mapped_with_progress(&path);
        assert_eq!(mapped, snap);
    }

    /// Reads `path`, which must be large enough to be mapped, checking that
    /// progress came in steps up to the end and that the file reads as the
    /// same bytes read from memory.
    fn read_mapped_with_progress(path: &std::path::Path) -> Snapshot {
        let len = std::fs::metadata(path).unwrap().len();
        assert!(
            len >= super::MAP_FROM_BYTES + (8 << 20),
            "{len} bytes: too small"
        );
        let mut seen = Vec::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let mapped = super::Reader::new()
            .progress(move |done, total| tx.send((done, total)).unwrap())
            .read_path(path)
            .unwrap();
        seen.extend(rx.try_iter());
        let in_memory = crate::read_bytes(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(mapped, in_memory);
        assert!(seen.len() >= 4, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 == len));
        assert_eq!(seen.last(), Some(&(len, len)), "the end is told");
        mapped
    }
}
