//! `snapdiff peak FILE`.

use std::io::Write;

use snapdiff_analyze::category::Category;
use snapdiff_analyze::peak::{CategoryTotal, DevicePeak, PeakOptions, PeakSite, peak};

use crate::args::{PeakArgs, ReportArgs};
use crate::exit::Exit;
use crate::json;
use crate::render::{self, align_right, size, table};

/// The top-level entry point for `snapdiff peak`.
pub(crate) fn run(args: PeakArgs) -> anyhow::Result<Exit> {
    let mut options = PeakOptions::default();
    options.rules = render::rules(&args.report)?;
    let snap = render::read(&args.file)?;
    let result = peak(&snap, &options);
    render::release([snap]);
    if args.report.json {
        json::print(&result, args.report.top)?;
        return Ok(Exit::Clean);
    }
    let mut out = render::text_out();
    writeln!(out, "{}", args.file.display())?;
    for device in &result.devices {
        print_device(device, &args, &mut out)?;
    }
    for note in &result.notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(Exit::Clean)
}

fn print_device(p: &DevicePeak, args: &PeakArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "device {}: peak of {} allocated after event {} of {}",
        p.device,
        size(p.allocated_bytes),
        p.event_index,
        p.events
    )?;
    if let (Some(reserved), Some(cache)) = (p.reserved_bytes, p.cache_bytes) {
        write!(
            out,
            "  {} reserved then, {} of it the allocator's cache",
            size(reserved),
            size(cache)
        )?;
        match p.highest_reserved {
            Some(h) if h.event_index != p.event_index => writeln!(
                out,
                "; reserved was highest, {}, after event {}",
                size(h.bytes),
                h.event_index
            )?,
            _ => writeln!(out)?,
        }
    }
    if let Some(g) = p.growth {
        writeln!(
            out,
            "  sites that keep growing (snapdiff trend shows them) held {} at the peak; they grew \
             {} after warm-up",
            size(g.held_bytes),
            size(g.growth_bytes)
        )?;
    }
    print_live(
        &p.categories,
        &p.sites,
        p.allocated_bytes,
        p.cache_bytes,
        &args.report,
        out,
    )
}

/// What was live at one moment: by category (with the allocator's cache
/// when known), then by site, each with its share of `allocated`.
pub(crate) fn print_live(
    categories: &[CategoryTotal],
    sites: &[PeakSite],
    allocated: u64,
    cache_bytes: Option<u64>,
    report: &ReportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let share = |bytes: u64| format!("{:.0}%", 100.0 * bytes as f64 / allocated.max(1) as f64);
    let mut by_category = table(["what", "blocks", "bytes", "share"]);
    for c in categories {
        let mut what = c.category.label().to_owned();
        if c.before_recording_bytes > 0 && c.category != Category::BeforeRecording {
            what.push_str(&format!(
                "\n{} allocated before recording began",
                size(c.before_recording_bytes)
            ));
        }
        by_category.add_row(vec![
            what,
            render::count(c.blocks),
            size(c.bytes),
            share(c.bytes),
        ]);
    }
    if let Some(cache) = cache_bytes {
        by_category.add_row(vec![
            "allocator cache (reserved, not allocated)".to_owned(),
            String::new(),
            size(cache),
            String::new(),
        ]);
    }
    align_right(&mut by_category, &[1, 2, 3]);
    writeln!(out, "{by_category}")?;

    let shown = &sites[..sites.len().min(report.top_limit())];
    if shown.is_empty() {
        return Ok(());
    }
    let mut by_site = table(["", "culprit", "what", "blocks", "bytes", "share"]);
    let base = render::paths_base(shown.iter().map(|s| &s.site), report);
    for (i, s) in shown.iter().enumerate() {
        by_site.add_row(vec![
            (i + 1).to_string(),
            render::site_cell_before(&s.site, s.before_recording, report.frames, &base),
            s.category.label().to_owned(),
            render::count(s.blocks),
            size(s.bytes),
            share(s.bytes),
        ]);
    }
    align_right(&mut by_site, &[0, 3, 4, 5]);
    writeln!(out, "{by_site}")?;
    render::paths_note(out, &base)?;
    if sites.len() > shown.len() {
        writeln!(
            out,
            "... and {} more sites (--top N shows more, --top 0 all)",
            sites.len() - shown.len()
        )?;
    }
    Ok(())
}
