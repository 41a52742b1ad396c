//! Analyses over snapdiff [`Snapshot`](snapdiff_format::Snapshot)s: which
//! code holds the memory that keeps growing.
//!
//! - [`stack_key`]: stable 64-bit keys of allocation sites.
//! - [`frame_class`]: whether a frame is the program's, a library's or native code.
//! - [`culprit`]: the frame of user code to look at for a site.
//! - [`compare`](mod@compare): the difference between two snapshots, site by site.
//! - [`replay`]: the live blocks at any point of a recorded trace.
//! - [`trend`]: sites whose memory keeps growing over many checkpoints.
//! - [`summary`]: totals per device, pool and stream; fragmentation; top sites.
//! - [`peak`]: the moment a device held the most memory, by site and [`category`].
//! - [`oom`]: an out-of-memory error: the request, free pieces, what held the rest.
//! - [`steps`]: each step of a trace: its start, peak, and what it retained.
//! - [`profile`]: live memory by stack at one moment, for flame graphs and pprof.
//! - [`timeline`]: live memory over a trace at a bounded number of points.

#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod category;
pub mod compare;
pub mod culprit;
pub mod frame_class;
pub mod group;
mod iterations;
pub mod oom;
pub mod peak;
pub mod profile;
pub mod replay;
pub mod stack_key;
pub mod steps;
pub mod summary;
pub mod timeline;
pub mod trend;

pub use crate::compare::{CompareOptions, Comparison, GroupDiff, compare};
pub use crate::culprit::{Culprit, CulpritKind, CulpritRules};
pub use crate::frame_class::{FrameClass, classify};
pub use crate::group::Site;
pub use crate::stack_key::{StackKey, StackKeys};
pub use crate::summary::{Summary, summarize};
pub use crate::trend::{Suspect, Trend, TrendOptions, trend_snapshots, trend_trace};
