//! The job's verdict brought together one rank at a time, as each is
//! judged: the counts, the leaking lines merged across ranks, and of each
//! rank only what imbalance compares (its last step and its bytes per
//! line). A job's text verdict then keeps a few dozen bytes a rank, not
//! each rank's verdict, and its memory barely grows with the ranks.

use std::cmp::Reverse;

use rustc_hash::{FxHashMap, FxHashSet};
use snapdiff_analyze::{Site, StackKey, Trend, describe_site};

use crate::stacks::Stacks;
use crate::verdict::{
    Fleet, FleetLeak, FleetOptions, Imbalance, MIN_IMBALANCE_BYTES, Member, MemberExcess,
    MemberGrowth, MemberRow, ProcessVerdict, Verdict,
};
use snapdiff_runs::Unreadable;
use snapdiff_runs::rank_of;

/// Which ranks' rows ([`Fleet::members`]) a [`FleetTally`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Every rank's device: for JSON, the fleet page, a rank's report.
    All,
    /// Only those the text verdict names one by one (memory outside the
    /// recorded sites growing); the rest are counted.
    Named,
}

/// Members needed for robust statistics across ranks.
const MIN_MEMBERS_COMPARED: usize = 4;

/// A culprit line: what sites are merged by, across stacks and ranks.
type Line = snapdiff_analyze::held_by::CulpritLine;

/// A culprit line's number in [`Lines`].
type LineId = u32;

/// Where a member is compared for imbalance: its last step or, without
/// steps, its number of checkpoints (the latter ordered first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum At {
    Checkpoints(usize),
    Step(u64),
}

/// One rank's device as imbalance needs it; its name is in
/// `FleetTally::names`.
struct Compared {
    name: (u32, u32),
    rank: Option<u32>,
    device: u32,
    at: At,
}

/// A member's bytes at one line, at its last checkpoint.
struct Held {
    line: LineId,
    member: u32,
    bytes: u64,
}

/// The site holding most at a line among the members compared at one
/// step: what the imbalance found there is described by.
struct Largest {
    bytes: u64,
    member: u32,
    key: StackKey,
}

/// A leaking line as it is brought together, with who its site and
/// owners are taken from: the member that grew most there (of those that
/// said what held the blocks, for the owners), the first in rank order
/// among equals.
struct Leak {
    leak: FleetLeak,
    site_from: (u64, Member),
    held_by_from: Option<(u64, Member)>,
}

/// Each culprit line seen gets a number, and each site's line is worked
/// out once.
#[derive(Default)]
struct Lines {
    ids: FxHashMap<Line, LineId>,
    of_key: FxHashMap<StackKey, LineId>,
}

impl Lines {
    fn id(&mut self, line: Line) -> LineId {
        let next = self.ids.len() as LineId;
        *self.ids.entry(line).or_insert(next)
    }

    fn of_key(&mut self, key: StackKey, stacks: &Stacks, options: &FleetOptions) -> LineId {
        if let Some(&id) = self.of_key.get(&key) {
            return id;
        }
        let site = describe_site(
            stacks.snapshot(),
            key,
            stacks.stack(key),
            &options.trend.rules,
        );
        let id = self.id(line_of(&site));
        self.of_key.insert(key, id);
        id
    }
}

fn line_of(site: &Site) -> Line {
    let c = &site.culprit;
    (c.kind, c.name.clone(), c.file.clone(), c.line)
}

/// A job's verdict as its ranks are judged: [`FleetTally::add`] each
/// rank's verdict, in any order, then [`FleetTally::finish`].
pub struct FleetTally {
    options: FleetOptions,
    rows: Rows,
    steady: usize,
    leaking: usize,
    too_few: usize,
    members: Vec<MemberRow>,
    leaks: Vec<Leak>,
    leak_at_line: FxHashMap<LineId, usize>,
    lines: Lines,
    /// Every member, in the order added.
    compared: Vec<Compared>,
    /// Their process names, one after another.
    names: String,
    held: Vec<Held>,
    largest: FxHashMap<(LineId, At), Largest>,
    /// Each member's leaking lines: its leak there is not imbalance.
    leaking_lines: FxHashSet<(u32, LineId)>,
}

impl FleetTally {
    /// A job's verdict with no rank yet, keeping `rows`.
    pub fn new(options: FleetOptions, rows: Rows) -> FleetTally {
        FleetTally {
            options,
            rows,
            steady: 0,
            leaking: 0,
            too_few: 0,
            members: Vec::new(),
            leaks: Vec::new(),
            leak_at_line: FxHashMap::default(),
            lines: Lines::default(),
            compared: Vec::new(),
            names: String::new(),
            held: Vec::new(),
            largest: FxHashMap::default(),
            leaking_lines: FxHashSet::default(),
        }
    }

    fn verdict_of(&self, trend: &Trend) -> Verdict {
        if !trend.suspects.is_empty() {
            Verdict::Leaking
        } else if trend.no_verdict.is_some() || trend.checkpoints < self.options.trend.warmup + 3 {
            Verdict::TooFewCheckpoints
        } else {
            Verdict::Steady
        }
    }

    /// Adds one rank's verdict; its sites are named from `stacks`.
    pub fn add(&mut self, process: ProcessVerdict, stacks: &Stacks) {
        let verdicts: Vec<Verdict> = (process.devices.iter())
            .map(|d| self.verdict_of(&d.trend))
            .collect();
        if verdicts.contains(&Verdict::Leaking) {
            self.leaking += 1;
        } else if verdicts.contains(&Verdict::TooFewCheckpoints) || verdicts.is_empty() {
            self.too_few += 1;
        } else {
            self.steady += 1;
        }
        let rank = rank_of(&process.process);
        for (d, verdict) in process.devices.into_iter().zip(verdicts) {
            let member = Member {
                rank,
                process: process.process.clone(),
                device: d.device,
            };
            let index = self.compared.len() as u32;
            for s in &d.trend.suspects {
                let line = self.lines.id(line_of(&s.site));
                self.leaking_lines.insert((index, line));
                self.add_to_leak(line, &member, s);
            }
            // Compared at its last step, or, without steps, its last checkpoint.
            let at = match d.trend.points.last().and_then(|c| c.step) {
                Some(step) => At::Step(step),
                None => At::Checkpoints(d.trend.checkpoints),
            };
            let start = self.names.len() as u32;
            self.names.push_str(&process.process);
            self.compared.push(Compared {
                name: (start, self.names.len() as u32),
                rank,
                device: d.device,
                at,
            });
            let mut bytes_at_line: Vec<(LineId, u64)> = Vec::new();
            for row in &d.last {
                let line = self.lines.of_key(row.key, stacks, &self.options);
                self.note_largest(line, at, index, row.key, row.totals.bytes);
                match bytes_at_line.iter_mut().find(|(l, _)| *l == line) {
                    Some((_, bytes)) => *bytes = bytes.saturating_add(row.totals.bytes),
                    None => bytes_at_line.push((line, row.totals.bytes)),
                }
            }
            self.held
                .extend(bytes_at_line.into_iter().map(|(line, bytes)| Held {
                    line,
                    member: index,
                    bytes,
                }));
            let outside_grows = d.trend.outside.as_ref().is_some_and(|o| o.grows());
            if self.rows == Rows::All || outside_grows {
                self.members.push(MemberRow {
                    member,
                    verdict,
                    suspected_bytes: d.trend.suspected_bytes,
                    suspects: d.trend.suspects,
                    checkpoints: d.checkpoints,
                    notes: d.trend.notes,
                    outside: d.trend.outside,
                });
            }
        }
    }

    /// Adds `member`'s suspect `s` to the leak at `line`.
    fn add_to_leak(&mut self, line: LineId, member: &Member, s: &snapdiff_analyze::Suspect) {
        let at = *self.leak_at_line.entry(line).or_insert_with(|| {
            self.leaks.push(Leak {
                leak: FleetLeak {
                    site: s.site.clone(),
                    members: Vec::new(),
                    growth_bytes: 0,
                    held_by: Vec::new(),
                },
                site_from: (s.growth_bytes, member.clone()),
                held_by_from: None,
            });
            self.leaks.len() - 1
        });
        let leak = &mut self.leaks[at];
        let this = (s.growth_bytes, Reverse(member));
        if this > (leak.site_from.0, Reverse(&leak.site_from.1)) {
            leak.leak.site = s.site.clone();
            leak.site_from = (s.growth_bytes, member.clone());
        }
        let held_by_from = leak.held_by_from.as_ref().map(|(g, m)| (*g, Reverse(m)));
        if !s.held_by.is_empty() && held_by_from.is_none_or(|from| this > from) {
            leak.leak.held_by = s.held_by.clone();
            leak.held_by_from = Some((s.growth_bytes, member.clone()));
        }
        leak.leak.growth_bytes = leak.leak.growth_bytes.saturating_add(s.growth_bytes);
        leak.leak.members.push(MemberGrowth {
            member: member.clone(),
            growth_bytes: s.growth_bytes,
            growth_per_step: s.growth_per_step,
            growth_per_checkpoint: s.growth_per_checkpoint,
        });
    }

    /// Notes member `index`'s site `key` of `bytes` at `line` if it holds
    /// the most there of the members at `at` (the first in rank order, and
    /// in the member's own rows, among equals).
    fn note_largest(&mut self, line: LineId, at: At, index: u32, key: StackKey, bytes: u64) {
        let order = |i: u32| order_of(&self.compared[i as usize], &self.names);
        let larger = match self.largest.get(&(line, at)) {
            Some(l) if l.member == index => bytes > l.bytes,
            Some(l) => bytes > l.bytes || (bytes == l.bytes && order(index) < order(l.member)),
            None => true,
        };
        if larger {
            let largest = Largest {
                bytes,
                member: index,
                key,
            };
            self.largest.insert((line, at), largest);
        }
    }

    /// The job's verdict: the members, leaks and imbalance in rank order,
    /// leaks with most ranks first, imbalance with most excess first.
    pub fn finish(
        mut self,
        stacks: &Stacks,
        unreadable: Vec<Unreadable>,
        files: usize,
        bytes: u64,
    ) -> Fleet {
        self.members.sort_by(|a, b| a.member.cmp(&b.member));
        let mut leaks: Vec<FleetLeak> = std::mem::take(&mut self.leaks)
            .into_iter()
            .map(|l| l.leak)
            .collect();
        for leak in &mut leaks {
            leak.members.sort_by(|a, b| a.member.cmp(&b.member));
        }
        leaks.sort_by(|a, b| {
            b.members
                .len()
                .cmp(&a.members.len())
                .then(b.growth_bytes.cmp(&a.growth_bytes))
                .then(a.site.key.cmp(&b.site.key))
        });
        let mut notes = Vec::new();
        let devices = self.compared.len();
        let imbalance = self.imbalance(stacks, &mut notes);
        Fleet {
            processes: self.steady + self.leaking + self.too_few,
            steady: self.steady,
            leaking: self.leaking,
            too_few_checkpoints: self.too_few,
            devices,
            files,
            bytes,
            unreadable,
            leaks,
            imbalance,
            members: self.members,
            notes,
        }
    }

    /// The sites where some members hold far more than the median of all,
    /// at the last checkpoint most members share: excess over the median
    /// above eight robust standard deviations (1.4826 times the median
    /// absolute deviation), a quarter of the median, and
    /// [`MIN_IMBALANCE_BYTES`]. A member's own leaking line is its leak,
    /// not imbalance.
    fn imbalance(&mut self, stacks: &Stacks, notes: &mut Vec<String>) -> Vec<Imbalance> {
        // The last checkpoint most members share: by step, or by count when
        // steps are not recorded.
        let mut groups: FxHashMap<At, usize> = FxHashMap::default();
        for c in &self.compared {
            *groups.entry(c.at).or_default() += 1;
        }
        let Some((&common, &size)) = groups.iter().max_by_key(|(at, n)| (**n, **at)) else {
            return Vec::new();
        };
        let members = self.compared.len();
        if size < MIN_MEMBERS_COMPARED {
            if members > 1 {
                notes.push(format!(
                    "imbalance needs at least {MIN_MEMBERS_COMPARED} ranks at a common step; \
                     {size} share one"
                ));
            }
            return Vec::new();
        }
        if size < members {
            notes.push(format!(
                "{} of {members} ranks end at another step than the rest and are left out of \
                 imbalance",
                members - size,
            ));
        }
        // The members compared, in rank order, and each one's place there.
        let mut included: Vec<u32> = (0..members as u32)
            .filter(|&i| self.compared[i as usize].at == common)
            .collect();
        let order = |i: u32| order_of(&self.compared[i as usize], &self.names);
        included.sort_by(|&a, &b| order(a).cmp(&order(b)));
        let mut place = vec![u32::MAX; members];
        for (p, &i) in included.iter().enumerate() {
            place[i as usize] = p as u32;
        }
        let mut held = std::mem::take(&mut self.held);
        held.retain(|h| place[h.member as usize] != u32::MAX);
        held.sort_unstable_by_key(|h| (h.line, place[h.member as usize]));
        let mut found = Vec::new();
        // One line at a time: each member's bytes there (0 where it holds
        // none), their median, and who holds far more.
        let mut bytes = vec![0u64; included.len()];
        for at_line in held.chunk_by(|a, b| a.line == b.line) {
            let line = at_line[0].line;
            bytes.fill(0);
            for h in at_line {
                bytes[place[h.member as usize] as usize] = h.bytes;
            }
            let median = median(&bytes);
            let deviations: Vec<u64> = bytes.iter().map(|&b| b.abs_diff(median)).collect();
            let sigma = 1.4826 * median_f(&deviations);
            let bar = (8.0 * sigma)
                .max(MIN_IMBALANCE_BYTES as f64)
                .max(median as f64 / 4.0);
            let over: Vec<MemberExcess> = at_line
                .iter()
                .filter(|h| {
                    h.bytes > median
                        && (h.bytes - median) as f64 > bar
                        && !self.leaking_lines.contains(&(h.member, line))
                })
                .map(|h| MemberExcess {
                    member: self.member(h.member),
                    bytes: h.bytes,
                    excess_bytes: h.bytes - median,
                })
                .collect();
            if over.is_empty() {
                continue;
            }
            let Some(largest) = self.largest.get(&(line, common)) else {
                continue;
            };
            let key = largest.key;
            found.push(Imbalance {
                site: describe_site(
                    stacks.snapshot(),
                    key,
                    stacks.stack(key),
                    &self.options.trend.rules,
                ),
                step: match common {
                    At::Step(step) => Some(step),
                    At::Checkpoints(_) => None,
                },
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

    fn member(&self, index: u32) -> Member {
        let c = &self.compared[index as usize];
        Member {
            rank: c.rank,
            process: self.names[c.name.0 as usize..c.name.1 as usize].to_owned(),
            device: c.device,
        }
    }
}

/// A member's place in rank order, as [`Member`] orders.
fn order_of<'a>(c: &Compared, names: &'a str) -> (Option<u32>, &'a str, u32) {
    (
        c.rank,
        &names[c.name.0 as usize..c.name.1 as usize],
        c.device,
    )
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

/// The verdict of a job from its ranks' verdicts, every rank's row kept:
/// counts, the leaking lines merged across ranks, and imbalance at the
/// last common step (see [`FleetTally`], which brings them together one
/// rank at a time).
pub fn fleet_verdict(
    processes: Vec<ProcessVerdict>,
    stacks: &Stacks,
    options: &FleetOptions,
    unreadable: Vec<Unreadable>,
    files: usize,
    bytes: u64,
) -> Fleet {
    let mut tally = FleetTally::new(options.clone(), Rows::All);
    for process in processes {
        tally.add(process, stacks);
    }
    tally.finish(stacks, unreadable, files, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::judge;
    use snapdiff_analyze::TrendOptions;
    use snapdiff_analyze::rows::{CheckpointRow, DeviceRows, ProcessRows, SiteRow};
    use snapdiff_format::Frame;

    #[test]
    fn medians() {
        assert_eq!(median(&[5, 1, 3]), 3);
        assert_eq!(median(&[0, 0, 0, 10]), 0);
        assert_eq!(median_f(&[1, 2, 3, 10]), 2.5);
    }

    /// Two stacks for each of two lines: `train.py:10` (keys 1, 2) and
    /// `data.py:20` (keys 3, 4), called from different places.
    fn stacks() -> Stacks {
        let frame = |name: &str, file: &str, line| Frame {
            name: name.into(),
            file: file.into(),
            line,
            extra: Vec::new(),
        };
        let mut stacks = Stacks::default();
        for (key, (name, file, line), caller) in [
            (1, ("step", "train.py", 10), 1),
            (2, ("step", "train.py", 10), 2),
            (3, ("load", "data.py", 20), 3),
            (4, ("load", "data.py", 20), 4),
        ] {
            let frames = [frame(name, file, line), frame("main", "main.py", caller)];
            stacks.insert(StackKey(key), Some(frames.iter()), None);
        }
        stacks
    }

    /// Rank `rank`'s ten checkpoints, holding `site(step)` at each.
    fn rank(rank: u32, site: impl Fn(u64) -> Vec<(u64, u64)>) -> ProcessRows {
        let mut rows = ProcessRows::new(format!("rank{rank}"));
        let steps = 1..=10u64;
        rows.devices.push(DeviceRows {
            device: 0,
            checkpoints: (steps.clone())
                .map(|step| CheckpointRow {
                    step: Some(step),
                    time_us: Some(step as i64 * 1_000_000),
                    source: format!("rank{rank}-step{step}.pickle"),
                    ..CheckpointRow::default()
                })
                .collect(),
            sites: steps
                .map(|step| {
                    (site(step).into_iter())
                        .map(|(key, bytes)| SiteRow::one_block(key, bytes))
                        .collect()
                })
                .collect(),
            owners: Vec::new(),
            cut: None,
        });
        rows
    }

    /// Eight ranks: ranks 2 and 5 leak as much at `train.py:10`, by two
    /// stacks; ranks 3 and 6 hold as much more than the rest (1 MiB) at
    /// `data.py:20`, by two stacks.
    fn job(stacks: &Stacks) -> Vec<ProcessVerdict> {
        (0..8)
            .map(|r| {
                let rows = rank(r, |step| {
                    let data = match r {
                        3 => (3, 512 << 20),
                        6 => (4, 512 << 20),
                        _ => (4, 1 << 20),
                    };
                    match r {
                        2 => vec![(2, step << 20), data],
                        5 => vec![(1, step << 20), data],
                        _ => vec![data],
                    }
                });
                judge(rows, stacks, &TrendOptions::default())
            })
            .collect()
    }

    fn tallied(verdicts: Vec<ProcessVerdict>, stacks: &Stacks, rows: Rows) -> Fleet {
        let mut tally = FleetTally::new(FleetOptions::default(), rows);
        for v in verdicts {
            tally.add(v, stacks);
        }
        tally.finish(stacks, Vec::new(), 80, 0)
    }

    #[test]
    fn ranks_added_in_any_order_give_one_verdict_named_from_the_first_rank_among_equals() {
        let stacks = stacks();
        let in_order = tallied(job(&stacks), &stacks, Rows::All);
        assert_eq!((in_order.steady, in_order.leaking), (6, 2));
        let leak = &in_order.leaks[0];
        let ranks: Vec<Option<u32>> = leak.members.iter().map(|m| m.member.rank).collect();
        assert_eq!(ranks, [Some(2), Some(5)]);
        // Rank 2 grew as much as rank 5: its stack names the line.
        assert_eq!(leak.site.key, StackKey(2));
        let found = &in_order.imbalance[0];
        let ranks: Vec<Option<u32>> = found.members.iter().map(|m| m.member.rank).collect();
        assert_eq!(ranks, [Some(3), Some(6)]);
        assert_eq!(found.site.key, StackKey(3));
        assert_eq!(found.median_bytes, 1 << 20);

        let mut reversed = job(&stacks);
        reversed.reverse();
        assert_eq!(tallied(reversed, &stacks, Rows::All), in_order);
        let mut shuffled = job(&stacks);
        shuffled.swap(0, 6);
        shuffled.swap(2, 5);
        shuffled.swap(3, 7);
        assert_eq!(tallied(shuffled, &stacks, Rows::All), in_order);

        // Without the rows, the same verdict.
        let named = tallied(job(&stacks), &stacks, Rows::Named);
        assert!(named.members.is_empty());
        assert_eq!(named.devices, 8);
        assert_eq!(
            Fleet {
                members: in_order.members.clone(),
                ..named
            },
            in_order
        );
    }
}
