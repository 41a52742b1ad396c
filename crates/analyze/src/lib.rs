//! Analyses over snapdiff [`Snapshot`](snapdiff_format::Snapshot)s.
//!
//! - [`summary`]: totals per device, pool and stream; fragmentation.

#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod summary;

pub use crate::summary::{Summary, summarize};
