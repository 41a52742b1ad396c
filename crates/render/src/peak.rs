//! The peak as text: `snapdiff peak`, and what was live at a moment for
//! `oom` and `steps`.

use snapdiff_format::DeviceName;
use std::io::{self, Write};

use snapdiff_analyze::peak::{CategoryTotal, DevicePeak, PeakSite};
use snapdiff_analyze::{Category, Peak};

use crate::TextOptions;
use crate::text::{add_rows, write_table};
use crate::text::{
    align_right, count, paths_base, paths_note, site_cell_before, size, table, where_stacks_differ,
};

/// `peak` of `file` as `snapdiff peak` prints it.
pub fn write_text(
    peak: &Peak,
    file: &str,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(out, "{file}")?;
    for device in &peak.devices {
        write_device(device, options, out)?;
    }
    for note in &peak.notes {
        // A note may quote the file (a marker's name): escaped.
        writeln!(out, "note: {}", snapdiff_format::visible::escaped(note))?;
    }
    Ok(())
}

fn write_device(p: &DevicePeak, options: &TextOptions, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "{}: peak of {} allocated after event {} of {}",
        DeviceName(p.device),
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
    if !p.pools.is_empty() {
        let pools: Vec<String> = p
            .pools
            .iter()
            .map(|pool| match pool.pool_id {
                (0, 0) => format!("shared pool {}", size(pool.bytes)),
                (a, b) => format!("private pool ({a}, {b}) {}", size(pool.bytes)),
            })
            .collect();
        writeln!(out, "  live by pool: {}", pools.join(", "))?;
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
    write_live(
        &p.categories,
        &p.sites,
        p.allocated_bytes,
        p.cache_bytes,
        options,
        out,
    )
}

/// What was live at one moment: by category (with the allocator's cache
/// when known), then by site, each with its share of `allocated`.
pub fn write_live(
    categories: &[CategoryTotal],
    sites: &[PeakSite],
    allocated: u64,
    cache_bytes: Option<u64>,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let share = |bytes: u64| format!("{:.0}%", 100.0 * bytes as f64 / allocated.max(1) as f64);
    let mut by_category = table(options, ["what", "blocks", "bytes", "share"]);
    for c in categories {
        let mut what = c.category.label().to_owned();
        if c.before_recording_bytes > 0 && c.category != Category::BeforeRecording {
            what.push_str(&format!(
                "\n{} allocated before recording began",
                size(c.before_recording_bytes)
            ));
        }
        by_category.add_row(vec![what, count(c.blocks), size(c.bytes), share(c.bytes)]);
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
    write_table(out, "what was live, by what it is for:", &by_category)?;

    let shown = &sites[..sites.len().min(options.top_limit())];
    if shown.is_empty() {
        return Ok(());
    }
    let mut by_site = table(options, ["", "culprit", "what", "blocks", "bytes", "share"]);
    let base = paths_base(shown.iter().map(|s| &s.site), options.full_paths);
    let via = where_stacks_differ(&shown.iter().map(|s| &s.site).collect::<Vec<_>>(), &base);
    let mut rows = Vec::new();
    for (i, s) in shown.iter().enumerate() {
        rows.push(vec![
            (i + 1).to_string(),
            site_cell_before(&s.site, s.before_recording, options.frames, &base)
                + via[i].as_deref().unwrap_or(""),
            s.category.label().to_owned(),
            count(s.blocks),
            size(s.bytes),
            share(s.bytes),
        ]);
    }
    add_rows(&mut by_site, rows, 1);
    align_right(&mut by_site, &[0, 3, 4, 5]);
    write_table(out, "what was live, by site:", &by_site)?;
    paths_note(out, &base)?;
    if sites.len() > shown.len() {
        writeln!(
            out,
            "... and {} more sites (--top N shows more, --top 0 all)",
            sites.len() - shown.len()
        )?;
    }
    Ok(())
}
