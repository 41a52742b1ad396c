//! Memory the process holds outside what the snapshots record: device
//! memory in use beyond the allocator's reserved bytes (NCCL, cuBLAS
//! workspaces, another library's CUDA memory), and the process's resident
//! memory beyond what a CPU job's recorder saw (numpy arrays, Python
//! objects). A job can run out of memory while every recorded site holds
//! still; this says so.
//!
//! The figures come from `snapdiff capture`: each dump's line in
//! `manifest.jsonl` gives them, and the reader puts them in the snapshot's
//! [`Meta::extra`](snapdiff_format::Meta) under the keys below.

use serde::Serialize;
use snapdiff_format::{Snapshot, Value};

use crate::rising::Rising;

/// `Meta::extra` key: the process's resident set size when the dump was
/// taken, in bytes.
pub const RSS_KEY: &str = "rss_bytes";
/// `Meta::extra` key: bytes in use on the dumping process's device, by
/// every user of it (`torch.cuda.mem_get_info()`: total minus free).
pub const DEVICE_USED_KEY: &str = "device_used_bytes";
/// `Meta::extra` key: the ordinal of that device.
pub const DEVICE_KEY: &str = "device_ordinal";
/// `Meta::extra` key: `true` when the recorded memory is the CPU's (a CPU
/// job under capture's recorder), which then lives inside the RSS.
pub const CPU_KEY: &str = "recorded_on_cpu";

/// Growth outside the recorded memory below this is never called growing:
/// a process's resident memory moves by tens of MiB as its heap breathes.
const MIN_GROWTH_BYTES: u64 = 64 << 20;

/// A measured total and the recorded bytes inside it.
type MeasuredAndRecorded = (u64, u64);

/// What the process holds outside the recorded memory at one checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutsidePoint {
    /// Device bytes in use, and the allocator's reserved bytes on that
    /// device, when the dump measured the device.
    pub device: Option<(u64, u64)>,
    /// Resident bytes of the process, and the recorded bytes inside them
    /// (the CPU recorder's; 0 on a CUDA job, whose recorded memory is the
    /// device's).
    pub process: Option<(u64, u64)>,
    /// The ordinal of the device `device` measured.
    pub ordinal: u32,
    /// Whether the recorded memory is the CPU's.
    pub recorded_on_cpu: bool,
}

impl OutsidePoint {
    /// What the dump that wrote `snap` measured, if it measured anything.
    pub fn of(snap: &Snapshot) -> Option<OutsidePoint> {
        let get = |key: &str| {
            snap.meta
                .extra
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
        };
        let bytes = |key: &str| match get(key) {
            Some(Value::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        };
        let on_cpu = matches!(get(CPU_KEY), Some(Value::Bool(true)));
        let ordinal = bytes(DEVICE_KEY).map_or(0, |o| o as u32);
        let device = bytes(DEVICE_USED_KEY).map(|used| {
            let reserved = snap
                .device_segments()
                .filter(|s| s.device == ordinal)
                .map(|s| s.total_size)
                .sum();
            (used, reserved)
        });
        let process = bytes(RSS_KEY).map(|rss| {
            let recorded = if on_cpu {
                snap.totals().reserved_bytes
            } else {
                0
            };
            (rss, recorded)
        });
        (device.is_some() || process.is_some()).then_some(OutsidePoint {
            device,
            process,
            ordinal,
            recorded_on_cpu: on_cpu,
        })
    }
}

/// One measured total over a run, beside the recorded part of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OutsideGrowth {
    /// The measured total at the end of warm-up and at the last checkpoint.
    pub measured_bytes: (u64, u64),
    /// The recorded part of it then.
    pub recorded_bytes: (u64, u64),
    /// The part outside the recorded memory (measured minus recorded),
    /// judged.
    #[serde(flatten)]
    pub outside: Rising,
}

/// Memory outside what the snapshots record, over a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outside {
    /// Device memory in use beyond the allocator's reserved bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<OutsideGrowth>,
    /// The process's resident memory beyond the recorded memory in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<OutsideGrowth>,
    /// Whether the recorded memory is the CPU's (inside the resident
    /// memory), not a device's.
    pub recorded_on_cpu: bool,
}

impl Outside {
    /// Judges `series` (each checkpoint's point and step, in order), the
    /// first `warmup` left out; `None` when no checkpoint measured both
    /// ends of a figure.
    pub fn of(series: &[(Option<OutsidePoint>, Option<u64>)], warmup: usize) -> Option<Outside> {
        let recorded_on_cpu = series
            .iter()
            .any(|(p, _)| p.is_some_and(|p| p.recorded_on_cpu));
        let judge = |pick: &dyn Fn(&OutsidePoint) -> Option<(u64, u64)>| {
            let points: Option<Vec<(MeasuredAndRecorded, Option<u64>)>> = series
                .iter()
                .map(|(p, step)| Some((pick(p.as_ref()?)?, *step)))
                .collect();
            let points = points.filter(|p| !p.is_empty())?;
            let first = points[warmup.min(points.len() - 1)].0;
            let last = points[points.len() - 1].0;
            let outside: Vec<(u64, Option<u64>)> = (points.iter())
                .map(|&((measured, recorded), step)| (measured.saturating_sub(recorded), step))
                .collect();
            Some(OutsideGrowth {
                measured_bytes: (first.0, last.0),
                recorded_bytes: (first.1, last.1),
                outside: Rising::of(&outside, warmup, MIN_GROWTH_BYTES),
            })
        };
        let device = judge(&|p| p.device);
        let process = judge(&|p| p.process);
        (device.is_some() || process.is_some()).then_some(Outside {
            device,
            process,
            recorded_on_cpu,
        })
    }

    /// Whether some memory outside the recorded memory keeps growing.
    pub fn grows(&self) -> bool {
        [&self.device, &self.process]
            .into_iter()
            .flatten()
            .any(|g| g.outside.grows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn rss_growing_while_the_recorded_memory_holds_is_outside_growth() {
        let series: Vec<_> = (0..10u64)
            .map(|i| {
                let point = OutsidePoint {
                    device: None,
                    process: Some(((300 + 32 * i) * MIB, 40 * MIB)),
                    ordinal: 0,
                    recorded_on_cpu: true,
                };
                (Some(point), Some(i))
            })
            .collect();
        let outside = Outside::of(&series, 1).unwrap();
        let process = outside.process.as_ref().unwrap();
        assert!(outside.grows());
        assert_eq!(process.outside.growth_bytes, (8 * 32 * MIB) as i64);
        assert_eq!(process.measured_bytes, (332 * MIB, 588 * MIB));
    }

    #[test]
    fn device_use_that_follows_the_allocator_is_not_outside_growth() {
        let series: Vec<_> = (0..10u64)
            .map(|i| {
                let reserved = (1000 + 100 * i) * MIB;
                let point = OutsidePoint {
                    device: Some((reserved + 500 * MIB, reserved)),
                    process: None,
                    ordinal: 0,
                    recorded_on_cpu: false,
                };
                (Some(point), Some(i))
            })
            .collect();
        let outside = Outside::of(&series, 1).unwrap();
        assert!(!outside.grows());
        assert_eq!(outside.device.unwrap().outside.growth_bytes, 0);
    }
}
