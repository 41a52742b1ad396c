//! Sites that moved in the code between two runs: the same allocations,
//! reached by code whose lines shifted, whose file was moved or renamed, or
//! through another library frame. Two runs of two versions of a program
//! are compared site by site, and a site that only moved is one row with
//! its real change, not a new site and a gone one.
//!
//! Only a site that one run lacks can be paired, with one the other run
//! lacks: two sites that both exist in both runs are never paired. The
//! rules, tried in this order, each pairing one to one:
//!
//! 1. **Lines moved**: the same frames (function and file) in the same
//!    order, and within each file every line shifted by the same amount.
//! 2. **File moved or renamed**: the same function names in the same order
//!    (the stack's shape), files and lines free.
//! 3. **Same blocks**: the same number of blocks of the same bytes, whose
//!    stacks share their outer half (the caller's code), reached through
//!    another frame inside it (another operator, another library path).

use crate::group::SiteFrame;
use crate::site_diff::{Change, GroupDiff, Moved, MovedFrom};

/// Pairs the rows of `groups` that only the first run has with those only
/// the second has, where a rule above says they are one site moved: each
/// pair becomes one row (the second run's site, with the first run's
/// figures and [`GroupDiff::moved_from`]). Returns the rows, and how many
/// moved sites hold the same memory in both runs (left out of the rows).
pub(crate) fn match_moved(groups: Vec<GroupDiff>) -> (Vec<GroupDiff>, u64) {
    let only_first = |g: &GroupDiff| g.blocks_after == 0 && g.blocks_before > 0;
    let only_second = |g: &GroupDiff| g.blocks_before == 0 && g.blocks_after > 0;
    let (mut gone, rest): (Vec<GroupDiff>, Vec<GroupDiff>) =
        groups.into_iter().partition(|g| only_first(g));
    let (mut new, mut rows): (Vec<GroupDiff>, Vec<GroupDiff>) =
        rest.into_iter().partition(|g| only_second(g));
    let mut unchanged = 0;
    for how in [Moved::Lines, Moved::File, Moved::Path] {
        let mut i = 0;
        while i < new.len() {
            let found = gone.iter().position(|g| same_site(g, &new[i], how));
            match found {
                Some(j) => {
                    let row = joined(gone.remove(j), new.remove(i), how);
                    if row.delta_bytes == 0 && row.blocks_before == row.blocks_after {
                        unchanged += 1;
                    } else {
                        rows.push(row);
                    }
                }
                None => i += 1,
            }
        }
    }
    rows.extend(gone);
    rows.extend(new);
    (rows, unchanged)
}

/// Whether `first` (only in the first run) and `second` (only in the
/// second) are one site by rule `how`.
fn same_site(first: &GroupDiff, second: &GroupDiff, how: Moved) -> bool {
    let (a, b) = (&first.site.frames, &second.site.frames);
    if a.is_empty() || b.is_empty() {
        return false;
    }
    match how {
        // One frame says nothing of how the lines around it moved.
        Moved::Lines => {
            a.len() >= 2
                && a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| x.name == y.name && x.file == y.file)
                && a.iter().zip(b).any(|(x, y)| x.line != y.line)
                && shifted_alike(a, b)
        }
        Moved::File => {
            a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| x.name == y.name)
                && a.iter().zip(b).any(|(x, y)| x.file != y.file)
        }
        Moved::Path => {
            first.blocks_before == second.blocks_after
                && first.bytes_before == second.bytes_after
                && shared_callers(a, b) * 2 >= a.len().min(b.len())
        }
    }
}

/// Whether, file by file, every frame's line moved by the same amount.
fn shifted_alike(a: &[SiteFrame], b: &[SiteFrame]) -> bool {
    let mut shifts: Vec<(&str, i64)> = Vec::new();
    for (x, y) in a.iter().zip(b) {
        let shift = i64::from(y.line) - i64::from(x.line);
        match shifts.iter().find(|(file, _)| *file == x.file) {
            Some(&(_, s)) if s != shift => return false,
            Some(_) => {}
            None => shifts.push((&x.file, shift)),
        }
    }
    true
}

/// How many outermost frames two stacks (innermost first) share.
fn shared_callers(a: &[SiteFrame], b: &[SiteFrame]) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

/// One row of the site `first` was in the first run and `second` is in the
/// second.
fn joined(first: GroupDiff, mut second: GroupDiff, how: Moved) -> GroupDiff {
    second.blocks_before = first.blocks_before;
    second.bytes_before = first.bytes_before;
    second.allocated_before = first.allocated_before;
    second.delta_bytes = second.bytes_after as i64 - second.bytes_before as i64;
    second.change = match second.delta_bytes {
        d if d > 0 => Change::Grown,
        d if d < 0 => Change::Shrunk,
        _ if second.blocks_after > second.blocks_before => Change::Grown,
        _ if second.blocks_after < second.blocks_before => Change::Shrunk,
        _ => Change::Rounding,
    };
    second.moved_from = Some(MovedFrom {
        culprit: first.site.culprit,
        how,
    });
    second
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::culprit::{Culprit, CulpritKind};
    use crate::group::Site;
    use crate::stack_key::StackKey;

    fn frame(name: &str, file: &str, line: u32) -> SiteFrame {
        SiteFrame {
            name: name.into(),
            file: file.into(),
            line,
        }
    }

    /// A row of `blocks` blocks of `bytes` in one run only.
    fn row(key: u64, frames: Vec<SiteFrame>, first: bool, blocks: u64, bytes: u64) -> GroupDiff {
        let culprit = Culprit {
            name: frames[0].name.clone(),
            file: frames[0].file.clone(),
            line: frames[0].line,
            kind: CulpritKind::User,
        };
        let (b0, b1) = if first { (blocks, 0) } else { (0, blocks) };
        let (y0, y1) = if first { (bytes, 0) } else { (0, bytes) };
        GroupDiff {
            site: Site {
                key: StackKey(key),
                culprit,
                frames,
                stacks: 1,
                recorded: Default::default(),
            },
            change: if first { Change::Freed } else { Change::New },
            blocks_before: b0,
            blocks_after: b1,
            bytes_before: y0,
            bytes_after: y1,
            delta_bytes: y1 as i64 - y0 as i64,
            allocated_before: y0,
            allocated_after: y1,
            blocks_kept: 0,
            held_by: Vec::new(),
            moved_from: None,
        }
    }

    #[test]
    fn lines_shifted_alike_are_one_site_and_unchanged_ones_are_counted() {
        let before = vec![frame("step", "train.py", 12), frame("main", "train.py", 40)];
        let after = vec![frame("step", "train.py", 14), frame("main", "train.py", 42)];
        let (rows, unchanged) = match_moved(vec![
            row(1, before.clone(), true, 3, 300),
            row(2, after.clone(), false, 3, 300),
        ]);
        assert_eq!((rows.len(), unchanged), (0, 1));
        // A real change at the moved line: one row with its delta.
        let (rows, _) = match_moved(vec![
            row(1, before, true, 3, 300),
            row(2, after, false, 3, 500),
        ]);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].delta_bytes, 200);
        let from = rows[0].moved_from.as_ref().unwrap();
        assert_eq!((from.culprit.line, from.how), (12, Moved::Lines));
    }

    #[test]
    fn lines_shifted_unalike_or_sites_on_both_sides_are_never_paired() {
        let before = vec![frame("step", "train.py", 12), frame("main", "train.py", 40)];
        let unalike = vec![frame("step", "train.py", 14), frame("main", "train.py", 45)];
        let (rows, unchanged) = match_moved(vec![
            row(1, before.clone(), true, 3, 300),
            row(2, unalike, false, 3, 301),
        ]);
        assert_eq!((rows.len(), unchanged), (2, 0));
        assert!(rows.iter().all(|r| r.moved_from.is_none()));
        // A site in both runs is never paired with another.
        let mut both = row(3, before.clone(), true, 3, 300);
        both.blocks_after = 1;
        both.bytes_after = 100;
        let moved = vec![frame("step", "train.py", 20), frame("main", "train.py", 48)];
        let (rows, _) = match_moved(vec![both, row(4, moved, false, 3, 300)]);
        assert!(rows.iter().all(|r| r.moved_from.is_none()), "{rows:#?}");
    }

    #[test]
    fn a_renamed_file_and_another_library_path_are_the_same_site() {
        let before = vec![
            frame("step", "/a/train.py", 12),
            frame("main", "/a/train.py", 40),
        ];
        let renamed = vec![
            frame("step", "/b/fit.py", 30),
            frame("main", "/b/fit.py", 3),
        ];
        let (rows, unchanged) = match_moved(vec![
            row(1, before.clone(), true, 2, 64),
            row(2, renamed, false, 2, 64),
        ]);
        assert_eq!((rows.len(), unchanged), (0, 1));
        let through = |op: &str| {
            vec![
                frame(op, "linear.py", 1),
                frame("forward", "model.py", 5),
                frame("main", "train.py", 9),
            ]
        };
        let (rows, unchanged) = match_moved(vec![
            row(1, through("addmm"), true, 337, 7 << 30),
            row(2, through("mm"), false, 337, 7 << 30),
        ]);
        assert_eq!((rows.len(), unchanged), (0, 1));
        // Other bytes through another frame: two sites.
        let (rows, _) = match_moved(vec![
            row(1, through("addmm"), true, 337, 7 << 30),
            row(2, through("mm"), false, 336, 7 << 30),
        ]);
        assert_eq!(rows.len(), 2);
    }
}
