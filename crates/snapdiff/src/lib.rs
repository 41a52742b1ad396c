//! snapdiff finds GPU memory leaks in training jobs.
//!
//! This is the crate to add to a project: it re-exports the recording
//! allocator ([`Allocator`], feature `runtime`, on by default), the snapshot
//! model and readers ([`format`](mod@format), [`read`]), the analyses ([`analyze`],
//! [`compare()`], [`trend()`]), and adds [`testing`]: leak assertions for
//! `cargo test`.
//!
//! # Setup
//!
//! ```toml
//! [dev-dependencies]
//! snapdiff = "0.1"
//! # only reading and checking snapshot files (PyTorch's included):
//! # snapdiff = { version = "0.1", default-features = false }
//! ```
//!
//! # A leak test
//!
//! ```
//! use snapdiff::testing::LeakCheck;
//! use snapdiff::{Allocator, HostBackend, Stream};
//!
//! let a = Allocator::new(HostBackend::with_capacity(1 << 30));
//! let check = LeakCheck::begin(&a).warmup(1);
//! for _ in 0..4 {
//!     let scratch = a.alloc(1 << 20, Stream::DEFAULT).unwrap();
//!     drop(scratch);
//!     check.step();
//! }
//! check.assert_no_leaks(); // passes: nothing keeps growing
//! ```
//!
//! # Reading the output
//!
//! A failed assertion panics with a report: for each site that kept memory,
//! the culprit (the innermost frame of your own code, `function file:line`),
//! the bytes and blocks, and the frames under it; and the `snapdiff compare`
//! command to look closer, with the two snapshots written to files.
//!
//! # Limitations
//!
//! - Only memory allocated through an [`Allocator`] (or recorded by PyTorch,
//!   for files) is seen; memory a library allocates on its own is not.
//! - Stacks name lines when the binary has debug line tables (the default
//!   for tests); in release builds enable `debug = "line-tables-only"`.
//! - An allocator is shared by every test that uses it: give each test its
//!   own allocator (they are cheap), or run such tests one at a time.

#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod testing;

pub use snapdiff_analyze as analyze;
pub use snapdiff_format as format;
#[cfg(feature = "runtime")]
pub use snapdiff_runtime as runtime;

pub use snapdiff_analyze::{CompareOptions, Comparison, Culprit, Trend, TrendOptions, compare};
pub use snapdiff_format::{Error, Snapshot};
#[cfg(feature = "runtime")]
pub use snapdiff_runtime::{
    AllocError, Allocator, AllocatorConfig, Backend, CudaBackend, DeviceBuffer, HostBackend, Stream,
};

/// Reads a snapshot file of any kind: `.snap`, `.json`, a PyTorch snapshot
/// pickle, or a `torch.save` zip of one.
///
/// # Errors
///
/// When the file cannot be read or is not a snapshot; the message names the file.
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("snapdiff-doc-read-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("empty.snap");
/// snapdiff::format::write_path(&path, &snapdiff::Snapshot::default(), snapdiff::format::Existing::Replace)?;
/// let snap = snapdiff::read(&path)?;
/// assert_eq!(snap.totals().allocated_bytes, 0);
/// # Ok::<(), snapdiff::Error>(())
/// ```
pub fn read(path: impl AsRef<std::path::Path>) -> Result<Snapshot, Error> {
    snapdiff_format::read_path(path)
}

/// The sites whose memory keeps growing over several snapshots of one job
/// (see [`Trend`] for the rule). Every snapshot given is judged: an exit
/// dump, told by its file's name, is left out by [`trend_files`].
///
/// ```
/// use snapdiff::{Snapshot, TrendOptions};
/// let steady = vec![Snapshot::default(); 5];
/// assert!(snapdiff::trend(&steady, &TrendOptions::default()).suspects.is_empty());
/// ```
pub fn trend(snapshots: &[Snapshot], options: &TrendOptions) -> Trend {
    snapdiff_analyze::trend_snapshots(snapshots, options)
}

/// [`trend`] of the snapshot files at `paths`, judged as `snapdiff trend`
/// judges one process's files, by the same judge: one file by its trace,
/// several ordered by step, else time, else name, exit dumps
/// (`...-exit.pickle`, taken after the program freed its variables) left
/// out among three or more others with a note, and each suspect's owners
/// from the owners files `capture --owners` wrote beside the files.
///
/// # Errors
///
/// When a file cannot be read (the message names it), or when one file
/// is given and its trace records no allocation.
///
/// ```no_run
/// let trend = snapdiff::trend_files(
///     &["dumps/rank0-step10.pickle", "dumps/rank0-step20.pickle", "dumps/rank0-step30.pickle"],
///     &snapdiff::TrendOptions::default(),
/// )?;
/// assert!(trend.suspects.is_empty(), "{:?}", trend.suspects);
/// # Ok::<(), snapdiff::Error>(())
/// ```
pub fn trend_files(
    paths: &[impl AsRef<std::path::Path>],
    options: &TrendOptions,
) -> Result<Trend, Error> {
    let snapshots = paths
        .iter()
        .map(|p| snapdiff_format::read_path(p.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = paths
        .iter()
        .map(|p| {
            p.as_ref()
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        })
        .collect();
    let dumps: Vec<snapdiff_analyze::NamedSnapshot<'_>> = names
        .iter()
        .zip(&snapshots)
        .map(|(name, snapshot)| snapdiff_analyze::NamedSnapshot { name, snapshot })
        .collect();
    if dumps.is_empty() {
        return Ok(snapdiff_analyze::trend_named(&[], options));
    }
    let owners_of = |i: usize| snapdiff_format::read_owners_beside(paths[i].as_ref());
    snapdiff_analyze::judge_dumps(&dumps, owners_of, options)
        .map(|judged| judged.trend)
        .map_err(|e| {
            Error::new(snapdiff_format::ErrorKind::NoTrace, e.to_string())
                .with_path(paths[0].as_ref())
        })
}
