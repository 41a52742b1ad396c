//! The comparison of two snapshots as text: `snapdiff compare`, and the
//! sites table of a failed leak check.

use std::io::{self, Write};

use snapdiff_analyze::{Change, Comparison, GroupDiff};

use crate::TextOptions;
use crate::text::{add_rows, delta_colored, write_table};
use crate::text::{
    align_right, count, paths_base, paths_note, site_cell, size, table, where_stacks_differ,
};

/// `cmp` of files `before` and `after` as `snapdiff compare` prints it: the
/// totals, the sites that changed, then the notes.
pub fn write_text(
    cmp: &Comparison,
    before: &str,
    after: &str,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    if cmp.runs.count == 2 {
        return write_two_runs(cmp, before, after, options, out);
    }
    writeln!(out, "{before} -> {after}")?;
    writeln!(
        out,
        "reserved {}, allocated {}",
        net(cmp.reserved_before, cmp.reserved_after, options),
        net(cmp.allocated_before, cmp.allocated_after, options)
    )?;
    if let Some(host) = &cmp.pinned_host {
        crate::pinned_host::write_change(host, options.color, out)?;
    }
    let grown = cmp.groups.iter().filter(|g| g.delta_bytes > 0).count();
    if grown == 0 {
        writeln!(out, "no site holds more live memory after than before")?;
    } else {
        writeln!(
            out,
            "{} more live memory in {grown} site{} (bytes the program requested; the \
             allocator's rounding is not counted)",
            size(cmp.leaked_bytes),
            if grown == 1 { "" } else { "s" }
        )?;
    }
    let rounding = cmp
        .groups
        .iter()
        .filter(|g| g.change == Change::Rounding)
        .count();
    if rounding > 0 {
        writeln!(
            out,
            "{rounding} site{} kept the same blocks, rounded to other sizes (allocator slack, not a leak)",
            if rounding == 1 { "" } else { "s" }
        )?;
    }
    write_sites(&cmp.groups, cmp.leaked_bytes, options, out)?;
    crate::private_pools::write_idle(&cmp.idle_private_pools, out)?;
    for note in &cmp.notes {
        // A note may quote the file (a marker's name): escaped.
        writeln!(out, "note: {}", snapdiff_format::visible::escaped(note))?;
    }
    Ok(())
}

/// `a -> b (change)`, the change coloured.
fn net(a: u64, b: u64, options: &TextOptions) -> String {
    format!(
        "{} -> {} ({})",
        size(a),
        size(b),
        delta_colored(b as i64 - a as i64, options.color)
    )
}

/// `cmp` of two runs: what the change did to memory in all first (net
/// allocated and reserved), then how it splits over the sites that grew
/// and those that shrank, every site by the size of its change.
fn write_two_runs(
    cmp: &Comparison,
    before: &str,
    after: &str,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{before} -> {after}: two runs ({}), compared site by site",
        snapdiff_format::visible::escaped(&cmp.runs.told_by)
    )?;
    write!(
        out,
        "allocated {}, reserved {}",
        net(cmp.allocated_before, cmp.allocated_after, options),
        net(cmp.reserved_before, cmp.reserved_after, options)
    )?;
    if let (Some(a), Some(b)) = (cmp.peak_before, cmp.peak_after) {
        write!(out, ", peak {}", net(a, b, options))?;
    }
    writeln!(out)?;
    if let Some(host) = &cmp.pinned_host {
        crate::pinned_host::write_change(host, options.color, out)?;
    }
    let part = |changes: &snapdiff_analyze::SiteChanges, sign: i64, none: &str| match changes.sites
    {
        0 => none.to_owned(),
        n => format!(
            "{} in {n} site{}",
            delta_colored(sign * changes.bytes as i64, options.color),
            if n == 1 { "" } else { "s" }
        ),
    };
    match (cmp.grown.sites, cmp.shrunk.sites) {
        (0, 0) => writeln!(out, "every site holds the same live memory in both runs")?,
        _ => writeln!(
            out,
            "{}, {} (bytes the program requested; the allocator's rounding is not counted)",
            part(&cmp.grown, 1, "no site grew"),
            part(&cmp.shrunk, -1, "none shrank"),
        )?,
    }
    write_table_of_sites(
        &cmp.groups,
        cmp.leaked_bytes,
        "live memory by site, first run -> second (largest change first):",
        options,
        out,
    )?;
    crate::private_pools::write_idle(&cmp.idle_private_pools, out)?;
    for note in &cmp.notes {
        writeln!(out, "note: {}", snapdiff_format::visible::escaped(note))?;
    }
    Ok(())
}

/// The table of sites whose live memory changed, largest growth first, at
/// most `options.top` of them; `leaked` is the growth of all together, which
/// each row's share is of.
pub fn write_sites(
    groups: &[GroupDiff],
    leaked: u64,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    write_table_of_sites(
        groups,
        leaked,
        "live memory by site, before -> after (growth first):",
        options,
        out,
    )
}

/// [`write_sites`] under `title`.
fn write_table_of_sites(
    groups: &[GroupDiff],
    leaked: u64,
    title: &str,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    if groups.is_empty() {
        return Ok(());
    }
    let mut t = table(
        options,
        ["", "culprit", "blocks", "bytes", "delta", "share"],
    );
    let shown = &groups[..groups.len().min(options.top_limit())];
    let base = paths_base(shown.iter().map(|g| &g.site), options.full_paths);
    let via = where_stacks_differ(&shown.iter().map(|g| &g.site).collect::<Vec<_>>(), &base);
    let mut rows = Vec::new();
    for (i, g) in shown.iter().enumerate() {
        let share = if g.delta_bytes > 0 && leaked > 0 {
            format!("{:.0}%", 100.0 * g.delta_bytes as f64 / leaked as f64)
        } else {
            String::new()
        };
        let mut bytes = format!("{} -> {}", size(g.bytes_before), size(g.bytes_after));
        let rounded = g.allocated_before != g.bytes_before || g.allocated_after != g.bytes_after;
        if rounded {
            bytes.push_str(&format!(
                "\nallocated {} -> {}",
                size(g.allocated_before),
                size(g.allocated_after)
            ));
        }
        let change = if g.change == Change::Rounding {
            "rounding".to_owned()
        } else {
            delta_colored(g.delta_bytes, options.color)
        };
        rows.push(vec![
            (i + 1).to_string(),
            site_cell(&g.site, options.frames, &base)
                + via[i].as_deref().unwrap_or("")
                + &moved_from(g, &base),
            format!("{} -> {}", count(g.blocks_before), count(g.blocks_after)),
            bytes,
            change,
            share,
        ]);
    }
    add_rows(&mut t, rows, 1);
    align_right(&mut t, &[0, 2, 3, 4, 5]);
    write_table(out, title, &t)?;
    paths_note(out, &base)?;
    let owners: Vec<&[snapdiff_analyze::HeldBy]> = shown.iter().map(|g| &g.held_by[..]).collect();
    crate::held_by::write_held_by(&owners, "a step", "the last snapshot", out)?;
    if groups.len() > shown.len() {
        writeln!(
            out,
            "... and {} more sites (--top N shows more, --top 0 all)",
            groups.len() - shown.len()
        )?;
    }
    Ok(())
}

/// The line under a site whose code moved between two runs: where it was
/// (`moved from train.py:12`).
fn moved_from(g: &GroupDiff, base: &str) -> String {
    match &g.moved_from {
        Some(from) => format!("\n  moved from {}", from.culprit.display_from(base)),
        None => String::new(),
    }
}
