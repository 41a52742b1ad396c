//! "held by": what kept a site's blocks alive, as the process that held
//! them said (`capture --owners`), under the rows of `trend` and `compare`.

use std::io::{self, Write};

use snapdiff_analyze::HeldBy;

use crate::text::size;

/// Owners shown under each suspect; the rest are in `--json`.
const OWNERS_SHOWN: usize = 3;

/// What kept each row's blocks alive, when the process said (`capture
/// --owners`, the pytest plugin): the owner, its blocks and bytes, how many
/// more it held `per` ("a step", "since BEFORE"), and what an autograd
/// graph or a cycle means. Rows are numbered as their table numbers them;
/// `snapshot` says which snapshot's owners these are ("the last snapshot").
pub(crate) fn write_held_by(
    rows: &[&[HeldBy]],
    per: &str,
    snapshot: &str,
    out: &mut dyn Write,
) -> io::Result<()> {
    if rows.iter().all(|r| r.is_empty()) {
        return Ok(());
    }
    writeln!(
        out,
        "\nheld by (what kept them alive when {snapshot} was taken):"
    )?;
    for (n, held_by) in rows.iter().enumerate() {
        for (k, h) in held_by.iter().take(OWNERS_SHOWN).enumerate() {
            let number = if k == 0 {
                (n + 1).to_string()
            } else {
                String::new()
            };
            let owner = snapdiff_format::visible::escaped(&h.owner);
            let what = match &h.container {
                Some(c) => format!("{owner} (a {c})"),
                None => owner.into_owned(),
            };
            let rate = match h.blocks_per_step {
                Some(r) if r > 0.0 => format!(", {}", gained(r, per)),
                _ => String::new(),
            };
            writeln!(
                out,
                "{number:>3}  {what}: {} block{}, {}{rate}",
                h.blocks,
                if h.blocks == 1 { "" } else { "s" },
                size(h.bytes)
            )?;
            if h.example != h.owner {
                writeln!(
                    out,
                    "       e.g. {}",
                    snapdiff_format::visible::escaped(&h.example)
                )?;
            }
            match h.kind.as_str() {
                "autograd" => writeln!(
                    out,
                    "       saved for backward by that value's autograd graph: a value kept across \
                     steps keeps its graph, and the graph every step's saved tensors \
                     (keep .item() or .detach(), or evaluate under torch.no_grad())"
                )?,
                "unowned" => writeln!(
                    out,
                    "       no live tensor lies in them: the allocator keeps them cached, or C++ \
                     code holds them (not owned by the program's objects)"
                )?,
                "cycle" => writeln!(
                    out,
                    "       only a reference cycle holds them: freed at the next garbage \
                     collection (a delay, not a leak)"
                )?,
                _ => {}
            }
        }
    }
    Ok(())
}

/// Blocks gained `per` ("a step", "since BEFORE") in words: `+2 blocks a
/// step`; less than one a step as `+1 block every 2 steps`, never a
/// fraction of a block.
fn gained(rate: f64, per: &str) -> String {
    if per == "a step" && rate < 0.995 {
        let every = (1.0 / rate).round() as u64;
        return format!("+1 block every {every} steps");
    }
    let count = if (rate - rate.round()).abs() < 0.005 {
        format!("{}", rate.round() as i64)
    } else {
        format!("{rate:.2}")
    };
    let blocks = if count == "1" { "block" } else { "blocks" };
    format!("+{count} {blocks} {per}")
}
