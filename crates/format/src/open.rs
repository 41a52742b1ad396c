//! Opening the files snapdiff reads: regular files only.
//!
//! A device (`/dev/zero`), a pipe or a socket named where a snapshot, an
//! owners file or a manifest is expected would be read without end or wait
//! for a writer forever; a link swapped in after a file was listed may name
//! one. Each is refused when opened, from the open file itself.

use std::fs::File;
use std::io;
use std::path::Path;

/// Opens `path` for reading when it is a regular file (after links); a
/// FIFO is not waited on, and anything else is refused with an error of
/// kind [`io::ErrorKind::InvalidInput`] saying what it is.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        // Opening a FIFO for reading waits for a writer, unless non-blocking
        // (which changes nothing for a regular file).
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({})", describe(kind)),
    ))
}

/// Asks the system to start reading `path` into its page cache and returns
/// without waiting. A reader that goes through many small files one after
/// another waits on the disk for each in turn; telling the system of the
/// next ones first keeps many reads in flight (`fleet` of 10,240 step dumps
/// from a cold cache: see docs/performance.md). Does nothing where the
/// system has no such call, and when the file cannot be opened (its
/// reader says why).
pub fn prefetch(path: &Path) {
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    if let Ok(file) = open_regular(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain system call on a file this function holds open.
        // Its result is advice taken or not: nothing to do either way.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
    }
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
    let _ = path;
}

/// What a file that is not a regular one is, in a few words.
fn describe(kind: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a pipe";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
    }
    if kind.is_dir() {
        "a folder"
    } else {
        "not a file"
    }
}

/// Reads all of `path` when it is a regular file ([`open_regular`]), at
/// most `limit` bytes: a longer file is an error of kind
/// [`io::ErrorKind::InvalidData`].
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let file = open_regular(path)?;
    let mut data = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(data)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn devices_pipes_and_folders_are_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a plain system call on a valid path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        for (path, what) in [
            (Path::new("/dev/zero"), "a device"),
            (link.as_path(), "a device"),
            (fifo.as_path(), "a pipe"),
            (dir.path(), "a folder"),
        ] {
            let e = open_regular(path).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("not a regular file ({what})"),
                "{path:?}"
            );
        }
        let file = dir.path().join("file");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"12345");
        assert!(
            read_regular(&file, 4)
                .unwrap_err()
                .to_string()
                .contains("larger than 4")
        );
    }

    /// Whether all of `file`'s pages are in the page cache.
    #[cfg(target_os = "linux")]
    fn cached(file: &std::fs::File, len: usize) -> bool {
        // SAFETY: a private read-only mapping of a file this test owns.
        let map = unsafe { memmap2::Mmap::map(file) }.unwrap();
        let mut pages = vec![0u8; len.div_ceil(4096)];
        // SAFETY: `pages` holds a byte for each page of the mapping.
        let done = unsafe { libc::mincore(map.as_ptr() as *mut _, len, pages.as_mut_ptr()) };
        assert_eq!(done, 0);
        pages.iter().all(|p| p & 1 == 1)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn prefetch_brings_a_file_into_the_page_cache_and_never_waits() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dump.snap");
        let len = 4 << 20;
        std::fs::write(&path, vec![7u8; len]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        file.sync_all().unwrap();
        // Out of the cache (where the file system lets it go: not tmpfs).
        // SAFETY: a plain system call on a file this test holds open.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        prefetch(&path);
        // The reads are under way, not done: wait for them, a while.
        let started = std::time::Instant::now();
        while !cached(&file, len) {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "the file is not in the page cache 30 s after prefetch"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A pipe with no writer, a folder, a missing file: nothing waits.
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a plain system call on a valid path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        prefetch(&fifo);
        prefetch(dir.path());
        prefetch(&dir.path().join("missing"));
    }
}
