//! The error every reader and writer returns: one line, naming the file.

use std::fmt;
use std::path::{Path, PathBuf};

/// What kind of problem an [`Error`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file could not be opened, read or written.
    Io,
    /// The bytes are not any snapshot format snapdiff reads.
    UnknownFormat,
    /// The file ends before its content does.
    Truncated,
    /// The bytes are of a known format but broken (bad opcode, bad length, ...).
    Malformed,
    /// The file is well formed but holds something other than a memory snapshot,
    /// or a value of the wrong type where the snapshot needs another.
    NotASnapshot,
    /// The pickle would run code (GLOBAL, REDUCE, ...) or refers to tensors;
    /// snapdiff never executes anything from a file.
    Refused,
    /// A `.snap` file written by a newer snapdiff.
    NewerVersion,
    /// The file is larger or deeper than the reader's limits.
    TooLarge,
    /// A compressed file whose stream is broken, or that expands past the
    /// bound (a decompression bomb).
    Corrupt,
    /// One snapshot was given to be judged on its own, by its trace, and
    /// its trace records no allocation.
    NoTrace,
}

/// A failure to read or write a snapshot file.
///
/// Its message is one line, lowercase, without a trailing period, and starts
/// with the file name when one is known:
/// `run1.pickle: truncated at byte 81920 while reading BINUNICODE`.
#[derive(Debug)]
pub struct Error {
    inner: Box<Inner>,
}

#[derive(Debug)]
struct Inner {
    kind: ErrorKind,
    message: String,
    path: Option<PathBuf>,
    source: Option<std::io::Error>,
}

impl Error {
    /// An error of `kind` saying `message` (name the file with
    /// [`Error::with_path`]).
    #[cold]
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            inner: Box::new(Inner {
                kind,
                message: message.into(),
                path: None,
                source: None,
            }),
        }
    }

    /// An I/O error while doing what `message` says (e.g. "cannot write"),
    /// for encoders given to [`write_atomically`](crate::write_atomically).
    #[cold]
    pub fn io(message: impl Into<String>, source: std::io::Error) -> Error {
        let mut e = Error::new(ErrorKind::Io, message);
        e.inner.source = Some(source);
        e
    }

    /// Attaches the file the error is about (kept if one is already set).
    pub fn with_path(mut self, path: &Path) -> Error {
        if self.inner.path.is_none() {
            self.inner.path = Some(path.to_path_buf());
        }
        self
    }

    /// Says that the problem is in the content of a compressed file
    /// (`in the gzip content: ...`).
    pub(crate) fn inside(mut self, compression: &str) -> Error {
        self.inner.message = format!("in the {compression} content: {}", self.inner.message);
        self
    }

    /// What kind of problem this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The file the error is about, if known.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The message without the file name.
    pub fn message(&self) -> &str {
        &self.inner.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.inner.path {
            write!(f, "{}: ", path.display())?;
        }
        f.write_str(&self.inner.message)?;
        if let Some(source) = &self.inner.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source.as_ref().map(|e| e as _)
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
