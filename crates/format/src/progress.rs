//! How far a reader is through a file: told now and then (for progress
//! bars), and the pages of a mapped file behind it handed back to the
//! system as it goes.

/// Told, now and then, how many bytes of a file have been read; hands the
/// pages of a mapped file behind the reader back to the system.
pub(crate) struct Progress {
    told: Box<dyn FnMut(usize)>,
    pages: Option<Pages>,
}

impl Progress {
    /// Progress told to `told`, for bytes that are not a mapped file's.
    pub(crate) fn new(told: impl FnMut(usize) + 'static) -> Progress {
        Progress {
            told: Box::new(told),
            pages: None,
        }
    }

    /// The bytes before `at` are read: says so, and hands their pages back.
    pub(crate) fn done(&mut self, at: usize) {
        if let Some(pages) = &mut self.pages {
            pages.release_before(at);
        }
        (self.told)(at);
    }

    /// This progress, its pages handed back as [`Pages::again`] says.
    pub(crate) fn releasing_again(self) -> Progress {
        Progress {
            pages: self.pages.map(Pages::again),
            ..self
        }
    }

    /// The mapped file's pages, for a reader of a part of it on another
    /// thread to hand back itself (see [`Pages::from`]).
    pub(crate) fn pages(&self) -> Option<Pages> {
        self.pages
    }

    /// Progress told to `told`, handing back `pages` (if any) as it goes.
    pub(crate) fn with_pages(told: impl FnMut(usize) + 'static, pages: Option<Pages>) -> Progress {
        Progress {
            told: Box::new(told),
            pages,
        }
    }
}

/// How often, in bytes of the file, a reader tells its [`Progress`], and
/// so hands back the pages behind it: every 8 MiB, each of a large read's
/// readers kept up to that much of the file in memory (a 150 MiB pickle
/// peaked 5% higher).
pub(crate) const PROGRESS_EVERY: usize = 2 << 20;

/// The pages of a mapped file, handed back to the system behind a reader.
/// Only addresses: a copy can go to another thread, which hands back the
/// pages of its own part of the file.
#[derive(Clone, Copy)]
pub(crate) struct Pages {
    /// The mapping's first byte, as an address (the mapping outlives the
    /// parse that calls [`Pages::release_before`]).
    start: usize,
    /// Bytes from the start already handed back, or not this reader's.
    released: usize,
    /// Where this reader's part starts, when releases hand back its part
    /// from there again now and then (see [`Pages::again`]).
    again_from: Option<usize>,
    /// Where the reader was when its part was last handed back whole.
    again_at: usize,
}

/// A part read again behind its reader is handed back whole each time the
/// reader has gone an eighth further. The second half reads back what was
/// handed back, a page fault each time: handing the part back at every
/// release made 100,000 more faults on the 980 MiB real-shaped pickle
/// (0.2 s more CPU); this way 15,000 (3% more time), with the same peak
/// on the 150 and 213 MiB ones as at every release.
const AGAIN_AFTER_EIGHTH: usize = 8;

impl Pages {
    pub(crate) fn of(map: &memmap2::Mmap) -> Pages {
        Pages {
            start: map.as_ptr() as usize,
            released: 0,
            again_from: None,
            again_at: 0,
        }
    }

    /// These pages, handing back the whole part behind the reader now and
    /// then, not only what it has passed since the last release: for the
    /// first half of a read in two, whose pages the second half reads back
    /// from (the strings and frames the trace shares with the segments).
    /// On a 150 MiB file, 13 MB of them were back in memory at the first
    /// half's end, where the read's peak is.
    pub(crate) fn again(self) -> Pages {
        Pages {
            again_from: Some(self.released),
            again_at: self.released,
            ..self
        }
    }

    /// The pages from byte `at` on: those of a reader that starts there.
    pub(crate) fn from(self, at: usize) -> Pages {
        Pages {
            start: self.start,
            released: at,
            again_from: None,
            again_at: 0,
        }
    }

    /// Hands back the whole pages before byte `done`.
    #[cfg(unix)]
    pub(crate) fn release_before(&mut self, done: usize) {
        // SAFETY: sysconf only reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let upto = done / page * page;
        let whole = self.again_from.filter(|&part| {
            upto.saturating_sub(self.again_at) * AGAIN_AFTER_EIGHTH >= upto.saturating_sub(part)
        });
        // Rounded up: the page holding a split point is the first half's.
        let from = whole.unwrap_or(self.released).div_ceil(page) * page;
        if upto > from {
            // SAFETY: the range lies inside the mapping (whose start is
            // page-aligned), which is private and read-only: dropping its
            // pages changes no byte, the next access reads them from the
            // file again. A failure leaves the pages where they are.
            unsafe {
                libc::madvise(
                    (self.start + from) as *mut libc::c_void,
                    upto - from,
                    libc::MADV_DONTNEED,
                );
            }
            self.released = upto;
            if whole.is_some() {
                self.again_at = upto;
            }
        }
    }

    #[cfg(not(unix))]
    pub(crate) fn release_before(&mut self, _done: usize) {}
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;
    const PAGE: usize = 4096;

    /// How many pages of `bytes` are mapped in this process now, from
    /// `/proc/self/pagemap` (bit 63 of each page's entry).
    fn mapped_pages(bytes: &[u8]) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let mut pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        let first = bytes.as_ptr() as usize / PAGE;
        pagemap.seek(SeekFrom::Start(first as u64 * 8)).unwrap();
        let mut entries = vec![0u8; bytes.len() / PAGE * 8];
        pagemap.read_exact(&mut entries).unwrap();
        entries
            .chunks_exact(8)
            .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1)
            .count()
    }

    /// Reads a byte of each page of `bytes`, as a reader does.
    fn touch(bytes: &[u8]) {
        std::hint::black_box(bytes.iter().step_by(PAGE).fold(0, |a, &b| a ^ b));
    }

    /// Pages read back behind a reader (the second half reading the
    /// strings the trace shares) go at its next release only when its
    /// pages hand back its whole part again, and then only once it has
    /// gone an eighth further. (The system may map more than the page
    /// read: a large folio of the page cache at once.)
    #[test]
    fn pages_released_again_take_back_what_was_read_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mapped");
        std::fs::write(&path, vec![7u8; 4 * MIB]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a private read-only mapping of a file only this test has.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        for again in [false, true] {
            let mut pages = Pages::of(&map);
            if again {
                pages = pages.again();
            }
            touch(&map);
            pages.release_before(2 * MIB);
            assert_eq!(mapped_pages(&map[..2 * MIB]), 0);
            assert!(mapped_pages(&map[2 * MIB..]) > 0);
            // Read back behind the reader, then the reader goes on.
            touch(&map[..MIB]);
            assert!(mapped_pages(&map[..MIB]) >= MIB / PAGE);
            pages.release_before(3 * MIB);
            let behind = mapped_pages(&map[..3 * MIB]);
            match again {
                true => assert_eq!(behind, 0),
                false => assert!(behind >= MIB / PAGE, "{behind} pages"),
            }
        }
        // Read back again, and the reader goes on by less than an eighth.
        let mut pages = Pages::of(&map).again();
        pages.release_before(3 * MIB);
        touch(&map[..MIB]);
        pages.release_before(3 * MIB + 64 * 1024);
        assert!(mapped_pages(&map[..MIB]) >= MIB / PAGE);
        assert_eq!(mapped_pages(&map[3 * MIB..3 * MIB + 64 * 1024]), 0);
    }
}
