//! A snapshot's summary as text: `snapdiff summary`.

use snapdiff_format::PINNED_HOST_DEVICE;
use std::io::{self, Write};

use snapdiff_analyze::Summary;
use snapdiff_format::visible;

use crate::TextOptions;
use crate::text::{add_rows, write_table};
use crate::text::{
    align_right, count, paths_base, paths_note, site_cell, size, table, where_stacks_differ,
};

/// `summary` of `file` as `snapdiff summary` prints it; `source` and
/// `producer` are what the file says made it.
pub fn write_text(
    summary: &Summary,
    file: &str,
    source: Option<&str>,
    producer: &str,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let t = &summary.totals;
    writeln!(out, "{}", file)?;
    if let Some(source) = &source {
        let (source, producer) = (visible::escaped(source), visible::escaped(producer));
        writeln!(out, "  from {source}, recorded by {producer}")?;
    }
    let mut totals = table(options, ["", "bytes", ""]);
    totals.add_row(vec![
        "reserved".to_owned(),
        size(t.reserved_bytes),
        format!("{} segments", count(t.segments)),
    ]);
    totals.add_row(vec![
        "allocated".to_owned(),
        size(t.allocated_bytes),
        format!("{} blocks in all", count(t.blocks)),
    ]);
    totals.add_row(vec![
        "active".to_owned(),
        size(t.active_bytes),
        "allocated + pending free".to_owned(),
    ]);
    totals.add_row(vec![
        "requested".to_owned(),
        size(t.requested_bytes),
        "asked for by the program".to_owned(),
    ]);
    let f = &summary.fragmentation;
    totals.add_row(vec![
        "free in cache".to_owned(),
        size(f.free_bytes),
        format!("largest free block {}", size(f.largest_free_block)),
    ]);
    align_right(&mut totals, &[1]);
    write_table(out, "memory:", &totals)?;
    if let Some(host) = &summary.pinned_host {
        crate::pinned_host::write_one(host, out)?;
    }

    if !summary.pools.is_empty() {
        let mut pools = table(
            options,
            [
                "device",
                "pool",
                "stream",
                "segments",
                "reserved",
                "allocated",
                "active",
            ],
        );
        for p in &summary.pools {
            pools.add_row(vec![
                match p.device {
                    PINNED_HOST_DEVICE => "pinned host".to_owned(),
                    ordinal => ordinal.to_string(),
                },
                match (p.device, p.private_pool) {
                    // The host allocator has no size classes: PyTorch
                    // writes "small" for every one of its segments.
                    (PINNED_HOST_DEVICE, _) => "-".to_owned(),
                    (_, Some((a, b))) => format!("{}, private ({a}, {b})", p.pool),
                    (_, None) => p.pool.to_owned(),
                },
                p.stream.to_string(),
                count(p.totals.segments),
                size(p.totals.reserved_bytes),
                size(p.totals.allocated_bytes),
                size(p.totals.active_bytes),
            ]);
        }
        align_right(&mut pools, &[0, 2, 3, 4, 5, 6]);
        write_table(out, "by device, pool and stream:", &pools)?;
    }

    if !summary.top_sites.is_empty() {
        let mut sites = table(options, ["", "culprit", "blocks", "bytes", "share"]);
        let base = paths_base(
            summary.top_sites.iter().map(|s| &s.site),
            options.full_paths,
        );
        let shown: Vec<_> = summary.top_sites.iter().map(|s| &s.site).collect();
        let via = where_stacks_differ(&shown, &base);
        let mut rows = Vec::new();
        for (i, s) in summary.top_sites.iter().enumerate() {
            rows.push(vec![
                (i + 1).to_string(),
                site_cell(&s.site, options.frames, &base) + via[i].as_deref().unwrap_or(""),
                count(s.blocks),
                size(s.bytes),
                format!("{:.0}%", 100.0 * s.share),
            ]);
        }
        add_rows(&mut sites, rows, 1);
        align_right(&mut sites, &[0, 2, 3, 4]);
        write_table(out, "largest sites by live bytes:", &sites)?;
        paths_note(out, &base)?;
        let owners: Vec<&[snapdiff_analyze::HeldBy]> =
            summary.top_sites.iter().map(|s| &s.held_by[..]).collect();
        crate::held_by::write_held_by(&owners, "a step", "the snapshot", out)?;
    }

    write!(out, "{} trace events", summary.trace_events)?;
    let actions: Vec<String> = summary
        .actions
        .iter()
        .map(|(a, n)| format!("{} {n}", visible::escaped(a)))
        .collect();
    if !actions.is_empty() {
        write!(out, ": {}", actions.join(", "))?;
    }
    writeln!(out)?;
    if summary.actions.iter().any(|(a, _)| a == "oom") {
        writeln!(
            out,
            "note: the trace holds an out-of-memory error: snapdiff oom {} explains it",
            file
        )?;
    }
    Ok(())
}
