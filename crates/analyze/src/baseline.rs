//! A run's memory as a file to commit, and the check of another run
//! against it: the memory gate of a CI job that names the line.
//!
//! A baseline holds, per device, the peak allocated and reserved bytes of
//! the run, and per site the bytes it held at that peak, its blocks, and
//! the bytes it kept growing after warm-up (0 for a steady site). A site is
//! keyed by what survives line drift: the functions and file names of its
//! own code's frames, innermost first (`train@fit.py<main@fit.py`), never
//! a line, an absolute path, a time or a pid; its line is kept for display
//! only. Sites whose keys are equal (two lines of one function) add up.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use snapdiff_format::Snapshot;

use crate::category::{Categories, Category};
use crate::culprit::CulpritRules;
use crate::frame_class::classify;
use crate::group::{Site, SiteNamer, live_sites_by_device};
use crate::peak::device_peaks;
use crate::stack_key::StackKeys;
use crate::trend::Trend;

/// The version of the baseline file's layout.
pub const BASELINE_FORMAT: u32 = 1;

/// Frames of a site's own code a key is made of, innermost first: enough to
/// tell sites apart, few enough that a caller's change leaves it alone.
const KEY_FRAMES: usize = 3;

/// A run's memory, as `snapdiff baseline` writes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// [`BASELINE_FORMAT`].
    pub snapdiff_baseline: u32,
    /// Each device's peak, by ordinal.
    pub devices: Vec<DeviceBaseline>,
    /// The sites, by device and key.
    pub sites: Vec<SiteBaseline>,
}

/// One device's peak in a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceBaseline {
    /// Device ordinal.
    pub device: u32,
    /// The most live bytes (requested by the program) at one moment.
    pub peak_allocated: u64,
    /// The most reserved bytes at one moment.
    pub peak_reserved: u64,
}

/// One site in a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteBaseline {
    /// Device ordinal.
    pub device: u32,
    /// What survives line drift: `function@file` of the site's own code's
    /// innermost frames, `<` between them.
    pub key: String,
    /// Where it is, for people: `function  file:line` (the file's name).
    pub line: String,
    /// Live bytes at the device's peak.
    pub peak_bytes: u64,
    /// Live blocks at the device's peak.
    pub blocks: u64,
    /// Bytes it kept growing after warm-up (0: steady).
    pub kept_bytes: u64,
    /// What its memory is for (parameters, optimizer state, ...), from its
    /// stack; absent from files written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
}

impl Baseline {
    /// The baseline of one process's `snapshots` (its dumps, oldest first;
    /// those with traces give the peak inside them), `trend` their verdict.
    pub fn of(snapshots: &[Snapshot], trend: Option<&Trend>, rules: &CulpritRules) -> Baseline {
        Baseline::with_trend(Peaks::of(snapshots, rules), trend)
    }

    /// The baseline of a process from its [`Peaks`] and its verdict
    /// `trend`, which give the bytes each site kept after warm-up. Apart
    /// from [`Baseline::of`] so that the two, each a replay of the trace,
    /// can be worked out side by side.
    pub fn with_trend(peaks: Peaks, trend: Option<&Trend>) -> Baseline {
        let devices = peaks.0;
        let mut kept: BTreeMap<(String, String), u64> = BTreeMap::new();
        for s in trend.map_or(&[][..], |t| &t.suspects[..]) {
            *kept.entry((key_of(&s.site), line_of(&s.site))).or_default() += s.growth_bytes;
        }
        // One entry a line: stacks that differ further out add up.
        let mut sites: BTreeMap<(u32, String, String), SiteBaseline> = BTreeMap::new();
        for (device, (_, at_peak)) in &devices {
            for SiteAt {
                site,
                category,
                bytes,
                blocks,
            } in at_peak
            {
                let (key, line) = (key_of(site), line_of(site));
                let entry = sites
                    .entry((*device, key.clone(), line.clone()))
                    .or_default();
                entry.device = *device;
                entry.kept_bytes = kept.get(&(key.clone(), line.clone())).copied().unwrap_or(0);
                entry.key = key;
                entry.line = line;
                entry.peak_bytes += bytes;
                entry.blocks += blocks;
                entry.category.get_or_insert(*category);
            }
        }
        Baseline {
            snapdiff_baseline: BASELINE_FORMAT,
            devices: devices.into_values().map(|(d, _)| d).collect(),
            sites: sites.into_values().collect(),
        }
    }

    /// The largest value of each figure over `baselines` (a fleet's ranks).
    pub fn largest(baselines: impl IntoIterator<Item = Baseline>) -> Baseline {
        let mut devices: BTreeMap<u32, DeviceBaseline> = BTreeMap::new();
        let mut sites: BTreeMap<(u32, String, String), SiteBaseline> = BTreeMap::new();
        for b in baselines {
            for d in b.devices {
                let e = devices.entry(d.device).or_default();
                e.device = d.device;
                e.peak_allocated = e.peak_allocated.max(d.peak_allocated);
                e.peak_reserved = e.peak_reserved.max(d.peak_reserved);
            }
            for s in b.sites {
                let e = sites
                    .entry((s.device, s.key.clone(), s.line.clone()))
                    .or_default();
                if s.peak_bytes >= e.peak_bytes {
                    e.line.clone_from(&s.line);
                    e.blocks = s.blocks;
                    e.category = s.category.or(e.category);
                }
                e.peak_bytes = e.peak_bytes.max(s.peak_bytes);
                e.kept_bytes = e.kept_bytes.max(s.kept_bytes);
                e.device = s.device;
                e.key = s.key;
            }
        }
        Baseline {
            snapdiff_baseline: BASELINE_FORMAT,
            devices: devices.into_values().collect(),
            sites: sites.into_values().collect(),
        }
    }
}

/// Each device's highest moment over a process's snapshots, with what was
/// live at each site then: the part of its [`Baseline`] that needs no
/// verdict.
pub struct Peaks(BTreeMap<u32, (DeviceBaseline, Vec<SiteAt>)>);

impl Peaks {
    /// The peaks of one process's `snapshots`: inside each trace where a
    /// snapshot has one, else its state when dumped.
    pub fn of<'a>(
        snapshots: impl IntoIterator<Item = &'a Snapshot>,
        rules: &CulpritRules,
    ) -> Peaks {
        let mut peaks = Peaks(BTreeMap::new());
        for snap in snapshots {
            peaks.add(snap, &StackKeys::new(snap), rules);
        }
        peaks
    }

    /// [`Peaks::of`] of snapshots whose stack keys are worked out already,
    /// each with its keys: for a caller that judges the same snapshots.
    pub fn of_keyed<'a>(
        snapshots: impl IntoIterator<Item = (&'a Snapshot, &'a StackKeys)>,
        rules: &CulpritRules,
    ) -> Peaks {
        let mut peaks = Peaks(BTreeMap::new());
        for (snap, keys) in snapshots {
            peaks.add(snap, keys, rules);
        }
        peaks
    }

    /// Takes in the moments of `snap`, whose stacks' keys are `keys`.
    fn add(&mut self, snap: &Snapshot, keys: &StackKeys, rules: &CulpritRules) {
        for m in moments(snap, keys, rules) {
            let entry = self.0.entry(m.device).or_default();
            entry.0.device = m.device;
            entry.0.peak_reserved = entry.0.peak_reserved.max(m.reserved);
            if m.allocated >= entry.0.peak_allocated {
                entry.0.peak_allocated = m.allocated;
                entry.1 = m.sites;
            }
        }
    }
}

/// A site's live bytes and blocks at one moment.
struct SiteAt {
    site: Site,
    category: Category,
    bytes: u64,
    blocks: u64,
}

/// One device's highest moment in a snapshot.
struct Moment {
    device: u32,
    /// Live bytes (requested).
    allocated: u64,
    reserved: u64,
    sites: Vec<SiteAt>,
}

/// Each device's highest moment in `snap`: the peak inside its trace where
/// it has one and it is higher than the state when dumped, else that state.
/// The state's sites are named only where it is the highest.
fn moments(snap: &Snapshot, keys: &StackKeys, rules: &CulpritRules) -> Vec<Moment> {
    // What each distinct frame is, worked out once for all the sites.
    let namer = SiteNamer::keyed(snap, keys, rules);
    let categories = Categories::new(snap);
    let mut peaks = device_peaks(snap, keys, &namer, &categories);
    let mut out = Vec::new();
    for d in live_sites_by_device(snap, keys) {
        let allocated: u64 = d.totals.values().map(|t| t.bytes).sum();
        let reserved: u64 = snap
            .device_segments()
            .filter(|s| s.device == d.device)
            .map(|s| s.total_size)
            .sum();
        let higher_peak = peaks
            .iter()
            .position(|p| p.device == d.device && p.allocated_bytes > allocated);
        if let Some(at) = higher_peak {
            let peak = peaks.remove(at);
            let mut moment = peak_moment(peak);
            moment.reserved = moment.reserved.max(reserved);
            out.push(moment);
            continue;
        }
        peaks.retain(|p| p.device != d.device);
        out.push(Moment {
            device: d.device,
            reserved,
            allocated,
            sites: d
                .totals
                .iter()
                .map(|(key, t)| SiteAt {
                    site: namer.site(*key, d.stacks[key]),
                    category: categories.of(d.stacks[key]),
                    bytes: t.bytes,
                    blocks: t.blocks,
                })
                .collect(),
        });
    }
    // Devices with a trace and no segments.
    out.extend(peaks.into_iter().map(peak_moment));
    out
}

/// The moment of a device's peak inside its trace.
fn peak_moment(p: crate::peak::DevicePeak) -> Moment {
    Moment {
        device: p.device,
        allocated: p.allocated_bytes,
        reserved: p.reserved_bytes.unwrap_or(0),
        sites: p
            .sites
            .into_iter()
            .map(|s| SiteAt {
                site: s.site,
                category: s.category,
                bytes: s.bytes,
                blocks: s.blocks,
            })
            .collect(),
    }
}

/// A site's key: `function@file` of its own code's innermost frames; its
/// culprit's where it has no frame of its own code.
pub fn key_of(site: &Site) -> String {
    let base = |file: &str| file.rsplit(['/', '\\']).next().unwrap_or(file).to_owned();
    let own: Vec<String> = site
        .frames
        .iter()
        .filter(|f| {
            let frame = snapdiff_format::Frame {
                name: f.name.as_str().into(),
                file: f.file.as_str().into(),
                line: f.line,
                extra: Vec::new(),
            };
            classify(&frame).is_program()
        })
        .take(KEY_FRAMES)
        .map(|f| format!("{}@{}", crate::culprit::short_name(&f.name), base(&f.file)))
        .collect();
    if own.is_empty() {
        let c = &site.culprit;
        return format!("{}@{}", crate::culprit::short_name(&c.name), base(&c.file));
    }
    own.join("<")
}

/// `function  file:line` of a site's culprit, the file by its name only.
fn line_of(site: &Site) -> String {
    let c = &site.culprit;
    let file = c.file.rsplit(['/', '\\']).next().unwrap_or(&c.file);
    match c.line {
        0 => format!("{}  {file}", crate::culprit::short_name(&c.name)),
        line => format!("{}  {file}:{line}", crate::culprit::short_name(&c.name)),
    }
}

/// How far a figure may rise before `check` says so: both a share of the
/// baseline's and a number of bytes must be passed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// The share, 0.05 for 5%.
    pub share: f64,
    /// The bytes.
    pub bytes: u64,
}

impl Default for Tolerance {
    /// 5% and 1 MiB: run-to-run noise of the same code stays under both.
    fn default() -> Tolerance {
        Tolerance {
            share: 0.05,
            bytes: 1 << 20,
        }
    }
}

impl Tolerance {
    /// Whether `now` is over `before` by more than this tolerance.
    pub fn exceeded(&self, before: u64, now: u64) -> bool {
        now > before
            && now - before > self.bytes
            && (now - before) as f64 > self.share * before as f64
    }
}

/// One figure of a run over its baseline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Over {
    /// Device ordinal.
    pub device: u32,
    /// What rose: `peak_allocated`, `peak_reserved`, `peak_bytes` (a site's
    /// bytes at the peak), `kept_bytes` (a site's growth after warm-up).
    pub figure: &'static str,
    /// The site's key and line; empty for a device's figure.
    pub key: String,
    /// See [`SiteBaseline::line`].
    pub line: String,
    /// The site's line in the baseline when its code moved (its key
    /// changed: a file renamed, a function renamed); empty otherwise.
    pub was: String,
    /// The baseline's value.
    pub before: u64,
    /// The run's.
    pub now: u64,
}

/// The check of a run against a baseline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// Figures over the tolerance, devices' first, then sites' by how much.
    pub over: Vec<Over>,
    /// Sites whose peak bytes changed at all, by how much (the peak's
    /// change, site by site).
    pub changed: Vec<Over>,
}

/// Checks `run` against `baseline`.
pub fn check(baseline: &Baseline, run: &Baseline, tolerance: Tolerance) -> Check {
    let mut over = Vec::new();
    for now in &run.devices {
        let before = baseline
            .devices
            .iter()
            .find(|d| d.device == now.device)
            .cloned()
            .unwrap_or_default();
        for (figure, b, n) in [
            ("peak_allocated", before.peak_allocated, now.peak_allocated),
            ("peak_reserved", before.peak_reserved, now.peak_reserved),
        ] {
            if tolerance.exceeded(b, n) {
                over.push(Over {
                    device: now.device,
                    figure,
                    key: String::new(),
                    line: String::new(),
                    was: String::new(),
                    before: b,
                    now: n,
                });
            }
        }
    }
    let mut changed = Vec::new();
    let mut sites_over = Vec::new();
    for (before, now) in pair_sites(baseline, run) {
        let (before, now) = (
            before.cloned().unwrap_or_default(),
            now.cloned().unwrap_or_default(),
        );
        let shown = if now.peak_bytes > 0 || before.line.is_empty() {
            &now
        } else {
            &before
        };
        let was = if before.key.is_empty() || now.key.is_empty() || before.key == now.key {
            String::new()
        } else {
            before.line.clone()
        };
        let row = |figure, b: u64, n: u64| Over {
            device: shown.device,
            figure,
            key: shown.key.clone(),
            line: shown.line.clone(),
            was: was.clone(),
            before: b,
            now: n,
        };
        if before.peak_bytes != now.peak_bytes {
            changed.push(row("peak_bytes", before.peak_bytes, now.peak_bytes));
        }
        if tolerance.exceeded(before.peak_bytes, now.peak_bytes) {
            sites_over.push(row("peak_bytes", before.peak_bytes, now.peak_bytes));
        }
        if tolerance.exceeded(before.kept_bytes, now.kept_bytes) {
            sites_over.push(row("kept_bytes", before.kept_bytes, now.kept_bytes));
        }
    }
    let rise = |o: &Over| std::cmp::Reverse(o.now as i64 - o.before as i64);
    sites_over.sort_by_key(|o| (rise(o), o.key.clone()));
    changed.sort_by_key(|o| {
        (
            std::cmp::Reverse((o.now as i64 - o.before as i64).abs()),
            o.key.clone(),
        )
    });
    over.extend(sites_over);
    Check { over, changed }
}

/// One site's bytes at the peak in a baseline and in a run, side by side:
/// what a check's page shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SitePair {
    /// Device ordinal.
    pub device: u32,
    /// Its key and line where the run has it (else the baseline's).
    pub key: String,
    /// See [`SiteBaseline::line`].
    pub line: String,
    /// Its line in the baseline when its code moved (another key, or the
    /// same key at another line); empty otherwise.
    pub was: String,
    /// What its memory is for, when known.
    pub category: Option<Category>,
    /// Bytes at the baseline's peak (0: a new site).
    pub before: u64,
    /// Bytes at the run's peak (0: a site gone).
    pub now: u64,
}

/// Every site of `baseline` and `run`, paired as `check` pairs them, the
/// largest change first.
pub fn side_by_side(baseline: &Baseline, run: &Baseline) -> Vec<SitePair> {
    let mut pairs: Vec<SitePair> = pair_sites(baseline, run)
        .into_iter()
        .map(|(before, now)| {
            let shown = now.or(before).expect("a pair holds a site");
            let moved = matches!((before, now), (Some(b), Some(n)) if b.line != n.line);
            SitePair {
                device: shown.device,
                key: shown.key.clone(),
                line: shown.line.clone(),
                was: if moved {
                    before.map(|b| b.line.clone()).unwrap_or_default()
                } else {
                    String::new()
                },
                category: now
                    .and_then(|n| n.category)
                    .or(before.and_then(|b| b.category)),
                before: before.map_or(0, |b| b.peak_bytes),
                now: now.map_or(0, |n| n.peak_bytes),
            }
        })
        .collect();
    pairs.sort_by_key(|p| {
        (
            std::cmp::Reverse((p.now as i64 - p.before as i64).unsigned_abs()),
            std::cmp::Reverse(p.now.max(p.before)),
            p.key.clone(),
        )
    });
    pairs
}

/// The baseline `check --update` writes: each figure the lower of the
/// baseline's and the run's (a ratchet: memory that fell stays won), sites
/// at their place in the run's code, sites the run lacks left out, new
/// ones added; with `allow_increase`, the run's figures as they are.
pub fn ratchet(baseline: &Baseline, run: &Baseline, allow_increase: bool) -> Baseline {
    let lower = |b: u64, n: u64| if allow_increase { n } else { b.min(n) };
    let devices = run
        .devices
        .iter()
        .map(
            |n| match baseline.devices.iter().find(|b| b.device == n.device) {
                Some(b) => DeviceBaseline {
                    device: n.device,
                    peak_allocated: lower(b.peak_allocated, n.peak_allocated),
                    peak_reserved: lower(b.peak_reserved, n.peak_reserved),
                },
                None => n.clone(),
            },
        )
        .collect();
    let mut sites: Vec<SiteBaseline> = pair_sites(baseline, run)
        .into_iter()
        .filter_map(|(b, n)| {
            let n = n?;
            Some(match b {
                Some(b) => SiteBaseline {
                    peak_bytes: lower(b.peak_bytes, n.peak_bytes),
                    blocks: lower(b.blocks, n.blocks),
                    kept_bytes: lower(b.kept_bytes, n.kept_bytes),
                    ..n.clone()
                },
                None => n.clone(),
            })
        })
        .collect();
    sites.sort_by(|a, b| (a.device, &a.key, &a.line).cmp(&(b.device, &b.key, &b.line)));
    Baseline {
        snapdiff_baseline: BASELINE_FORMAT,
        devices,
        sites,
    }
}

/// The sites of `baseline` and `run` paired up, one to one, device by
/// device. Keys first: the same key; then, among keys left, the same
/// innermost function reached from other callers, and code that moved (the
/// same functions in other files; the same files with one function
/// renamed; one function renamed in files moved alike). The lines of two
/// keys so paired are paired by the shift most of them share (two lines
/// inserted above a function move all its lines alike); a line left over
/// is a site added or removed. Then the same blocks and bytes at another
/// key. A site left alone has `None` beside it.
fn pair_sites<'a>(
    baseline: &'a Baseline,
    run: &'a Baseline,
) -> Vec<(Option<&'a SiteBaseline>, Option<&'a SiteBaseline>)> {
    let mut left: Vec<&SiteBaseline> = baseline.sites.iter().collect();
    let mut right: Vec<&SiteBaseline> = run.sites.iter().collect();
    let mut pairs = Vec::new();
    let rules: [fn(&str, &str) -> bool; 5] = [
        |a, b| a == b,
        |a, b| innermost(a) == innermost(b),
        |a, b| names(a) == names(b),
        |a, b| files(a) == files(b) && renamed_at_most_one(a, b),
        |a, b| renamed_at_most_one(a, b) && files_moved_alike(a, b),
    ];
    for same in rules {
        let mut run_keys: Vec<(u32, &str)> =
            right.iter().map(|s| (s.device, s.key.as_str())).collect();
        run_keys.dedup();
        for (device, key) in run_keys {
            let Some(base_key) = left
                .iter()
                .find(|b| b.device == device && same(&b.key, key))
                .map(|b| b.key.as_str())
            else {
                continue;
            };
            let of = |sites: &[&'a SiteBaseline], k: &str| -> Vec<&'a SiteBaseline> {
                sites
                    .iter()
                    .copied()
                    .filter(|s| s.device == device && s.key == k)
                    .collect()
            };
            for (b, n) in pair_lines(&of(&left, base_key), &of(&right, key)) {
                left.retain(|s| !std::ptr::eq(*s, b));
                right.retain(|s| !std::ptr::eq(*s, n));
                pairs.push((Some(b), Some(n)));
            }
        }
    }
    let mut i = 0;
    while i < right.len() {
        let now = right[i];
        let twin = left.iter().position(|b| {
            b.device == now.device && b.blocks == now.blocks && b.peak_bytes == now.peak_bytes
        });
        match twin {
            Some(j) if now.peak_bytes > 0 => {
                pairs.push((Some(left.remove(j)), Some(right.remove(i))))
            }
            _ => i += 1,
        }
    }
    pairs.extend(left.into_iter().map(|b| (Some(b), None)));
    pairs.extend(right.into_iter().map(|n| (None, Some(n))));
    pairs
}

/// The lines of one key in the baseline (`before`) and the run (`now`)
/// paired by the shift most pairs share, the smallest of equals.
fn pair_lines<'a>(
    before: &[&'a SiteBaseline],
    now: &[&'a SiteBaseline],
) -> Vec<(&'a SiteBaseline, &'a SiteBaseline)> {
    let line = |s: &SiteBaseline| i64::from(line_number(&s.line));
    let mut shifts: BTreeMap<i64, usize> = BTreeMap::new();
    for b in before {
        for n in now {
            *shifts.entry(line(n) - line(b)).or_default() += 1;
        }
    }
    let Some(shift) = shifts
        .iter()
        .max_by_key(|(shift, count)| (**count, std::cmp::Reverse(shift.abs())))
        .map(|(shift, _)| *shift)
    else {
        return Vec::new();
    };
    let mut pairs = Vec::new();
    let mut taken = vec![false; now.len()];
    for b in before {
        if let Some(j) = (0..now.len()).find(|&j| !taken[j] && line(now[j]) - line(b) == shift) {
            taken[j] = true;
            pairs.push((*b, now[j]));
        }
    }
    pairs
}

/// The line number at the end of a site's `line` (`train  fit.py:127`), 0
/// when it has none.
fn line_number(line: &str) -> u32 {
    line.rsplit_once(':')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

/// A key's innermost `function@file`: the site's line is in it.
fn innermost(key: &str) -> &str {
    key.split('<').next().unwrap_or(key)
}

/// The function names of a key, innermost first.
fn names(key: &str) -> Vec<&str> {
    key.split('<')
        .map(|f| f.rsplit_once('@').map_or(f, |(name, _)| name))
        .collect()
}

/// The file names of a key, innermost first.
fn files(key: &str) -> Vec<&str> {
    key.split('<')
        .map(|f| f.rsplit_once('@').map_or("", |(_, file)| file))
        .collect()
}

/// Whether two keys are as long (three frames: two say little) and differ
/// in at most one function name.
fn renamed_at_most_one(a: &str, b: &str) -> bool {
    let (x, y) = (names(a), names(b));
    x.len() == y.len()
        && x.len() >= KEY_FRAMES
        && x.iter().zip(&y).filter(|(p, q)| p != q).count() <= 1
}

/// Whether the files of two keys moved alike: each file of one is always
/// the same file of the other, both ways (`train.py` became `fit.py`).
fn files_moved_alike(a: &str, b: &str) -> bool {
    let (x, y) = (files(a), files(b));
    x.len() == y.len()
        && x.iter()
            .zip(&y)
            .all(|(p, q)| x.iter().zip(&y).all(|(r, s)| (p == r) == (q == s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(device: u32, key: &str, peak_bytes: u64) -> SiteBaseline {
        SiteBaseline {
            device,
            key: key.into(),
            line: format!("{key}:1"),
            peak_bytes,
            blocks: 1,
            kept_bytes: 0,
            category: None,
        }
    }

    fn baseline(peak: u64, sites: Vec<SiteBaseline>) -> Baseline {
        Baseline {
            snapdiff_baseline: BASELINE_FORMAT,
            devices: vec![DeviceBaseline {
                device: 0,
                peak_allocated: peak,
                peak_reserved: peak,
            }],
            sites,
        }
    }

    const TOLERANCE: Tolerance = Tolerance {
        share: 0.05,
        bytes: 1 << 20,
    };

    #[test]
    fn a_site_over_both_tolerances_is_named_and_noise_is_not() {
        let base = baseline(
            100 << 20,
            vec![site(0, "a", 60 << 20), site(0, "b", 40 << 20)],
        );
        // Noise: 2% more at one site, under both limits.
        let noisy = baseline(
            101 << 20,
            vec![site(0, "a", 61 << 20), site(0, "b", 40 << 20)],
        );
        assert!(check(&base, &noisy, TOLERANCE).over.is_empty());
        // One site 16 MiB larger: it and the device's peak are over.
        let grown = baseline(
            116 << 20,
            vec![site(0, "a", 60 << 20), site(0, "b", 56 << 20)],
        );
        let c = check(&base, &grown, TOLERANCE);
        let named: Vec<(&str, &str)> = c.over.iter().map(|o| (o.figure, o.key.as_str())).collect();
        assert_eq!(
            named,
            [
                ("peak_allocated", ""),
                ("peak_reserved", ""),
                ("peak_bytes", "b")
            ]
        );
        assert_eq!(c.changed[0].key, "b");
    }

    #[test]
    fn a_new_site_counts_from_zero_and_a_gone_one_is_a_change_not_a_failure() {
        let base = baseline(10 << 20, vec![site(0, "a", 10 << 20)]);
        let run = baseline(10 << 20, vec![site(0, "c", 12 << 20)]);
        let c = check(&base, &run, TOLERANCE);
        assert_eq!(c.over.len(), 1, "{c:#?}");
        assert_eq!((c.over[0].key.as_str(), c.over[0].before), ("c", 0));
        assert!(c.changed.iter().any(|o| o.key == "a" && o.now == 0));
    }

    #[test]
    fn moved_code_keeps_its_site_and_names_where_it_was() {
        let before = "step@train.py<main@train.py<<module>@train.py";
        let base = baseline(10 << 20, vec![site(0, before, 10 << 20)]);
        // The file renamed and the function renamed, 4 MiB more.
        let run = baseline(
            14 << 20,
            vec![site(
                0,
                "fit_step@fit.py<main@fit.py<<module>@fit.py",
                14 << 20,
            )],
        );
        let c = check(&base, &run, TOLERANCE);
        let over = c.over.iter().find(|o| o.figure == "peak_bytes").unwrap();
        assert_eq!((over.before, over.now), (10 << 20, 14 << 20));
        assert_eq!(over.was, format!("{before}:1"));
        // Moved and unchanged: nothing over, nothing changed.
        let moved = baseline(
            10 << 20,
            vec![site(0, "step@fit.py<main@fit.py<<module>@fit.py", 10 << 20)],
        );
        let c = check(&base, &moved, TOLERANCE);
        assert!(c.over.is_empty() && c.changed.is_empty(), "{c:#?}");
        // Two functions of other files under one caller are two sites.
        let other = baseline(
            14 << 20,
            vec![site(
                0,
                "load@data.py<main@fit.py<<module>@fit.py",
                14 << 20,
            )],
        );
        let c = check(&base, &other, TOLERANCE);
        assert!(c.over.iter().all(|o| o.was.is_empty()), "{c:#?}");
    }

    #[test]
    fn updates_ratchet_down_unless_an_increase_is_allowed() {
        let base = baseline(100, vec![site(0, "a", 60), site(0, "gone", 40)]);
        let run = baseline(120, vec![site(0, "a", 50), site(0, "new", 70)]);
        let kept = ratchet(&base, &run, false);
        assert_eq!(kept.devices[0].peak_allocated, 100);
        let bytes: Vec<(&str, u64)> = kept
            .sites
            .iter()
            .map(|s| (s.key.as_str(), s.peak_bytes))
            .collect();
        assert_eq!(bytes, [("a", 50), ("new", 70)]);
        let raised = ratchet(&base, &run, true);
        assert_eq!(raised.devices[0].peak_allocated, 120);
    }

    #[test]
    fn a_fleets_baseline_holds_each_sites_largest_value() {
        let rank0 = baseline(10, vec![site(0, "a", 10)]);
        let rank1 = baseline(30, vec![site(0, "a", 30), site(0, "b", 5)]);
        let fleet = Baseline::largest([rank0, rank1]);
        assert_eq!(fleet.devices[0].peak_allocated, 30);
        let a = fleet.sites.iter().find(|s| s.key == "a").unwrap();
        assert_eq!(a.peak_bytes, 30);
        assert_eq!(fleet.sites.len(), 2);
    }
}
