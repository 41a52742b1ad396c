//! "Held by": what kept a suspect's blocks alive, from the owners files
//! `capture` writes beside its dumps. One attribution for every
//! report: `trend`, `compare`, `summary` (and so Python's
//! `Recording.owners()`), `report` and `fleet` (from snapshots, its
//! Parquet tables or Ray) all group a dump's owners by site here and add
//! up a suspect's sites here, so that they name the same owners in the
//! same order.

use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_format::{Owner, Owners, Snapshot, StackId};

use crate::culprit::CulpritRules;
use crate::group::{Site, culprit_line, describe_site, is_live, requested};
use crate::stack_key::{StackKey, StackKeys};

/// What keeps some of a suspect's blocks alive: one owner, as the process
/// named it when it dumped.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeldBy {
    /// The owner: a container (`train.history`), a variable
    /// (`evaluate (train.py:88): total_loss`), `the autograd graph of ...`,
    /// or `a reference cycle`.
    pub owner: String,
    /// `global`, `local`, `autograd` (saved for backward by the graph of a
    /// live value) or `cycle` (no root reaches it: freed at the next
    /// garbage collection, a delay, not a leak).
    pub kind: String,
    /// The container's type (`list`, `dict`, `lru_cache`), when the blocks
    /// are its elements.
    pub container: Option<String>,
    /// One full path, e.g. `train.history[39]`.
    pub example: String,
    /// The suspect's blocks it holds, and their bytes.
    pub blocks: u64,
    /// Their requested bytes.
    pub bytes: u64,
    /// How many more of the suspect's blocks it held a step, from the end
    /// of warm-up to the last checkpoint, when both said.
    pub blocks_per_step: Option<f64>,
}

impl HeldBy {
    /// Orders a site's owners as every report shows them: when some
    /// gained blocks since warm-up, only those (the ones that held the
    /// same all along, the line's first blocks say, are left out); the
    /// owner of more blocks first, then of more bytes, then by name.
    pub fn order(owners: &mut Vec<HeldBy>) {
        if owners
            .iter()
            .any(|h| h.blocks_per_step.is_some_and(|r| r > 0.0))
        {
            owners.retain(|h| h.blocks_per_step.is_some_and(|r| r > 0.0));
        }
        owners.sort_by(|a, b| {
            (b.blocks, b.bytes)
                .cmp(&(a.blocks, a.bytes))
                .then_with(|| a.owner.cmp(&b.owner))
        });
    }
}

/// Each site's owners in one dump, by stack key: what a fleet keeps of an
/// owners file (its tables hold no blocks).
pub type SiteOwners = FxHashMap<StackKey, Vec<HeldBy>>;

/// The owner blocks get when a complete search found none.
const UNOWNED: &str = "no live tensor (the allocator's cache, or C++ code)";

/// The owners of `snap`'s live blocks from `owners`, grouped site by site
/// (each block under the deepest container holding several of the site's
/// blocks). Where the search was complete, a block it found no owner for
/// is held by "no live tensor"; else it is left out.
pub fn owners_by_site(snap: &Snapshot, owners: &Owners) -> SiteOwners {
    let unowned = Owner {
        owner: UNOWNED.to_owned(),
        group: UNOWNED.to_owned(),
        container: None,
        kind: "unowned".to_owned(),
        groups: Vec::new(),
    };
    let keys = StackKeys::of_live_blocks(snap);
    let mut by_key: FxHashMap<StackKey, Vec<(&Owner, u64)>> = FxHashMap::default();
    for b in snap
        .device_segments()
        .flat_map(|s| &s.blocks)
        .filter(|b| is_live(b))
    {
        let owner = match owners.of(b.address) {
            Some(o) => o,
            None if owners.complete => &unowned,
            None => continue,
        };
        by_key
            .entry(keys.key(b.stack))
            .or_default()
            .push((owner, requested(b)));
    }
    by_key
        .into_iter()
        .map(|(key, blocks)| (key, group_site(&blocks)))
        .collect()
}

/// The owners of one site's blocks (each block's owner and bytes),
/// grouped: each block under the deepest container on its path that holds
/// another of the site's blocks too (`optimizer.param_groups` for blocks
/// in `param_groups[2]['params'][0]` and `param_groups[3]['params'][0]`),
/// else under the group the search gave it.
fn group_site(blocks: &[(&Owner, u64)]) -> Vec<HeldBy> {
    let mut shared: FxHashMap<&str, usize> = FxHashMap::default();
    for (o, _) in blocks {
        for (at, _) in &o.groups {
            *shared.entry(at).or_default() += 1;
        }
    }
    let mut groups: Vec<HeldBy> = Vec::new();
    for &(o, bytes) in blocks {
        let (name, container) = o
            .groups
            .iter()
            .rev()
            .find(|(at, _)| shared[at.as_str()] > 1)
            .map_or((&o.group, &o.container), |(at, container)| (at, container));
        let at = match groups.iter().position(|g| &g.owner == name) {
            Some(at) => at,
            None => {
                groups.push(HeldBy {
                    owner: name.clone(),
                    kind: o.kind.clone(),
                    container: container.clone(),
                    example: o.owner.clone(),
                    blocks: 0,
                    bytes: 0,
                    blocks_per_step: None,
                });
                groups.len() - 1
            }
        };
        groups[at].blocks += 1;
        groups[at].bytes += bytes;
    }
    groups
}

/// A culprit line: what a suspect's sites are matched by (sites whose
/// culprit is one line are one row, unless the rules ask for a row a
/// stack).
pub type CulpritLine = (crate::CulpritKind, String, String, u32);

/// The owners of the sites that `of_row` picks, added up by owner; with
/// the owners at the end of warm-up and the steps since, how many blocks
/// each gained a step; in [`HeldBy::order`].
fn held_by(
    last: &SiteOwners,
    at_warmup: Option<&SiteOwners>,
    steps: Option<u64>,
    of_row: &mut dyn FnMut(StackKey) -> bool,
) -> Vec<HeldBy> {
    let mut merged_of = |owners: &SiteOwners| {
        let mut merged: Vec<HeldBy> = Vec::new();
        let mut keys: Vec<&StackKey> = owners.keys().collect();
        // The same example whatever the map's order.
        keys.sort_unstable();
        for key in keys {
            if !of_row(*key) {
                continue;
            }
            for h in &owners[key] {
                match merged.iter_mut().find(|m| m.owner == h.owner) {
                    Some(m) => {
                        m.blocks += h.blocks;
                        m.bytes += h.bytes;
                    }
                    None => merged.push(h.clone()),
                }
            }
        }
        merged
    };
    let mut held = merged_of(last);
    if let (Some(earlier), Some(steps)) = (at_warmup, steps) {
        let then = merged_of(earlier);
        for h in &mut held {
            let before = then
                .iter()
                .find(|t| t.owner == h.owner)
                .map_or(0, |t| t.blocks);
            h.blocks_per_step = Some((h.blocks as f64 - before as f64) / steps as f64);
        }
    }
    HeldBy::order(&mut held);
    held
}

/// Whether site `key` is of the row `site` stands for: its culprit line's
/// (found by `line_of`), or with a row a stack its own key.
fn of_row_matcher<'a>(
    site: &'a Site,
    rules: &'a CulpritRules,
    line_of: &'a mut dyn FnMut(StackKey) -> Option<CulpritLine>,
) -> impl FnMut(StackKey) -> bool + 'a {
    let line = culprit_line(site);
    move |key| {
        if rules.rows_by_stack() {
            key == site.key
        } else {
            line_of(key).as_ref() == Some(&line)
        }
    }
}

/// Fills in the `held_by` of each row (a site, and where its owners go)
/// from the owners at the last checkpoint and, when known, at an earlier
/// one `steps` before (for how many blocks each owner gained a step):
/// what `trend`'s suspects, `compare`'s sites that grew and `summary`'s
/// top sites are each given. `line_of` gives the culprit line of a site
/// key of either.
pub(crate) fn fill<'r>(
    rows: impl Iterator<Item = (&'r Site, &'r mut Vec<HeldBy>)>,
    last: &SiteOwners,
    earlier: Option<&SiteOwners>,
    steps: Option<u64>,
    rules: &CulpritRules,
    mut line_of: impl FnMut(StackKey) -> Option<CulpritLine>,
) {
    for (site, held) in rows {
        let mut of_row = of_row_matcher(site, rules, &mut line_of);
        *held = held_by(last, earlier, steps, &mut of_row);
    }
}

/// The culprit lines of the live sites of some snapshots, described once
/// each: what [`Comparison::add_held_by`](crate::Comparison::add_held_by) and
/// [`Summary::add_held_by`](crate::Summary::add_held_by) match the sites of
/// owners files by.
pub struct SiteLines<'a> {
    rules: &'a CulpritRules,
    stacks: FxHashMap<StackKey, (&'a Snapshot, Option<StackId>)>,
    lines: FxHashMap<StackKey, CulpritLine>,
}

impl<'a> SiteLines<'a> {
    /// The live sites of `snaps`, each described from the first of them
    /// that holds it.
    pub fn new(snaps: &[&'a Snapshot], rules: &'a CulpritRules) -> SiteLines<'a> {
        let mut stacks = FxHashMap::default();
        for &snap in snaps {
            let keys = StackKeys::of_live_blocks(snap);
            for b in snap
                .device_segments()
                .flat_map(|s| &s.blocks)
                .filter(|b| is_live(b))
            {
                stacks.entry(keys.key(b.stack)).or_insert((snap, b.stack));
            }
        }
        SiteLines {
            rules,
            stacks,
            lines: FxHashMap::default(),
        }
    }

    /// The culprit line of site `key`, if it is one of theirs.
    pub fn line(&mut self, key: StackKey) -> Option<CulpritLine> {
        if let Some(line) = self.lines.get(&key) {
            return Some(line.clone());
        }
        let &(snap, stack) = self.stacks.get(&key)?;
        let line = culprit_line(&describe_site(snap, key, stack, self.rules));
        self.lines.insert(key, line.clone());
        Some(line)
    }
}
