//! Analyses over snapdiff [`Snapshot`](snapdiff_format::Snapshot)s: which
//! code holds the memory that keeps growing.
//!
//! The root names each analysis, its options and its report; the parts of
//! a report (a device's peak, one step, a pool's totals) and the building
//! blocks other crates judge with (a site series, an order of dumps, the
//! owners of a site) are in the public module of their analysis.
//!
//! - Sites: [`StackKeys`] gives each stack a stable 64-bit [`StackKey`];
//!   [`classify`] tells the program's frames from libraries' and native
//!   code; [`CulpritRules`] picks each site's [`Culprit`], the frame of user
//!   code to look at, and a [`Site`] is the live blocks of one stack.
//! - Two snapshots: [`compare`], site by site.
//! - A recorded trace: [`replay`] gives the live blocks at any point;
//!   [`timeline`] live memory at a bounded number of points.
//! - Growth: [`trend_snapshots`] and [`trend_trace`] find the sites whose
//!   memory keeps growing over many checkpoints; [`kept_since`] what a run
//!   of checkpoints kept, the rule of a leak check.
//! - One snapshot: [`summarize`] (totals per device, pool and stream,
//!   fragmentation, top sites), [`peak()`] (the moment a device held the
//!   most, by site and [`Category`]), [`oom()`] (an out-of-memory error: the
//!   request, the free pieces, what held the rest), [`steps()`] (each step's
//!   start, peak and what it retained), [`live_by_site`] (live memory by
//!   stack at one [`LiveMoment`], for flame graphs and pprof).

#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod baseline;
mod calls;
mod category;
mod compare;
mod culprit;
mod cuts;
mod error;
mod frame_class;
mod group;
pub mod held_by;
mod iterations;
mod judge;
mod kept;
mod limit;
mod moved;
pub mod oom;
pub mod outside;
pub mod peak;
pub mod pinned_host;
mod private_pools;
mod profile;
mod recorded;
mod replay;
mod rising;
pub mod rows;
pub mod series_order;
mod site_diff;
mod stack_key;
pub mod steps;
pub mod summary;
mod timeline;
pub mod trend;

pub use crate::category::{Categories, Category};
pub use crate::compare::{CompareOptions, Comparison, Matching, Runs, SiteChanges, compare};
pub use crate::culprit::{Culprit, CulpritKind, CulpritRules, FrameRole, common_base, short_name};
pub use crate::error::TraceError;
pub use crate::frame_class::{FrameClass, classify, is_generated_file};
pub use crate::group::{
    Site, SiteFrame, SiteTotals, describe_site, live_sites_by_device, requested,
};
pub use crate::held_by::HeldBy;
pub use crate::judge::{
    Describe, Judged, judge, judge_dumps, judge_keyed_dumps, trend_named, trend_snapshots,
    trend_trace,
};
pub use crate::kept::kept_since;
pub use crate::limit::{Gate, Limit, Over, ParseLimitError, Per};
pub use crate::oom::{Oom, OomOptions, oom};
pub use crate::outside::Outside;
pub use crate::peak::{Peak, PeakOptions, peak};
pub use crate::pinned_host::{PinnedHost, pinned_host};
pub use crate::private_pools::{IdlePool, idle_private_pools};
pub use crate::profile::{LiveMoment, SiteBytes, live_by_site};
pub use crate::recorded::Recorded;
pub use crate::replay::{Replayed, replay};
pub use crate::rising::Rising;
pub use crate::series_order::NamedSnapshot;
pub use crate::site_diff::{Change, GroupDiff, Moved, MovedFrom};
pub use crate::stack_key::{StackKey, StackKeys};
pub use crate::steps::{Steps, StepsOptions, steps};
pub use crate::summary::{Summary, SummaryOptions, summarize};
pub use crate::timeline::{Timeline, timeline};
pub use crate::trend::{DEFAULT_WARMUP, Suspect, Trend, TrendOptions};
