//! Comparing two snapshots: which allocation sites hold more memory after
//! than before.
//!
//! PyTorch's own `compare` lists whole segments by address. This groups the
//! live blocks of each snapshot by stack key and compares the groups, so a
//! leak shows up as the line of code whose blocks keep accumulating, however
//! the allocator packed them into segments.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use snapdiff_format::{Meta, Snapshot};

use crate::culprit::CulpritRules;
use crate::group::{SiteNamer, culprit_line, is_live, live_groups, merge_rows};
use crate::pinned_host::PinnedHostChange;
use crate::private_pools::{IdlePool, idle_private_pools};
use crate::site_diff::{Change, GroupDiff};
use crate::stack_key::{StackKey, StackKeys};

/// Options of [`compare`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CompareOptions {
    /// How culprits are chosen. Default: the innermost frame of user code.
    pub rules: CulpritRules,
    /// Set when the caller knows the files are of two runs (a manifest or
    /// the files' names give two processes): what told it.
    pub two_runs: Option<String>,
}

/// The sites that grew, or those that shrank: how many, and by how much
/// in all (requested bytes, rows as reports show them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteChanges {
    /// Sites (report rows).
    pub sites: u64,
    /// Their deltas added up, as a size (never negative).
    pub bytes: u64,
}

/// What the two files are: two moments of one run, or two runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Runs {
    /// 1 or 2.
    pub count: u8,
    /// What told it, for two runs ("different processes: pid 1 and pid
    /// 2"); empty for one.
    pub told_by: String,
}

/// Live blocks of AFTER with a twin in BEFORE (the same address, size and
/// stack) under which, out of every twenty, two PyTorch files are two runs:
/// two moments of one run keep their weights, optimizer state and caches
/// where they were.
const TWINS_OF_ONE_RUN_IN_20: u64 = 1;
/// Live blocks AFTER needs before twins can say two runs.
const BLOCKS_FOR_TWINS: u64 = 20;

/// How blocks of the two snapshots were matched to tell kept blocks from new ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Matching {
    /// Same run: by the runtime's allocation sequence number.
    AllocationSequence,
    /// PyTorch files carry no allocation ids: a block at the same address,
    /// with the same size and stack, is taken to be the same allocation.
    AddressSizeStack,
    /// Different runs: blocks cannot be matched, only sites.
    SiteOnly,
}

/// The comparison of two snapshots.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Sum of the positive deltas of live (requested) bytes over all sites
    /// (stacks, within one run; report rows between two runs, whose stacks
    /// differ where their lines do not); rounding slack never counts.
    pub leaked_bytes: u64,
    /// Reserved bytes (all devices' segments) before.
    pub reserved_before: u64,
    /// Reserved bytes after.
    pub reserved_after: u64,
    /// Allocated bytes (`active_allocated` blocks) before.
    pub allocated_before: u64,
    /// Allocated bytes after.
    pub allocated_after: u64,
    /// Between two runs whose files hold traces: the highest live bytes of
    /// any device inside each trace ([`Comparison::peaks_from`]); left out
    /// of JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_before: Option<u64>,
    /// See `peak_before`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_after: Option<u64>,
    /// How blocks were matched.
    pub matching: Matching,
    /// One run or two. Two runs are compared site by site, never block by
    /// block: what one holds more than the other is not growth of a job.
    pub runs: Runs,
    /// The rows that grew: with [`Comparison::shrunk`], the split of the
    /// change between the files.
    pub grown: SiteChanges,
    /// The rows that shrank.
    pub shrunk: SiteChanges,
    /// Sites whose live bytes changed, most growth first.
    pub groups: Vec<GroupDiff>,
    /// Plain statements about the comparison (cache growth, mismatched devices, ...).
    pub notes: Vec<String>,
    /// Pinned host memory before and after, when either file recorded it:
    /// never in the reserved and allocated bytes above, which are the
    /// devices'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_host: Option<PinnedHostChange>,
    /// Private pools with nothing in use in either snapshot (a CUDA graph
    /// left behind), largest first; left out of JSON when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub idle_private_pools: Vec<IdlePool>,
}

/// `groups` with those whose culprits are the same line made one row: their
/// blocks and bytes add up, the stack holding more stands for them, and
/// [`Site::stacks`] counts them. What `compare` does unless the rules ask
/// for rows by stack, and what other reports of [`GroupDiff`]s can do too.
pub(crate) fn rows_by_culprit(groups: Vec<GroupDiff>) -> Vec<GroupDiff> {
    let size = |g: &GroupDiff| (g.bytes_before.max(g.bytes_after), g.site.key);
    merge_rows(groups, |g| culprit_line(&g.site), size, merge_diffs)
}

/// Adds the site of `other` to `into`: two stacks whose culprit is the same line.
fn merge_diffs(into: &mut GroupDiff, other: GroupDiff) {
    into.site.absorb(other.site);
    into.blocks_before += other.blocks_before;
    into.blocks_after += other.blocks_after;
    into.bytes_before += other.bytes_before;
    into.bytes_after += other.bytes_after;
    into.delta_bytes += other.delta_bytes;
    into.allocated_before += other.allocated_before;
    into.allocated_after += other.allocated_after;
    into.blocks_kept += other.blocks_kept;
    into.held_by.extend(other.held_by);
    into.change = match (into.blocks_before, into.blocks_after) {
        (0, _) => Change::New,
        (_, 0) => Change::Freed,
        _ if into.delta_bytes > 0 => Change::Grown,
        _ if into.delta_bytes < 0 => Change::Shrunk,
        _ if into.blocks_after > into.blocks_before => Change::Grown,
        _ if into.blocks_after < into.blocks_before => Change::Shrunk,
        _ if into.change == other.change => into.change,
        _ => Change::Rounding,
    };
}

/// The identity of a block within one process, per `matching`.
fn identities(snap: &Snapshot, keys: &StackKeys, matching: Matching) -> FxHashSet<(u64, u64, u64)> {
    let live = snap
        .device_segments()
        .flat_map(|s| &s.blocks)
        .filter(|b| is_live(b));
    match matching {
        Matching::AllocationSequence => live
            .filter_map(|b| b.alloc_seq)
            .map(|s| (s, 0, 0))
            .collect(),
        Matching::AddressSizeStack => live
            .map(|b| (b.address, b.size, keys.key(b.stack).0))
            .collect(),
        Matching::SiteOnly => FxHashSet::default(),
    }
}

fn matching_for(a: &Meta, b: &Meta) -> Matching {
    let same_run = a.run_id.is_some() && a.run_id == b.run_id;
    if same_run {
        Matching::AllocationSequence
    } else if a.producer == Meta::PRODUCER_TORCH && b.producer == Meta::PRODUCER_TORCH {
        Matching::AddressSizeStack
    } else {
        Matching::SiteOnly
    }
}

/// What says the files are two runs, if anything: the caller, the files'
/// run ids, processes or machines.
fn two_runs_said(a: &Meta, b: &Meta, options: &CompareOptions) -> Option<Option<String>> {
    if let Some(told) = &options.two_runs {
        return Some(Some(told.clone()));
    }
    match (&a.run_id, &b.run_id) {
        (Some(x), Some(y)) if x == y => return Some(None),
        (Some(_), Some(_)) => return Some(Some("the files hold different run ids".to_owned())),
        _ => {}
    }
    if let (Some(x), Some(y)) = (&a.host, &b.host)
        && x != y
    {
        return Some(Some(format!("different machines: {x} and {y}")));
    }
    if let (Some(x), Some(y)) = (a.pid, b.pid)
        && x != y
    {
        return Some(Some(format!("different processes: pid {x} and pid {y}")));
    }
    None
}

/// Whether PyTorch files nothing tells apart are two runs, by their
/// blocks: of AFTER's `live` blocks, only `twins` are where BEFORE has them.
fn two_runs_by_twins(twins: u64, live: u64) -> Option<String> {
    (live >= BLOCKS_FOR_TWINS && twins * 20 < live * TWINS_OF_ONE_RUN_IN_20).then(|| {
        format!("{twins} of the {live} live blocks of the second are where the first has them")
    })
}

/// Compares snapshot `before` with snapshot `after`.
pub fn compare(before: &Snapshot, after: &Snapshot, options: &CompareOptions) -> Comparison {
    let (keys_a, keys_b) = rayon::join(|| StackKeys::new(before), || StackKeys::new(after));
    let (groups_a, groups_b) = rayon::join(
        || live_groups(before, &keys_a),
        || live_groups(after, &keys_b),
    );
    let said = two_runs_said(&before.meta, &after.meta, options);
    let mut two_runs = said.clone().flatten();
    let mut matching = match two_runs {
        Some(_) => Matching::SiteOnly,
        None => matching_for(&before.meta, &after.meta),
    };

    // Kept blocks per site: live after, and already live before.
    let kept: FxHashMap<StackKey, u64> = if matching == Matching::SiteOnly {
        FxHashMap::default()
    } else {
        let ids = identities(before, &keys_a, matching);
        let mut kept = FxHashMap::default();
        for b in after
            .device_segments()
            .flat_map(|s| &s.blocks)
            .filter(|b| is_live(b))
        {
            let key = keys_b.key(b.stack);
            let id = match matching {
                Matching::AllocationSequence => b.alloc_seq.map(|s| (s, 0, 0)),
                _ => Some((b.address, b.size, key.0)),
            };
            if id.is_some_and(|id| ids.contains(&id)) {
                *kept.entry(key).or_insert(0) += 1;
            }
        }
        kept
    };
    // PyTorch files nothing else tells apart: two runs when their blocks
    // say so.
    let mut kept = kept;
    if said.is_none() && matching == Matching::AddressSizeStack {
        let live = groups_b.totals.values().map(|t| t.blocks).sum();
        two_runs = two_runs_by_twins(kept.values().sum(), live);
        if two_runs.is_some() {
            matching = Matching::SiteOnly;
            kept.clear();
        }
    }

    let mut all_keys: Vec<StackKey> = groups_a
        .totals
        .keys()
        .chain(groups_b.totals.keys())
        .copied()
        .collect();
    all_keys.sort_unstable();
    all_keys.dedup();
    let (namer_a, namer_b) = rayon::join(
        || SiteNamer::new(before, &options.rules),
        || SiteNamer::new(after, &options.rules),
    );
    let mut groups = Vec::new();
    for key in all_keys {
        let a = groups_a.totals.get(&key).copied().unwrap_or_default();
        let b = groups_b.totals.get(&key).copied().unwrap_or_default();
        let delta = b.bytes as i64 - a.bytes as i64;
        if delta == 0 && a.blocks == b.blocks && a.allocated == b.allocated {
            continue;
        }
        let change = match (a.blocks, b.blocks) {
            (0, _) => Change::New,
            (_, 0) => Change::Freed,
            _ if delta > 0 => Change::Grown,
            _ if delta < 0 => Change::Shrunk,
            // Same requested bytes: more or fewer blocks of nothing, or rounding.
            _ if b.blocks > a.blocks => Change::Grown,
            _ if b.blocks < a.blocks => Change::Shrunk,
            _ => Change::Rounding,
        };
        // Describe the site from the snapshot that has it, preferring `after`.
        let site = match groups_b.stacks.get(&key) {
            Some(&stack) => namer_b.site(key, stack),
            None => namer_a.site(key, groups_a.stacks[&key]),
        };
        groups.push(GroupDiff {
            site,
            change,
            blocks_before: a.blocks,
            blocks_after: b.blocks,
            bytes_before: a.bytes,
            bytes_after: b.bytes,
            delta_bytes: delta,
            allocated_before: a.allocated,
            allocated_after: b.allocated,
            blocks_kept: kept.get(&key).copied().unwrap_or(0),
            held_by: Vec::new(),
            moved_from: None,
        });
    }
    let growth = |groups: &[GroupDiff]| -> u64 {
        groups
            .iter()
            .filter(|g| g.delta_bytes > 0)
            .map(|g| g.delta_bytes as u64)
            .sum()
    };
    // Within one run, counted per stack, before rows are merged: a stack
    // that shrinks does not hide another that grows at the same line.
    // Between two runs, by rows: the same line reached through other
    // frames is not memory one run holds more.
    let mut leaked_bytes = growth(&groups);
    if !options.rules.rows_by_stack() {
        groups = rows_by_culprit(groups);
    }
    // Between two runs (two versions of the code, often), a site whose
    // code moved is one row.
    let mut moved_unchanged = 0;
    if two_runs.is_some() {
        (groups, moved_unchanged) = crate::moved::match_moved(groups);
        leaked_bytes = growth(&groups);
    }
    let changes = |grew: bool| {
        SiteChanges {
        sites: groups
            .iter()
            .filter(|g| if grew { g.delta_bytes > 0 } else { g.delta_bytes < 0 })
            .count() as u64,
        bytes: groups
            .iter()
            .map(|g| if grew { g.delta_bytes.max(0) } else { (-g.delta_bytes).max(0) } as u64)
            .sum(),
    }
    };
    let (grown, shrunk) = (changes(true), changes(false));
    // Within one run, growth first, largest first; then the rest by the
    // size of the change, rounding last. Between two runs, every change by
    // its size: what shrank is as much the change's as what grew.
    let two = two_runs.is_some();
    groups.sort_by_key(|g| {
        let growth = if two { 0 } else { g.delta_bytes.max(0) };
        let rounding = g.change == Change::Rounding;
        let allocated = g.allocated_after as i64 - g.allocated_before as i64;
        (
            std::cmp::Reverse(growth),
            rounding,
            std::cmp::Reverse(g.delta_bytes.abs().max(allocated.abs())),
            g.site.key,
        )
    });

    let (ta, tb) = (before.totals(), after.totals());
    let mut notes = Vec::new();
    let (devices_a, devices_b) = (before.device_ordinals(), after.device_ordinals());
    if devices_a != devices_b {
        notes.push(format!(
            "the snapshots cover different devices: {devices_a:?} before, {devices_b:?} after"
        ));
    }
    if before.meta.producer != after.meta.producer {
        notes.push(format!(
            "the snapshots come from different producers ({} and {}); sites are matched by stack only",
            before.meta.producer, after.meta.producer
        ));
    }
    // Sites with a stack (blocks without one share a key in every file).
    let stacked = || groups.iter().filter(|g| g.site.key != StackKey::NONE);
    let shared = stacked().any(|g| g.blocks_before > 0 && g.blocks_after > 0);
    let both_live = stacked().any(|g| g.blocks_before > 0) && stacked().any(|g| g.blocks_after > 0);
    if both_live && !shared {
        notes.push(
            "these snapshots share no code path: different programs? (each site of one is new or \
             gone in the other)"
                .to_owned(),
        );
    }
    if moved_unchanged > 0 {
        notes.push(format!(
            "{moved_unchanged} site{} moved in the code (lines shifted, a file renamed, another \
             library path) and hold the same memory in both runs",
            if moved_unchanged == 1 { "" } else { "s" }
        ));
    }
    // The shared pools' cache: private pools' segments serve only their
    // graph (or MemPool) and are said apart.
    let shared_reserved = |s: &Snapshot| -> i64 {
        (s.device_segments())
            .filter(|s| s.pool_id == (0, 0))
            .map(|s| s.total_size as i64)
            .sum()
    };
    let reserved_growth = shared_reserved(after) - shared_reserved(before);
    let allocated_growth = tb.allocated_bytes as i64 - ta.allocated_bytes as i64;
    if reserved_growth > 0 && allocated_growth <= 0 {
        notes.push(format!(
            "reserved memory grew by {} while allocated memory did not: the allocator's cache grew \
             (a higher peak or fragmentation), which is not a leak",
            snapdiff_format::units::format_size(reserved_growth as u64)
        ));
    }
    Comparison {
        leaked_bytes,
        reserved_before: ta.reserved_bytes,
        reserved_after: tb.reserved_bytes,
        allocated_before: ta.allocated_bytes,
        allocated_after: tb.allocated_bytes,
        peak_before: None,
        peak_after: None,
        matching,
        runs: Runs {
            count: if two { 2 } else { 1 },
            told_by: two_runs.unwrap_or_default(),
        },
        grown,
        shrunk,
        groups,
        notes,
        pinned_host: PinnedHostChange::between(before, after),
        idle_private_pools: idle_private_pools(&[before, after]),
    }
}

impl Comparison {
    /// Sets `peak_before` and `peak_after` from the traces of the two files
    /// (read with their events), where both hold allocations.
    pub fn peaks_from(&mut self, before: &Snapshot, after: &Snapshot) {
        let highest = |snap: &Snapshot| {
            crate::peak(snap, &crate::PeakOptions::default())
                .devices
                .iter()
                .map(|d| d.allocated_bytes)
                .max()
        };
        if let (Some(a), Some(b)) = rayon::join(|| highest(before), || highest(after)) {
            self.peak_before = Some(a);
            self.peak_after = Some(b);
        }
    }

    /// Fills in `held_by` of the sites that grew, from the owners when
    /// AFTER was dumped and, when known, when BEFORE was (for how many
    /// blocks each gained a step over `steps`). `line_of` gives the
    /// culprit line of a site key (see [`SiteLines`](crate::held_by::SiteLines)).
    pub fn add_held_by(
        &mut self,
        after: &crate::held_by::SiteOwners,
        before: Option<&crate::held_by::SiteOwners>,
        steps: Option<u64>,
        rules: &CulpritRules,
        line_of: impl FnMut(StackKey) -> Option<crate::held_by::CulpritLine>,
    ) {
        let grown = self.groups.iter_mut().filter(|g| g.delta_bytes > 0);
        let rows = grown.map(|g| (&g.site, &mut g.held_by));
        crate::held_by::fill(rows, after, before, steps, rules, line_of);
    }
}
