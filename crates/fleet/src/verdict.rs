//! Judging each rank as `trend` does, then the whole job across ranks.

use serde::Serialize;
use snapdiff_analyze::rows::{CheckpointRow, ProcessRows, SiteRow};
use snapdiff_analyze::{HeldBy, Outside, Site, Suspect, Trend, TrendOptions};
use snapdiff_runs::Unreadable;

use crate::stacks::Stacks;

/// How a fleet is judged.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct FleetOptions {
    /// How each rank is judged (warm-up, culprit rules, device memory).
    pub trend: TrendOptions,
}

/// One device of one rank, judged.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceVerdict {
    /// The device ordinal.
    pub device: u32,
    /// Its trend, as `trend` would report it.
    pub trend: Trend,
    /// Its checkpoints, in order (exit dumps that were left out included).
    pub checkpoints: Vec<CheckpointRow>,
    /// The sites live at the last checkpoint judged: what imbalance compares.
    pub last: Vec<SiteRow>,
}

/// One rank (process), judged device by device.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessVerdict {
    /// The process as `trend` names it (`rank7`).
    pub process: String,
    /// Its devices, in ascending order.
    pub devices: Vec<DeviceVerdict>,
}

/// Judges the rows of one process as `trend` judges its files: each
/// device on its own, by the analyzer's [`judge`](snapdiff_analyze::judge()),
/// sites named from `stacks`.
pub fn judge(rows: ProcessRows, stacks: &Stacks, options: &TrendOptions) -> ProcessVerdict {
    let describe = |key| Some((stacks.snapshot(), stacks.stack(key)));
    let devices = rows
        .devices
        .into_iter()
        .map(|mut device| {
            let judged = snapdiff_analyze::judge(
                &device,
                &describe,
                &mut |k| device.owners.get(k).cloned().flatten(),
                options,
            );
            let last = judged
                .last()
                .map(|i| std::mem::take(&mut device.sites[i]))
                .unwrap_or_default();
            device.put_in_order();
            DeviceVerdict {
                device: device.device,
                trend: judged.trend,
                checkpoints: device.checkpoints,
                last,
            }
        })
        .collect();
    ProcessVerdict {
        process: rows.process,
        devices,
    }
}

/// One device of one rank: what the fleet's findings name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Member {
    /// The rank, when the process is one (`rank7` is 7).
    pub rank: Option<u32>,
    /// The process as `trend` names it.
    pub process: String,
    /// The device ordinal.
    pub device: u32,
}

/// A rank's verdict in a word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Some site's memory keeps growing.
    Leaking,
    /// Enough checkpoints, and no site keeps growing.
    Steady,
    /// Too few checkpoints to judge (see the rank's notes).
    TooFewCheckpoints,
}

/// One device of one rank in the fleet's JSON: its verdict and evidence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemberRow {
    /// Who.
    #[serde(flatten)]
    pub member: Member,
    /// The verdict.
    pub verdict: Verdict,
    /// Sum of its suspects' growth, in bytes.
    pub suspected_bytes: u64,
    /// Its sites whose memory keeps growing, as `trend` reports them.
    pub suspects: Vec<Suspect>,
    /// Its checkpoints and their totals.
    pub checkpoints: Vec<CheckpointRow>,
    /// Plain statements about its analysis.
    pub notes: Vec<String>,
    /// Memory outside what its snapshots record (its RSS, its device's use
    /// beyond the allocator), when capture measured it.
    /// (Boxed: rarely set, and a fleet holds a row for each of thousands
    /// of ranks.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outside: Option<Box<Outside>>,
}

/// How much one member's site grew.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemberGrowth {
    /// Who.
    #[serde(flatten)]
    pub member: Member,
    /// Growth of the site's floor after warm-up, in bytes.
    pub growth_bytes: u64,
    /// Growth per training step, when steps are known.
    pub growth_per_step: Option<f64>,
    /// Growth per checkpoint after warm-up.
    pub growth_per_checkpoint: u64,
}

/// One line of code leaking on one or more ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FleetLeak {
    /// The site, as the rank that grew most there describes it (the first
    /// in rank order among equals).
    pub site: Site,
    /// The ranks (devices) it leaks on, in rank order.
    pub members: Vec<MemberGrowth>,
    /// Their growth, added up.
    pub growth_bytes: u64,
    /// What kept the blocks alive on the rank that grew most there, of
    /// those whose job said (capture's owners files); left out of JSON when
    /// empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<HeldBy>,
}

/// How far one member holds above its peers at a site.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemberExcess {
    /// Who.
    #[serde(flatten)]
    pub member: Member,
    /// Bytes it holds at the site.
    pub bytes: u64,
    /// Bytes above the median of all members.
    pub excess_bytes: u64,
}

/// A site where some ranks hold far more than the others at the same step:
/// imbalance, not growth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Imbalance {
    /// The site, as the member holding most describes it.
    pub site: Site,
    /// The step compared (each member's last checkpoint there), if known.
    pub step: Option<u64>,
    /// The median bytes over all members compared.
    pub median_bytes: u64,
    /// The members holding far more, in rank order.
    pub members: Vec<MemberExcess>,
    /// Their excess, added up.
    pub excess_bytes: u64,
}

/// One verdict for a whole job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fleet {
    /// Ranks (processes) read.
    pub processes: usize,
    /// Ranks none of whose devices leaks, with enough checkpoints.
    pub steady: usize,
    /// Ranks with a device whose memory keeps growing.
    pub leaking: usize,
    /// Ranks with too few checkpoints to judge.
    pub too_few_checkpoints: usize,
    /// Ranks' devices judged: more than `processes` when a rank has
    /// several.
    pub devices: usize,
    /// Snapshot files read (0 when read from site tables).
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Files that could not be read.
    pub unreadable: Vec<Unreadable>,
    /// Lines that leak, each with the ranks it leaks on; most ranks first.
    pub leaks: Vec<FleetLeak>,
    /// Sites some ranks hold far more of than the rest; most excess first.
    pub imbalance: Vec<Imbalance>,
    /// Every rank's device, in rank order; of a verdict that keeps only
    /// the rows its text names ([`Rows::Named`](crate::Rows::Named)), those alone.
    pub members: Vec<MemberRow>,
    /// Plain statements about the analysis.
    pub notes: Vec<String>,
}

/// The least excess over the median that is imbalance, in bytes: below it
/// is the noise of rounding and of data that differs slightly by rank.
pub const MIN_IMBALANCE_BYTES: u64 = 1 << 20;
