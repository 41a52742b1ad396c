//! The judge's input: one process's checkpoints, device by device, and
//! each site's live memory at each, as rows.
//!
//! Every verdict is judged from these rows, whoever built them:
//! [`ProcessRows::add_snapshot`] from snapshots, a checkpoint each (`trend`
//! of files, the fleet, `watch`); [`DeviceRows::from_trace`] from one
//! snapshot's trace cut into checkpoints (a process that left one file);
//! the fleet's Parquet tables, read back. The judge (`judge.rs`) judges
//! them.

use rustc_hash::FxHashSet;
use serde::Serialize;
use snapdiff_format::{Action, DeviceName, PINNED_HOST_DEVICE, Snapshot, StackId};

use crate::cuts::{Cuts, cuts_for};
use crate::error::TraceError;
use crate::group::{SiteTotals, live_groups, live_sites_by_device};
use crate::held_by::SiteOwners;
use crate::outside::OutsidePoint;
use crate::pinned_host::{PinnedHost, pinned_host};
use crate::replay::replay;
use crate::series_order::{OrderKey, SnapshotOrder, snapshot_order};
use crate::stack_key::{StackKey, StackKeys};
use crate::trend::{CheckpointSource, TrendOptions, device_memory_of};

/// One checkpoint of one device of one process: a row of
/// `checkpoints.parquet`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CheckpointRow {
    /// The training step the snapshot records, if any.
    pub step: Option<u64>,
    /// When it was taken, in microseconds since the Unix epoch, if known.
    pub time_us: Option<i64>,
    /// The file it was read from, as given.
    pub source: String,
    /// Bytes reserved from the device (segments).
    pub reserved_bytes: u64,
    /// Bytes of allocated blocks, as the allocator rounds them.
    pub allocated_bytes: u64,
    /// Bytes of active blocks (allocated, or freed but still in use by a stream).
    pub active_bytes: u64,
    /// The device's total memory, if recorded.
    pub device_memory: Option<u64>,
    /// The process's resident memory when the dump was taken, when capture
    /// measured it.
    pub rss_bytes: Option<u64>,
    /// Bytes in use on this device then (every user's), when capture
    /// measured it.
    pub device_used_bytes: Option<u64>,
    /// Whether the recorded memory is the CPU's (capture's recorder), and
    /// so inside `rss_bytes`.
    pub recorded_on_cpu: bool,
    /// For a checkpoint cut from a trace, the number of events before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_index: Option<usize>,
    /// Pinned host memory then, when the snapshot recorded it (rows of
    /// all devices as one only: it is the process's, not a device's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_host: Option<PinnedHost>,
    /// What capture measured beside the dump, as the snapshot said it
    /// (rows of all devices as one only: its device is the one measured,
    /// whichever it is).
    #[serde(skip)]
    pub measured: Option<OutsidePoint>,
}

impl CheckpointRow {
    /// What capture measured beside the recorded memory of `device` at
    /// this checkpoint, as trends judge it.
    pub fn outside(&self, device: u32) -> Option<OutsidePoint> {
        if self.measured.is_some() {
            return self.measured;
        }
        let recorded_inside_rss = if self.recorded_on_cpu {
            self.reserved_bytes
        } else {
            0
        };
        let point = OutsidePoint {
            device: (self.device_used_bytes).map(|used| (used, self.reserved_bytes)),
            process: (self.rss_bytes).map(|rss| (rss, recorded_inside_rss)),
            ordinal: device,
            recorded_on_cpu: self.recorded_on_cpu,
        };
        (point.device.is_some() || point.process.is_some()).then_some(point)
    }

    /// The name of the file the checkpoint was read from, without its folder:
    /// what orders snapshots that record neither step nor time.
    pub fn file_name(&self) -> &str {
        self.source
            .rsplit(['/', '\\'])
            .next()
            .unwrap_or(&self.source)
    }

    /// The checkpoint `snap`, read from `source`, is, its totals those of
    /// the segments `on_device` keeps.
    fn of(
        source: &str,
        snap: &Snapshot,
        on_device: impl Fn(u32) -> bool,
        measured: Option<OutsidePoint>,
    ) -> CheckpointRow {
        let mut totals = snapdiff_format::Totals::default();
        for segment in snap.device_segments().filter(|s| on_device(s.device)) {
            totals.add_segment(segment);
        }
        CheckpointRow {
            step: snap.meta.step,
            time_us: snap.meta.created_us,
            source: source.to_owned(),
            reserved_bytes: totals.reserved_bytes,
            allocated_bytes: totals.allocated_bytes,
            active_bytes: totals.active_bytes,
            rss_bytes: measured.and_then(|m| m.process.map(|(rss, _)| rss)),
            recorded_on_cpu: measured.is_some_and(|m| m.recorded_on_cpu),
            ..CheckpointRow::default()
        }
    }
}

/// One site's live memory at one checkpoint: a row of `sites.parquet`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteRow {
    /// The site's stack key.
    pub key: StackKey,
    /// Its live blocks, requested bytes and allocated (rounded) bytes.
    pub totals: SiteTotals,
}

impl SiteRow {
    /// Site `key` holding one block of `bytes`: the rows tests build.
    #[doc(hidden)]
    pub fn one_block(key: u64, bytes: u64) -> SiteRow {
        SiteRow {
            key: StackKey(key),
            totals: SiteTotals {
                blocks: 1,
                bytes,
                allocated: bytes,
            },
        }
    }
}

/// How a device's checkpoints were cut from one snapshot's trace: what
/// the judge says of them beside the verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceCut {
    /// Where the cuts came from.
    pub source: CheckpointSource,
    /// Sites with blocks allocated before recording began.
    pub before_recording: FxHashSet<StackKey>,
    /// Blocks the trace frees without having recorded their allocation.
    pub freed_unseen: usize,
    /// The device, as its notes name it.
    pub device_name: String,
}

/// One device of one process, checkpoint by checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceRows {
    /// The device ordinal.
    pub device: u32,
    /// Its checkpoints, in the order they were added until
    /// [`DeviceRows::put_in_order`].
    pub checkpoints: Vec<CheckpointRow>,
    /// The sites live at each checkpoint, by key (parallel to `checkpoints`).
    pub sites: Vec<Vec<SiteRow>>,
    /// What kept each site's blocks alive at each checkpoint, when the job
    /// said (capture's owners files; parallel to `checkpoints`), as
    /// `owners.parquet` stores them.
    pub owners: Vec<Option<SiteOwners>>,
    /// Where the checkpoints were cut from one trace; `None` for one
    /// snapshot a checkpoint.
    pub cut: Option<Box<TraceCut>>,
}

/// The stacks of the sites a builder saw, to describe them: each site's
/// stack in the snapshot it was built from.
pub type SiteStacks = Vec<(StackKey, Option<StackId>)>;

impl DeviceRows {
    /// Sorts the checkpoints as `trend` orders snapshots (by step, else
    /// time, else file name) and says which order that is. Sorting rows
    /// already in order changes nothing.
    pub fn put_in_order(&mut self) -> SnapshotOrder {
        let keys: Vec<OrderKey<'_>> = self
            .checkpoints
            .iter()
            .map(|c| OrderKey {
                step: c.step,
                time_us: c.time_us,
                name: c.file_name(),
            })
            .collect();
        let (order, by) = snapshot_order(&keys);
        let mut checkpoints = std::mem::take(&mut self.checkpoints);
        let mut sites = std::mem::take(&mut self.sites);
        let mut owners = std::mem::take(&mut self.owners);
        owners.resize(checkpoints.len(), None);
        self.checkpoints = order
            .iter()
            .map(|&i| std::mem::take(&mut checkpoints[i]))
            .collect();
        self.sites = order
            .iter()
            .map(|&i| std::mem::take(&mut sites[i]))
            .collect();
        self.owners = order.iter().map(|&i| owners[i].take()).collect();
        by
    }

    /// Adds one checkpoint, its sites from `totals`.
    fn push(
        &mut self,
        checkpoint: CheckpointRow,
        totals: impl IntoIterator<Item = (StackKey, SiteTotals)>,
        owners: Option<SiteOwners>,
    ) {
        let mut rows: Vec<SiteRow> = totals
            .into_iter()
            .map(|(key, totals)| SiteRow { key, totals })
            .collect();
        rows.sort_unstable_by_key(|r| r.key);
        self.owners.resize(self.checkpoints.len(), None);
        self.checkpoints.push(checkpoint);
        self.sites.push(rows);
        self.owners.push(owners);
    }

    /// The rows of the trace at `trace_index` of `snap` (read from
    /// `source`), cut into checkpoints as `trend` cuts a trace (see
    /// [`crate::trend_trace`]), and the stacks of its sites.
    ///
    /// # Errors
    ///
    /// When the trace cannot be cut as `options` asks.
    pub fn from_trace(
        source: &str,
        snap: &Snapshot,
        keys: &StackKeys,
        trace_index: usize,
        options: &TrendOptions,
    ) -> Result<(DeviceRows, SiteStacks), TraceError> {
        let Cuts {
            source: cut_by,
            at: cuts,
            steps,
        } = cuts_for(snap, keys, trace_index, options)?;
        let trace = &snap.traces[trace_index];
        let replayed = replay(snap, keys, trace, &cuts);
        let mut rows = DeviceRows {
            device: trace.device,
            cut: Some(Box::new(TraceCut {
                source: cut_by,
                before_recording: replayed.before_recording,
                freed_unseen: replayed.freed_unseen,
                device_name: DeviceName(trace.device).to_string(),
            })),
            ..DeviceRows::default()
        };
        let totals = snap.totals();
        let last = cuts.len().saturating_sub(1);
        for (k, (&at, sites)) in cuts.iter().zip(replayed.points).enumerate() {
            let live: u64 = sites.values().map(|t| t.allocated).sum();
            let checkpoint = CheckpointRow {
                step: steps.as_ref().map(|steps| steps[k]),
                time_us: at.checked_sub(1).and_then(|i| trace.events.get(i)?.time_us),
                source: source.to_owned(),
                event_index: Some(at),
                // The blocks live at the cut, as replayed; at the last, the
                // snapshot's own count, as the allocator keeps it.
                allocated_bytes: if k == last {
                    totals.allocated_bytes
                } else {
                    live
                },
                device_memory: device_memory_of(snap),
                ..CheckpointRow::default()
            };
            rows.push(checkpoint, sites, None);
        }
        Ok((rows, replayed.stacks.into_iter().collect()))
    }
}

/// Keeps the items at even places and the last one.
fn every_other<T>(items: &mut Vec<T>) {
    let last = items.len().saturating_sub(1);
    let mut at = 0;
    items.retain(|_| {
        let kept = at % 2 == 0 || at == last;
        at += 1;
        kept
    });
}

/// Everything kept of one process (a rank): its devices' checkpoints and
/// site totals. Its snapshots are not kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessRows {
    /// The process as `trend` names it: `rank7`, `pid812`, or "" when
    /// nothing says.
    pub process: String,
    /// Its devices, in ascending order.
    pub devices: Vec<DeviceRows>,
}

/// How a snapshot's devices become rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Devices {
    /// Each device on its own, as a fleet judges ranks.
    EachApart,
    /// All devices as one (device 0), as `trend` judges one process's
    /// files; pinned host memory is kept beside them.
    AsOne,
}

impl ProcessRows {
    /// A process with no checkpoints yet.
    pub fn new(process: impl Into<String>) -> ProcessRows {
        ProcessRows {
            process: process.into(),
            devices: Vec::new(),
        }
    }

    /// The rows of device `device`, made when first asked for.
    pub fn device_mut(&mut self, device: u32) -> &mut DeviceRows {
        let at = match self.devices.binary_search_by_key(&device, |d| d.device) {
            Ok(at) => at,
            Err(at) => {
                self.devices.insert(
                    at,
                    DeviceRows {
                        device,
                        ..DeviceRows::default()
                    },
                );
                at
            }
        };
        &mut self.devices[at]
    }

    /// Adds `snap`, read from `source`, as one checkpoint of each device
    /// it holds segments on (or of all as one), `owners` (what kept its
    /// sites' blocks alive, when known) beside them. Returns the stacks of
    /// its live sites, to describe them.
    pub fn add_snapshot(
        &mut self,
        source: &str,
        snap: &Snapshot,
        owners: Option<&SiteOwners>,
        devices: Devices,
    ) -> SiteStacks {
        let measured = OutsidePoint::of(snap);
        let owners_of = |rows: &mut dyn Iterator<Item = StackKey>| {
            owners.map(|all| {
                rows.filter_map(|key| Some((key, all.get(&key)?.clone())))
                    .collect::<SiteOwners>()
            })
        };
        if devices == Devices::AsOne {
            let groups = live_groups(snap, &StackKeys::new(snap));
            let mut checkpoint = CheckpointRow::of(source, snap, |_| true, measured);
            checkpoint.device_memory = device_memory_of(snap);
            checkpoint.device_used_bytes = measured.and_then(|m| m.device.map(|(used, _)| used));
            checkpoint.measured = measured;
            checkpoint.pinned_host = pinned_host(snap);
            let on_device = owners_of(&mut groups.totals.keys().copied());
            let stacks = groups.stacks.into_iter().collect();
            self.device_mut(0)
                .push(checkpoint, groups.totals, on_device);
            return stacks;
        }
        let mut stacks = SiteStacks::new();
        for sites in live_sites_by_device(snap, &StackKeys::of_live_blocks(snap)) {
            let device = sites.device;
            let mut checkpoint = CheckpointRow::of(source, snap, |d| d == device, measured);
            // The process's RSS on every device's row, the device's use on
            // its own (see OutsidePoint).
            checkpoint.device_used_bytes = measured
                .filter(|m| m.ordinal == device)
                .and_then(|m| m.device.map(|(used, _)| used));
            checkpoint.device_memory = (snap.meta.devices.iter())
                .find(|d| d.ordinal == device)
                .and_then(|d| d.total_memory);
            let on_device = owners_of(&mut sites.totals.keys().copied());
            stacks.extend(sites.stacks);
            self.device_mut(device)
                .push(checkpoint, sites.totals, on_device);
        }
        stacks
    }

    /// Adds the trace of `snap` (read from `source`, its stack keys
    /// `keys`), each busy device's
    /// cut into checkpoints (see [`DeviceRows::from_trace`]); pinned host
    /// memory's trace is no device's. Returns the stacks of its sites.
    ///
    /// # Errors
    ///
    /// When no device's trace records an allocation, or one cannot be cut
    /// as `options` asks.
    pub fn add_trace(
        &mut self,
        source: &str,
        snap: &Snapshot,
        keys: &StackKeys,
        options: &TrendOptions,
    ) -> Result<SiteStacks, TraceError> {
        let busy = busy_traces(snap);
        if busy.is_empty() {
            return Err(TraceError::NoAllocations);
        }
        let mut stacks = SiteStacks::new();
        for t in busy {
            let (rows, seen) = DeviceRows::from_trace(source, snap, keys, t, options)?;
            stacks.extend(seen);
            let device = rows.device;
            *self.device_mut(device) = rows;
        }
        Ok(stacks)
    }

    /// Puts every device's checkpoints in order (see
    /// [`DeviceRows::put_in_order`]).
    pub fn put_in_order(&mut self) {
        for device in &mut self.devices {
            device.put_in_order();
        }
    }

    /// Adds the checkpoints of `other`, rows of the same process.
    pub fn append(&mut self, other: ProcessRows) {
        for device in other.devices {
            let into = self.device_mut(device.device);
            let mut owners = device.owners;
            owners.resize(device.checkpoints.len(), None);
            into.owners.resize(into.checkpoints.len(), None);
            into.checkpoints.extend(device.checkpoints);
            into.sites.extend(device.sites);
            into.owners.extend(owners);
            into.cut = None;
        }
    }

    /// Halves each device's checkpoints past `keep` (put in order first):
    /// every other one is dropped, the first and the last kept, so that a
    /// long run's series stays about `keep` long, denser toward its end.
    pub fn thin(&mut self, keep: usize) {
        for device in &mut self.devices {
            let n = device.checkpoints.len();
            if n <= keep.max(2) {
                continue;
            }
            device.owners.resize(n, None);
            every_other(&mut device.checkpoints);
            every_other(&mut device.sites);
            every_other(&mut device.owners);
        }
    }

    /// Moves the checkpoints taken at `time_us` or later, with their sites
    /// and owners, into rows of their own (of the same process): a later
    /// run found among these rows.
    pub fn split_off_from(&mut self, time_us: i64) -> ProcessRows {
        let mut later = ProcessRows::new(self.process.clone());
        for device in &mut self.devices {
            device.owners.resize(device.checkpoints.len(), None);
            let into = later.device_mut(device.device);
            let mut at = 0;
            while at < device.checkpoints.len() {
                if device.checkpoints[at].time_us.is_some_and(|t| t >= time_us) {
                    into.checkpoints.push(device.checkpoints.remove(at));
                    into.sites.push(device.sites.remove(at));
                    into.owners.push(device.owners.remove(at));
                } else {
                    at += 1;
                }
            }
        }
        later.devices.retain(|d| !d.checkpoints.is_empty());
        self.devices.retain(|d| !d.checkpoints.is_empty());
        later
    }

    /// The file of a process that left one dump, read as such (not cut
    /// from its trace): what a process of one file is judged by instead.
    pub fn one_dump(&self) -> Option<&str> {
        let [device] = &self.devices[..] else {
            return None;
        };
        match (&device.checkpoints[..], &device.cut) {
            ([checkpoint], None) => Some(&checkpoint.source),
            _ => None,
        }
    }

    /// Number of checkpoints over all devices.
    pub fn checkpoint_count(&self) -> usize {
        self.devices.iter().map(|d| d.checkpoints.len()).sum()
    }
}

/// The traces of `snap` that record an allocation on a device (pinned
/// host memory is none): those a trend judges.
pub(crate) fn busy_traces(snap: &Snapshot) -> Vec<usize> {
    (0..snap.traces.len())
        .filter(|&i| {
            let trace = &snap.traces[i];
            trace.device != PINNED_HOST_DEVICE
                && trace.events.iter().any(|e| e.action == Action::Alloc)
        })
        .collect()
}
