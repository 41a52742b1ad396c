//! What `capture --owners` (and the pytest plugin) wrote beside a dump:
//! who kept each live block alive, by block address (written by
//! `python/snapdiff/hook/snapdiff_owners.py`). Reports show it as "held
//! by" under each suspect.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use snapdiff_analyze::{
    Comparison, CulpritRules, HeldBy, Site, StackKeys, Trend, TrendOptions, requested,
    suspect_blocks,
};
use snapdiff_fleet::SiteOwners;
use snapdiff_format::Snapshot;

/// An owners file: the owner of each block, keyed by its address.
#[derive(Debug, Deserialize)]
pub(crate) struct Owners {
    /// Whether the search ended before its time budget: only then is a
    /// block without an owner known to have none.
    #[serde(default)]
    complete: bool,
    #[serde(default)]
    blocks: HashMap<String, Owner>,
}

/// One block's owner.
#[derive(Debug, Deserialize)]
struct Owner {
    owner: String,
    group: String,
    container: Option<String>,
    kind: String,
    /// Every container on the block's path, outermost first: (the path
    /// to it, its type).
    #[serde(default)]
    groups: Vec<(String, Option<String>)>,
}

/// Owners files are small (a line per live block); a larger one is not read.
const MAX_BYTES: u64 = 256 << 20;

/// The owners file beside snapshot `path` (`NAME.owners.json` for
/// `NAME.pickle`), if there is one that reads.
pub(crate) fn beside(path: &Path) -> Option<Owners> {
    let owners: PathBuf = path.with_extension("owners.json");
    if std::fs::metadata(&owners).ok()?.len() > MAX_BYTES {
        return None;
    }
    serde_json::from_slice(&std::fs::read(owners).ok()?).ok()
}

/// The owners of one site's blocks (each block's owner and bytes),
/// grouped: each block under the deepest container on its path that holds
/// another of the site's blocks too (`optimizer.param_groups` for blocks
/// in `param_groups[2]['params'][0]` and `param_groups[3]['params'][0]`),
/// else under the group the search gave it.
fn group_site(blocks: &[(&Owner, u64)]) -> Vec<HeldBy> {
    let mut shared: HashMap<&str, usize> = HashMap::new();
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

/// What kept each site's live blocks of `snap` alive, from the owners file
/// beside `path`, for a fleet (which keeps sites, not snapshots).
pub(crate) fn by_site(path: &Path, snap: &Snapshot) -> Option<SiteOwners> {
    let owners = beside(path)?;
    let keys = StackKeys::of_live_blocks(snap);
    let mut by_key: HashMap<_, Vec<(&Owner, u64)>> = HashMap::new();
    for b in snap.segments.iter().flat_map(|s| &s.blocks) {
        if !b.state.is_active() {
            continue;
        }
        let Some(o) = owners.blocks.get(&b.address.to_string()) else {
            continue;
        };
        by_key
            .entry(keys.key(b.stack))
            .or_default()
            .push((o, requested(b)));
    }
    Some(
        by_key
            .into_iter()
            .map(|(key, blocks)| (key, group_site(&blocks)))
            .collect(),
    )
}

/// Fills in each suspect's `held_by` from the owners files beside the last
/// snapshot and the one at the end of warm-up, when there are: `paths` and
/// `snaps` are the trend's checkpoints, in its order.
pub(crate) fn add_held_by(
    trend: &mut Trend,
    paths: &[&Path],
    snaps: &[&Snapshot],
    options: &TrendOptions,
) {
    let (Some(&last_path), Some(&last_snap)) = (paths.last(), snaps.last()) else {
        return;
    };
    if trend.suspects.is_empty() {
        return;
    }
    let Some(last) = beside(last_path) else {
        return;
    };
    let sites: Vec<&Site> = trend.suspects.iter().map(|s| &s.site).collect();
    let last_blocks = suspect_blocks(last_snap, &sites, &options.rules);
    let warm = trend.warmup.min(paths.len() - 1);
    let first = beside(paths[warm])
        .map(|owners| (owners, suspect_blocks(snaps[warm], &sites, &options.rules)));
    let steps = match (
        trend.points.get(warm).and_then(|p| p.step),
        trend.points.last().and_then(|p| p.step),
    ) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    for (i, suspect) in trend.suspects.iter_mut().enumerate() {
        let before = first
            .as_ref()
            .map(|(owners, blocks)| (owners, &blocks[i][..]));
        suspect.held_by = held_by(&last_blocks[i], &last, before, steps);
    }
}

/// Fills in `held_by` of the comparison's sites that grew, from the owners
/// file beside AFTER, and beside BEFORE for how many blocks each gained a
/// step (when both record their step).
pub(crate) fn add_held_by_to_comparison(
    cmp: &mut Comparison,
    before: (&Path, &Snapshot),
    after: (&Path, &Snapshot),
    rules: &CulpritRules,
) {
    let Some(owners_after) = beside(after.0) else {
        return;
    };
    let grown: Vec<usize> = (0..cmp.groups.len())
        .filter(|&i| cmp.groups[i].delta_bytes > 0)
        .collect();
    let sites: Vec<&Site> = grown.iter().map(|&i| &cmp.groups[i].site).collect();
    let blocks_after = suspect_blocks(after.1, &sites, rules);
    let earlier = beside(before.0).map(|owners| (owners, suspect_blocks(before.1, &sites, rules)));
    let steps = match (before.1.meta.step, after.1.meta.step) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    for (k, &i) in grown.iter().enumerate() {
        let then = earlier
            .as_ref()
            .map(|(owners, blocks)| (owners, &blocks[k][..]));
        cmp.groups[i].held_by = held_by(&blocks_after[k], &owners_after, then, steps);
    }
}

/// The owners of `blocks` (address, bytes), grouped; with the owners at
/// the end of warm-up and the steps since, how many blocks each group
/// gained a step; in `HeldBy::order`.
fn held_by(
    blocks: &[(u64, u64)],
    owners: &Owners,
    before: Option<(&Owners, &[(u64, u64)])>,
    steps: Option<u64>,
) -> Vec<HeldBy> {
    let unowned = Owner {
        owner: "no live tensor (the allocator's cache, or C++ code)".to_owned(),
        group: "no live tensor (the allocator's cache, or C++ code)".to_owned(),
        container: None,
        kind: "unowned".to_owned(),
        groups: Vec::new(),
    };
    let owned = |owners: &'_ Owners, blocks: &[(u64, u64)]| -> Vec<HeldBy> {
        let mut found = Vec::new();
        for &(address, bytes) in blocks {
            match owners.blocks.get(&address.to_string()) {
                Some(o) => found.push((o, bytes)),
                None if owners.complete => found.push((&unowned, bytes)),
                None => {}
            }
        }
        group_site(&found)
    };
    let mut groups = owned(owners, blocks);
    if let (Some((earlier, earlier_blocks)), Some(steps)) = (before, steps) {
        let then = owned(earlier, earlier_blocks);
        for g in &mut groups {
            let before = then
                .iter()
                .find(|t| t.owner == g.owner)
                .map_or(0, |t| t.blocks);
            g.blocks_per_step = Some((g.blocks as f64 - before as f64) / steps as f64);
        }
    }
    HeldBy::order(&mut groups);
    groups
}
