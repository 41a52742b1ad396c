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

/// How often, in bytes of the file, a reader tells its [`Progress`].
pub(crate) const PROGRESS_EVERY: usize = 8 << 20;

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
}

impl Pages {
    pub(crate) fn of(map: &memmap2::Mmap) -> Pages {
        Pages {
            start: map.as_ptr() as usize,
            released: 0,
        }
    }

    /// The pages from byte `at` on: those of a reader that starts there.
    pub(crate) fn from(self, at: usize) -> Pages {
        Pages {
            released: at,
            ..self
        }
    }

    /// Hands back the whole pages before byte `done`.
    #[cfg(unix)]
    pub(crate) fn release_before(&mut self, done: usize) {
        // SAFETY: sysconf only reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let upto = done / page * page;
        // Rounded up: the page holding a split point is the first half's.
        let from = self.released.div_ceil(page) * page;
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
        }
    }

    #[cfg(not(unix))]
    pub(crate) fn release_before(&mut self, _done: usize) {}
}
