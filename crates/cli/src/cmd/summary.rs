//! `snapdiff summary FILE`.

use std::io::Write;

use snapdiff_analyze::summarize;

use crate::args::SummaryArgs;
use crate::exit::Exit;
use crate::json;
use crate::render::{self, align_right, size, table};

/// The top-level entry point for `snapdiff summary`.
pub(crate) fn run(args: SummaryArgs) -> anyhow::Result<Exit> {
    let rules = render::rules(&args.report)?;
    let snap = render::read(&args.file)?;
    let summary = summarize(&snap, &rules, args.report.top_limit());
    let (source, producer) = (snap.meta.source.clone(), snap.meta.producer.clone());
    render::release([snap]);
    if args.report.json {
        json::print(&summary, args.report.top)?;
        return Ok(Exit::Clean);
    }
    let mut out = render::text_out();
    let t = &summary.totals;
    writeln!(out, "{}", args.file.display())?;
    if let Some(source) = &source {
        writeln!(out, "  from {source}, recorded by {producer}")?;
    }
    let mut totals = table(["", "bytes", ""]);
    totals.add_row(vec![
        "reserved".to_owned(),
        size(t.reserved_bytes),
        format!("{} segments", render::count(t.segments)),
    ]);
    totals.add_row(vec![
        "allocated".to_owned(),
        size(t.allocated_bytes),
        format!("{} blocks in all", render::count(t.blocks)),
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
    writeln!(out, "{totals}")?;

    if !summary.pools.is_empty() {
        let mut pools = table([
            "device",
            "pool",
            "stream",
            "segments",
            "reserved",
            "allocated",
            "active",
        ]);
        for p in &summary.pools {
            pools.add_row(vec![
                p.device.to_string(),
                p.pool.to_owned(),
                p.stream.to_string(),
                render::count(p.totals.segments),
                size(p.totals.reserved_bytes),
                size(p.totals.allocated_bytes),
                size(p.totals.active_bytes),
            ]);
        }
        align_right(&mut pools, &[0, 2, 3, 4, 5, 6]);
        writeln!(out, "{pools}")?;
    }

    if !summary.top_sites.is_empty() {
        let mut sites = table(["", "culprit", "blocks", "bytes", "share"]);
        let base = render::paths_base(summary.top_sites.iter().map(|s| &s.site), &args.report);
        for (i, s) in summary.top_sites.iter().enumerate() {
            sites.add_row(vec![
                (i + 1).to_string(),
                render::site_cell(&s.site, args.report.frames, &base),
                render::count(s.blocks),
                size(s.bytes),
                format!("{:.0}%", 100.0 * s.share),
            ]);
        }
        align_right(&mut sites, &[0, 2, 3, 4]);
        writeln!(out, "{sites}")?;
        render::paths_note(&mut out, &base)?;
    }

    write!(out, "{} trace events", summary.trace_events)?;
    let actions: Vec<String> = summary
        .actions
        .iter()
        .map(|(a, n)| format!("{a} {n}"))
        .collect();
    if !actions.is_empty() {
        write!(out, ": {}", actions.join(", "))?;
    }
    writeln!(out)?;
    if summary.actions.iter().any(|(a, _)| a == "oom") {
        writeln!(
            out,
            "note: the trace holds an out-of-memory error: snapdiff oom {} explains it",
            args.file.display()
        )?;
    }
    Ok(Exit::Clean)
}
