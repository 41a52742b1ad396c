//! Analyses over snapdiff [`Snapshot`](snapdiff_format::Snapshot)s: which
//! code holds the memory that keeps growing.
//!
//! Every public item is named at the crate's root, once: the modules are
//! private, and the list at the end of this file is the whole API.
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
//!   fragmentation, top sites), [`peak`] (the moment a device held the
//!   most, by site and [`Category`]), [`oom`] (an out-of-memory error: the
//!   request, the free pieces, what held the rest), [`steps`] (each step's
//!   start, peak and what it retained), [`live_by_site`] (live memory by
//!   stack at one [`LiveMoment`], for flame graphs and pprof).

#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod category;
mod compare;
mod culprit;
mod cuts;
mod error;
mod frame_class;
mod group;
mod held_by;
mod iterations;
mod judge;
mod kept;
mod oom;
mod outside;
mod peak;
mod pinned_host;
mod private_pools;
mod profile;
mod recorded;
mod replay;
mod rising;
mod series_order;
mod stack_key;
mod steps;
mod summary;
mod timeline;
mod trend;

pub use crate::category::{Categories, Category};
pub use crate::compare::{Change, CompareOptions, Comparison, GroupDiff, Matching, compare};
pub use crate::culprit::{Culprit, CulpritKind, CulpritRules, FrameRole, common_base, short_name};
pub use crate::error::TraceError;
pub use crate::frame_class::{FrameClass, classify, is_generated_file};
pub use crate::group::{
    DeviceSites, Site, SiteFrame, SiteTotals, describe_site, live_sites_by_device, requested,
};
pub use crate::held_by::{
    CulpritLine, HeldBy, SiteLines, SiteOwners, add_held_by, add_held_by_to_comparison,
    owners_by_site,
};
pub use crate::judge::{Judged, judge_dumps};
pub use crate::kept::kept_since;
pub use crate::oom::{DeviceOom, FreePieces, Oom, OomOptions, oom};
pub use crate::outside::{
    CPU_KEY, DEVICE_KEY, DEVICE_USED_KEY, Outside, OutsideGrowth, OutsidePoint, RSS_KEY,
};
pub use crate::peak::{
    CategoryTotal, DevicePeak, HighestReserved, Peak, PeakGrowth, PeakOptions, PeakSite, PoolBytes,
    peak,
};
pub use crate::pinned_host::{PinnedHost, PinnedHostChange, PinnedHostTrend, pinned_host};
pub use crate::private_pools::{IdlePool, idle_private_pools};
pub use crate::profile::{LiveMoment, SiteBytes, live_by_site};
pub use crate::recorded::Recorded;
pub use crate::replay::{Replayed, replay};
pub use crate::rising::Rising;
pub use crate::series_order::{
    NamedSnapshot, OrderKey, SnapshotOrder, snapshot_order, without_exit_dumps,
};
pub use crate::stack_key::{StackKey, StackKeys};
pub use crate::steps::{DeviceSteps, Retained, Step, StepDetail, Steps, StepsOptions, steps};
pub use crate::summary::{
    Fragmentation, PoolTotals, SiteUsage, Summary, SummaryOptions, summarize,
};
pub use crate::timeline::{Timeline, timeline};
pub use crate::trend::{
    Checkpoint, CheckpointSource, DEFAULT_WARMUP, SiteSeries, Suspect, Trend, TrendOptions,
    trend_named, trend_of_series, trend_of_snapshot_series, trend_snapshots, trend_trace,
};
