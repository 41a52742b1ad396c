//! "Held by" for the command's reports: the owners files `capture`
//! (and the pytest plugin) wrote beside the snapshots read,
//! attributed by `snapdiff_analyze` as every report does.

use std::path::Path;

use snapdiff_analyze::held_by::{SiteLines, SiteOwners, owners_by_site};
use snapdiff_analyze::{Comparison, CulpritRules};
use snapdiff_format::{Snapshot, read_owners_beside};

/// What kept each live site of `snap` alive, from the owners file beside
/// `path`, when there is one.
pub(crate) fn by_site(path: &Path, snap: &Snapshot) -> Option<SiteOwners> {
    Some(owners_by_site(snap, &read_owners_beside(path)?))
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
    let Some(owners_after) = by_site(after.0, after.1) else {
        return;
    };
    let owners_before = by_site(before.0, before.1);
    let steps = match (before.1.meta.step, after.1.meta.step) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    let mut lines = SiteLines::new(&[after.1, before.1], rules);
    cmp.add_held_by(&owners_after, owners_before.as_ref(), steps, rules, |key| {
        lines.line(key)
    });
}
