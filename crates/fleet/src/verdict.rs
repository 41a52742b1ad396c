//! Judging each rank as `trend` does, then the whole job across ranks.

use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_analyze::series_order::without_exit_dumps;
use snapdiff_analyze::trend::{Checkpoint, SiteSeries};
use snapdiff_analyze::{
    CulpritRules, HeldBy, Outside, Site, StackKey, Suspect, Trend, TrendOptions, describe_site,
    judge_series,
};

use crate::rows::{CheckpointRow, ProcessRows, SiteRow, rank_of};
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

impl ProcessVerdict {
    /// Drops what only the rank's own report and JSON row show (its
    /// checkpoints, the trend's points but the last, its notes), keeping
    /// what the job's verdict needs (suspects, the last checkpoint's
    /// sites): a text verdict of many ranks then holds a few hundred bytes
    /// a rank.
    pub fn keep_for_verdict(&mut self) {
        for d in &mut self.devices {
            d.checkpoints = Vec::new();
            let last = d.trend.points.pop();
            d.trend.points = last.into_iter().collect();
            d.trend.notes = Vec::new();
            d.last.shrink_to_fit();
        }
    }
}

/// Judges the rows of one process as `trend` judges its snapshots: each
/// device on its own, its checkpoints in snapshot order, exit dumps left
/// out among enough others, sites named from `stacks`.
pub fn judge(rows: ProcessRows, stacks: &Stacks, options: &TrendOptions) -> ProcessVerdict {
    let devices = rows
        .devices
        .into_iter()
        .map(|mut device| {
            let names: Vec<&str> = device.checkpoints.iter().map(|c| c.file_name()).collect();
            let (keep, exit_note) = without_exit_dumps(&names);
            let mut judged = device.clone();
            judged.owners.resize(judged.checkpoints.len(), None);
            let mut kept = keep.iter();
            judged.checkpoints.retain(|_| *kept.next().unwrap_or(&true));
            let mut kept = keep.iter();
            judged.sites.retain(|_| *kept.next().unwrap_or(&true));
            let mut kept = keep.iter();
            judged.owners.retain(|_| *kept.next().unwrap_or(&true));
            let by = judged.put_in_order();
            device.put_in_order();
            let last_checkpoint = judged.checkpoints.last();
            let series = SiteSeries {
                points: judged
                    .checkpoints
                    .iter()
                    .map(|c| Checkpoint {
                        time_us: c.time_us,
                        step: c.step,
                        event_index: None,
                    })
                    .collect(),
                totals: judged
                    .sites
                    .iter()
                    .map(|rows| rows.iter().map(|r| (r.key, r.totals)).collect())
                    .collect(),
                sites: judged
                    .sites
                    .iter()
                    .flatten()
                    .map(|r| (r.key, (stacks.snapshot(), stacks.stack(r.key))))
                    .collect(),
                before_recording: Default::default(),
                allocated_bytes: last_checkpoint.map_or(0, |c| c.allocated_bytes),
                device_memory: last_checkpoint.and_then(|c| c.device_memory),
                pinned_host: Vec::new(),
                outside: judged
                    .checkpoints
                    .iter()
                    .map(|c| c.outside(device.device))
                    .collect(),
            };
            let owners = &judged.owners;
            let mut trend = judge_series(series, by, |k| owners.get(k).cloned().flatten(), options);
            trend.notes.extend(exit_note);
            DeviceVerdict {
                device: device.device,
                trend,
                checkpoints: device.checkpoints,
                last: judged.sites.pop().unwrap_or_default(),
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
    /// The site, as the rank that grew most there describes it.
    pub site: Site,
    /// The ranks (devices) it leaks on, in rank order.
    pub members: Vec<MemberGrowth>,
    /// Their growth, added up.
    pub growth_bytes: u64,
    /// What kept the blocks alive on the rank that grew most there, when
    /// its job said (`capture --owners`); left out of JSON when empty.
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

/// A file that could not be read, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    /// The file, as given.
    pub source: String,
    /// Why, in one line.
    pub error: String,
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
    /// Every rank's device, in rank order.
    pub members: Vec<MemberRow>,
    /// Plain statements about the analysis.
    pub notes: Vec<String>,
}

/// The least excess over the median that is imbalance, in bytes: below it
/// is the noise of rounding and of data that differs slightly by rank.
pub const MIN_IMBALANCE_BYTES: u64 = 1 << 20;
/// Members needed for robust statistics across ranks.
const MIN_MEMBERS_COMPARED: usize = 4;

/// One member's sites at its last checkpoint, where imbalance compares it.
struct Compared {
    member: Member,
    /// Its last step, or (without steps) its number of checkpoints.
    at: (Option<u64>, usize),
    last: Vec<SiteRow>,
}

/// A culprit line: what sites are merged by, across stacks and ranks.
type Line = snapdiff_analyze::held_by::CulpritLine;

fn line_of(site: &Site) -> Line {
    let c = &site.culprit;
    (c.kind, c.name.clone(), c.file.clone(), c.line)
}

/// The verdict of a job from its ranks' verdicts: counts, the leaking
/// lines merged across ranks, and imbalance at the last common step.
pub fn fleet_verdict(
    mut processes: Vec<ProcessVerdict>,
    stacks: &Stacks,
    options: &FleetOptions,
    unreadable: Vec<Unreadable>,
    files: usize,
    bytes: u64,
) -> Fleet {
    processes
        .sort_by(|a, b| (rank_of(&a.process), &a.process).cmp(&(rank_of(&b.process), &b.process)));
    let warmup = options.trend.warmup;
    let verdict_of = |trend: &Trend| {
        if !trend.suspects.is_empty() {
            Verdict::Leaking
        } else if trend.checkpoints < warmup + 3 {
            Verdict::TooFewCheckpoints
        } else {
            Verdict::Steady
        }
    };
    let (mut steady, mut leaking, mut too_few) = (0, 0, 0);
    for p in &processes {
        let verdicts: Vec<Verdict> = p.devices.iter().map(|d| verdict_of(&d.trend)).collect();
        if verdicts.contains(&Verdict::Leaking) {
            leaking += 1;
        } else if verdicts.contains(&Verdict::TooFewCheckpoints) || verdicts.is_empty() {
            too_few += 1;
        } else {
            steady += 1;
        }
    }
    // Made at their size: 10,000 ranks' rows grown by doubling were
    // the peak of a fleet's memory.
    let rows = processes.iter().map(|p| p.devices.len()).sum();
    let mut members = Vec::with_capacity(rows);
    let mut compared = Vec::with_capacity(rows);
    for p in processes {
        for d in p.devices {
            let member = Member {
                rank: rank_of(&p.process),
                process: p.process.clone(),
                device: d.device,
            };
            // Compared at its last step, or, without steps, its last checkpoint.
            let at = match d.trend.points.last().and_then(|c| c.step) {
                Some(step) => (Some(step), 0),
                None => (None, d.trend.checkpoints),
            };
            compared.push(Compared {
                member: member.clone(),
                at,
                last: d.last,
            });
            members.push(MemberRow {
                member,
                verdict: verdict_of(&d.trend),
                suspected_bytes: d.trend.suspected_bytes,
                suspects: d.trend.suspects,
                checkpoints: d.checkpoints,
                notes: d.trend.notes,
                outside: d.trend.outside,
            });
        }
    }
    let leaks = merged_leaks(&members);
    let mut notes = Vec::new();
    let imbalance = imbalance(compared, &members, stacks, &options.trend.rules, &mut notes);
    Fleet {
        processes: steady + leaking + too_few,
        steady,
        leaking,
        too_few_checkpoints: too_few,
        files,
        bytes,
        unreadable,
        leaks,
        imbalance,
        members,
        notes,
    }
}

/// The members' suspects, merged by culprit line across members.
fn merged_leaks(members: &[MemberRow]) -> Vec<FleetLeak> {
    let mut by_line: FxHashMap<Line, usize> = FxHashMap::default();
    let mut leaks: Vec<FleetLeak> = Vec::new();
    for row in members {
        for s in &row.suspects {
            let growth = MemberGrowth {
                member: row.member.clone(),
                growth_bytes: s.growth_bytes,
                growth_per_step: s.growth_per_step,
                growth_per_checkpoint: s.growth_per_checkpoint,
            };
            let at = *by_line.entry(line_of(&s.site)).or_insert_with(|| {
                leaks.push(FleetLeak {
                    site: s.site.clone(),
                    members: Vec::new(),
                    growth_bytes: 0,
                    held_by: s.held_by.clone(),
                });
                leaks.len() - 1
            });
            let leak = &mut leaks[at];
            if s.growth_bytes
                > leak
                    .members
                    .iter()
                    .map(|m| m.growth_bytes)
                    .max()
                    .unwrap_or(0)
            {
                leak.site = s.site.clone();
            }
            leak.growth_bytes = leak.growth_bytes.saturating_add(s.growth_bytes);
            leak.members.push(growth);
        }
    }
    leaks.sort_by(|a, b| {
        b.members
            .len()
            .cmp(&a.members.len())
            .then(b.growth_bytes.cmp(&a.growth_bytes))
            .then(a.site.key.cmp(&b.site.key))
    });
    leaks
}

/// The sites where some members hold far more than the median of all, at
/// the last checkpoint most members share: excess over the median above
/// eight robust standard deviations (1.4826 times the median absolute
/// deviation), a quarter of the median, and [`MIN_IMBALANCE_BYTES`]. A
/// member's own leaking line is its leak, not imbalance.
fn imbalance(
    compared: Vec<Compared>,
    members: &[MemberRow],
    stacks: &Stacks,
    rules: &CulpritRules,
    notes: &mut Vec<String>,
) -> Vec<Imbalance> {
    // The last checkpoint most members share: by step, or by count when
    // steps are not recorded.
    let mut groups: FxHashMap<(Option<u64>, usize), usize> = FxHashMap::default();
    for c in &compared {
        *groups.entry(c.at).or_default() += 1;
    }
    let Some((&common, &size)) = groups.iter().max_by_key(|(k, n)| (**n, k.0, k.1)) else {
        return Vec::new();
    };
    if size < MIN_MEMBERS_COMPARED {
        if compared.len() > 1 {
            notes.push(format!(
                "imbalance needs at least {MIN_MEMBERS_COMPARED} ranks at a common step; \
                 {size} share one"
            ));
        }
        return Vec::new();
    }
    if size < compared.len() {
        notes.push(format!(
            "{} of {} ranks end at another step than the rest and are left out of imbalance",
            compared.len() - size,
            compared.len()
        ));
    }
    // Each distinct site's line, worked out once.
    let mut lines: FxHashMap<StackKey, (Line, Site)> = FxHashMap::default();
    let mut line_of_key = |key: StackKey| {
        lines
            .entry(key)
            .or_insert_with(|| {
                let site = describe_site(stacks.snapshot(), key, stacks.stack(key), rules);
                (line_of(&site), site)
            })
            .clone()
    };
    let leaking: rustc_hash::FxHashSet<(Member, Line)> = members
        .iter()
        .flat_map(|m| {
            m.suspects
                .iter()
                .map(|s| (m.member.clone(), line_of(&s.site)))
        })
        .collect();
    // Bytes per line per member, and the site holding most of each line.
    let included: Vec<(Member, Vec<SiteRow>)> = compared
        .into_iter()
        .filter(|c| c.at == common)
        .map(|c| (c.member, c.last))
        .collect();
    let mut per_line: FxHashMap<Line, (Site, u64, Vec<u64>)> = FxHashMap::default();
    for (i, (_, rows)) in included.iter().enumerate() {
        for row in rows {
            let (line, site) = line_of_key(row.key);
            let entry = per_line
                .entry(line)
                .or_insert_with(|| (site.clone(), 0, vec![0; included.len()]));
            entry.2[i] = entry.2[i].saturating_add(row.totals.bytes);
            if row.totals.bytes > entry.1 {
                entry.0 = site;
                entry.1 = row.totals.bytes;
            }
        }
    }
    let mut found = Vec::new();
    for (line, (site, _, bytes)) in per_line {
        let median = median(&bytes);
        let deviations: Vec<u64> = bytes.iter().map(|&b| b.abs_diff(median)).collect();
        let sigma = 1.4826 * median_f(&deviations);
        let bar = (8.0 * sigma)
            .max(MIN_IMBALANCE_BYTES as f64)
            .max(median as f64 / 4.0);
        let over: Vec<MemberExcess> = included
            .iter()
            .zip(&bytes)
            .filter(|&((member, _), &b)| {
                b > median
                    && (b - median) as f64 > bar
                    && !leaking.contains(&(member.clone(), line.clone()))
            })
            .map(|((member, _), &b)| MemberExcess {
                member: member.clone(),
                bytes: b,
                excess_bytes: b - median,
            })
            .collect();
        if over.is_empty() {
            continue;
        }
        found.push(Imbalance {
            site,
            step: common.0,
            median_bytes: median,
            excess_bytes: over
                .iter()
                .fold(0u64, |sum, m| sum.saturating_add(m.excess_bytes)),
            members: over,
        });
    }
    found.sort_by(|a, b| {
        b.excess_bytes
            .cmp(&a.excess_bytes)
            .then(a.site.key.cmp(&b.site.key))
    });
    found
}

/// The median of `values` (the lower middle one of an even count).
fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

/// The median of `values`, halfway between the middle two of an even count.
fn median_f(values: &[u64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2] as f64,
        n => (sorted[n / 2 - 1] as f64 + sorted[n / 2] as f64) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn medians() {
        assert_eq!(super::median(&[5, 1, 3]), 3);
        assert_eq!(super::median(&[0, 0, 0, 10]), 0);
        assert_eq!(super::median_f(&[1, 2, 3, 10]), 2.5);
    }
}
