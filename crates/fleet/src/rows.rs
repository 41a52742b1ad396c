//! The site tables of one process: what its snapshots come to once read.

use serde::Serialize;
use snapdiff_analyze::held_by::SiteOwners;
use snapdiff_analyze::outside::OutsidePoint;
use snapdiff_analyze::series_order::{OrderKey, SnapshotOrder, snapshot_order};
use snapdiff_analyze::{Categories, SiteTotals, StackKey, StackKeys, live_sites_by_device};
use snapdiff_format::Snapshot;

use crate::stacks::StackStore;

/// One checkpoint of one device of one process: a row of
/// `checkpoints.parquet`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
}

impl CheckpointRow {
    /// What capture measured beside the recorded memory of `device` at
    /// this checkpoint, as trends judge it.
    pub fn outside(&self, device: u32) -> Option<OutsidePoint> {
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
}

/// One site's live memory at one checkpoint: a row of `sites.parquet`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteRow {
    /// The site's stack key.
    pub key: StackKey,
    /// Its live blocks, requested bytes and allocated (rounded) bytes.
    pub totals: SiteTotals,
}

#[cfg(test)]
impl SiteRow {
    /// Site `key` holding one block of `bytes`: the rows tests build.
    pub(crate) fn one_block(key: u64, bytes: u64) -> SiteRow {
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
    /// said (`capture --owners`; parallel to `checkpoints`), as
    /// `owners.parquet` stores them.
    pub owners: Vec<Option<SiteOwners>>,
}

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
            .map(|&i| std::mem::replace(&mut checkpoints[i], empty_checkpoint()))
            .collect();
        self.sites = order
            .iter()
            .map(|&i| std::mem::take(&mut sites[i]))
            .collect();
        self.owners = order.iter().map(|&i| owners[i].take()).collect();
        by
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

/// A checkpoint row that says nothing: a placeholder, or a start to fill in.
pub(crate) fn empty_checkpoint() -> CheckpointRow {
    CheckpointRow {
        step: None,
        time_us: None,
        source: String::new(),
        reserved_bytes: 0,
        allocated_bytes: 0,
        active_bytes: 0,
        device_memory: None,
        rss_bytes: None,
        device_used_bytes: None,
        recorded_on_cpu: false,
    }
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

    /// Adds `snap`, read from `source`, as one checkpoint of each device it
    /// holds segments on; the stacks of its live sites go to `stacks`, and
    /// `owners` (what kept its sites' blocks alive, when known) beside them.
    pub fn add_snapshot(
        &mut self,
        source: &str,
        snap: &Snapshot,
        stacks: &StackStore,
        owners: Option<&SiteOwners>,
    ) {
        let keys = StackKeys::of_live_blocks(snap);
        let devices = live_sites_by_device(snap, &keys);
        let categories = Categories::new(snap);
        let measured = OutsidePoint::of(snap);
        stacks.add_from(
            snap,
            devices
                .iter()
                .flat_map(|d| d.stacks.iter().map(|(&k, &s)| (k, s))),
            &categories,
        );
        for sites in devices {
            let mut checkpoint = empty_checkpoint();
            checkpoint.step = snap.meta.step;
            checkpoint.time_us = snap.meta.created_us;
            checkpoint.source = source.to_owned();
            let mut totals = snapdiff_format::Totals::default();
            for segment in snap.segments.iter().filter(|s| s.device == sites.device) {
                totals.add_segment(segment);
            }
            checkpoint.reserved_bytes = totals.reserved_bytes;
            // What capture measured beside the dump (see OutsidePoint):
            // the process's RSS on every device's row, the device's use on
            // its own.
            if let Some(m) = measured {
                checkpoint.rss_bytes = m.process.map(|(rss, _)| rss);
                checkpoint.device_used_bytes = m
                    .device
                    .filter(|_| m.ordinal == sites.device)
                    .map(|(used, _)| used);
                checkpoint.recorded_on_cpu = m.recorded_on_cpu;
            }
            checkpoint.allocated_bytes = totals.allocated_bytes;
            checkpoint.active_bytes = totals.active_bytes;
            checkpoint.device_memory = snap
                .meta
                .devices
                .iter()
                .find(|d| d.ordinal == sites.device)
                .and_then(|d| d.total_memory);
            let mut rows: Vec<SiteRow> = sites
                .totals
                .into_iter()
                .map(|(key, totals)| SiteRow { key, totals })
                .collect();
            rows.sort_unstable_by_key(|r| r.key);
            let on_device = owners.map(|all| {
                rows.iter()
                    .filter_map(|r| Some((r.key, all.get(&r.key)?.clone())))
                    .collect::<SiteOwners>()
            });
            let device = self.device_mut(sites.device);
            device.owners.resize(device.checkpoints.len(), None);
            device.checkpoints.push(checkpoint);
            device.sites.push(rows);
            device.owners.push(on_device);
        }
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

    /// Number of checkpoints over all devices.
    pub fn checkpoint_count(&self) -> usize {
        self.devices.iter().map(|d| d.checkpoints.len()).sum()
    }
}
