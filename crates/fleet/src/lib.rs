//! One verdict for a whole training job of many ranks.
//!
//! A rank (one process) leaves a series of snapshots. What the verdict
//! needs of them is small: each site's live blocks and bytes at each
//! checkpoint, the checkpoints' totals, and the stacks that name the sites.
//! These are the *site tables*:
//!
//! - [`ProcessRows`]: one process's checkpoints and site totals, built from
//!   its snapshots one at a time ([`ProcessRows::add_snapshot`]), so that a
//!   snapshot is dropped as soon as it is read;
//! - [`StackStore`]: the frames of every site seen, shared by all ranks
//!   (ranks run the same code, so they share their stacks);
//! - [`TableWriter`] and [`read_tables`]: the same rows as Parquet files,
//!   for SQL tools and for judging later, or on another machine.
//!
//! [`judge`] judges one process with the analyzer's `judge_series`, as
//! `trend` does (each device on its own, by the floor rule), and
//! [`FleetTally`] brings the ranks' verdicts together as they come: the
//! leaking ranks, the same line merged across them, and the ranks that
//! hold far more than their peers at one site (imbalance).
//! [`Watch`] does the same while the job runs, a dump at a time, and says
//! which lines start or stop leaking.

#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod rows;
mod stacks;
mod tables;
mod tally;
mod verdict;
mod watch;

pub use crate::stacks::{StackStore, Stacks};
pub use crate::tables::{TABLE_FILES, TableError, TableWriter, is_table_folder, read_tables};
pub use crate::tally::{FleetTally, Rows, fleet_verdict};
pub use crate::verdict::{
    DeviceVerdict, Fleet, FleetLeak, FleetOptions, Imbalance, MIN_IMBALANCE_BYTES, Member,
    MemberExcess, MemberGrowth, MemberRow, ProcessVerdict, Verdict, judge,
};
pub use crate::watch::{Change, ChangeKind, DEFAULT_KEEP_CHECKPOINTS, Watch};
pub use snapdiff_analyze::rows::{CheckpointRow, DeviceRows, ProcessRows, SiteRow};
pub use snapdiff_runs::Unreadable;
