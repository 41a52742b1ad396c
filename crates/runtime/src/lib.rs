//! A recording CUDA caching allocator, on a GPU through cudarc or on host
//! memory anywhere, that writes snapdiff snapshots.
//!
//! It behaves like PyTorch's caching allocator (sizes rounded to 512 bytes,
//! a small pool of 2 MiB segments, best fit per stream, splitting and
//! merging, release of the cache before out-of-memory), and records every
//! block with the stack that allocated it, plus a trace of recent events.
//! Snapshots are the same model PyTorch's files are read into, so every
//! `snapdiff` command works on them.
//!
//! ```
//! use snapdiff_runtime::{Allocator, HostBackend, Stream};
//!
//! let a = Allocator::new(HostBackend::with_capacity(1 << 30));
//! let kept: Vec<_> = (0..3).map(|_| a.alloc(4096, Stream::DEFAULT).unwrap()).collect();
//! a.mark_step(1);
//! let snap = a.snapshot();
//! assert_eq!(snap.totals().allocated_bytes, 3 * 4096);
//! drop(kept);
//! assert_eq!(a.stats().allocated_bytes, 0);
//! ```
//!
//! `snapdiff capture -- PROGRAM` runs a program that uses this crate with
//! the environment variables of [`config`] set, so that it dumps snapshots
//! with no code change; see `docs/runtime.md`.

#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod allocator;
mod backend;
mod caching;
pub mod config;
mod cuda;
mod dumps;
mod host;
mod recorder;
mod snapshot;
mod stacks;
mod trace;

pub use crate::allocator::{Allocator, DeviceBuffer, DumpError};
pub use crate::backend::{Backend, BackendError, DeviceDesc, MemoryInfo, Stream};
pub use crate::config::AllocatorConfig;
pub use crate::cuda::{CudaBackend, CudaError};
pub use crate::host::HostBackend;
pub use crate::recorder::{AllocError, Stats};
pub use crate::stacks::StackCapture;
pub use snapdiff_format::Snapshot;
