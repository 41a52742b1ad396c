//! What a run of checkpoints kept, site by site: the rule of a leak check.
//!
//! A site kept memory when the least it holds from the last checkpoint on
//! is more than the least it holds from the end of warm-up on (the floors
//! of [`trend`](crate::trend_snapshots)): activations that come and go
//! between checkpoints do not count, and neither does what warm-up
//! allocates once.

use snapdiff_format::Snapshot;

use crate::compare::rows_by_culprit;
use crate::culprit::CulpritRules;
use crate::group::{Site, SiteNamer, live_groups};
use crate::site_diff::{Change, GroupDiff};
use crate::stack_key::{StackKey, StackKeys};
use crate::trend::floor_of;

/// The sites that kept memory over `points` (oldest first), the first
/// `warmup` after the first being warm-up, for which `keep` says yes: each
/// a row from the end of warm-up to the end, by culprit line (or by whole
/// stack, as `rules` say), most kept first.
///
/// ```
/// use snapdiff_analyze::{CulpritRules, kept_since};
/// let same = vec![snapdiff_format::Snapshot::default(); 3];
/// assert!(kept_since(&same, 1, &CulpritRules::default(), |_| true).is_empty());
/// ```
pub fn kept_since(
    points: &[Snapshot],
    warmup: usize,
    rules: &CulpritRules,
    keep: impl Fn(&Site) -> bool,
) -> Vec<GroupDiff> {
    let grouped: Vec<_> = points
        .iter()
        .map(|s| live_groups(s, &StackKeys::new(s)))
        .collect();
    let mut keys: Vec<StackKey> = grouped
        .iter()
        .flat_map(|g| g.totals.keys().copied())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let namers: Vec<SiteNamer> = points.iter().map(|s| SiteNamer::new(s, rules)).collect();
    let from = warmup.min(points.len().saturating_sub(1));
    let mut rows = Vec::new();
    for key in keys {
        let (bytes, blocks): (Vec<u64>, Vec<u64>) = grouped
            .iter()
            .map(|g| g.totals.get(&key).map_or((0, 0), |t| (t.bytes, t.blocks)))
            .unzip();
        let (floor, floor_blocks) = (floor_of(&bytes), floor_of(&blocks));
        let last = bytes.len().saturating_sub(1);
        let grown = floor[last].saturating_sub(floor[from]);
        if grown == 0 {
            continue;
        }
        // Described from the last snapshot that has the site.
        let (namer, stack) = namers
            .iter()
            .zip(&grouped)
            .rev()
            .find_map(|(n, g)| g.stacks.get(&key).map(|&stack| (n, stack)))
            .expect("the site is in some snapshot");
        let site = namer.site(key, stack);
        if !keep(&site) {
            continue;
        }
        let (before, after) = (floor[from], floor[last]);
        rows.push(GroupDiff {
            site,
            change: if before == 0 {
                Change::New
            } else {
                Change::Grown
            },
            blocks_before: floor_blocks[from],
            blocks_after: floor_blocks[last],
            bytes_before: before,
            bytes_after: after,
            delta_bytes: grown as i64,
            // The floors are of requested bytes; rounding is not what a
            // leak check is about.
            allocated_before: before,
            allocated_after: after,
            blocks_kept: 0,
            held_by: Vec::new(),
            moved_from: None,
        });
    }
    let mut rows = if rules.rows_by_stack() {
        rows
    } else {
        rows_by_culprit(rows)
    };
    rows.sort_by(|a, b| {
        b.delta_bytes
            .cmp(&a.delta_bytes)
            .then(a.site.key.cmp(&b.site.key))
    });
    rows
}
