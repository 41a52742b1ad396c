//! An out-of-memory error as text: `snapdiff oom`, and `capture` after a
//! job died of one.

use snapdiff_format::DeviceName;
use std::io::{self, Write};

use snapdiff_analyze::Oom;
use snapdiff_analyze::oom::DeviceOom;

use crate::TextOptions;
use crate::text::{paths_base, site_cell, size};

/// `oom` as `snapdiff oom` prints it, device by device, then the notes.
pub fn write_text(oom: &Oom, options: &TextOptions, out: &mut dyn Write) -> io::Result<()> {
    for device in &oom.devices {
        write_device(device, options, out)?;
    }
    for note in &oom.notes {
        // A note may quote the file (a marker's name): escaped.
        writeln!(out, "note: {}", snapdiff_format::visible::escaped(note))?;
    }
    Ok(())
}

fn write_device(o: &DeviceOom, options: &TextOptions, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "{}: out of memory asking for {} on stream {}, after event {} of {}{}",
        DeviceName(o.device),
        size(o.requested_bytes),
        o.stream,
        o.event_index,
        o.events,
        match o.errors {
            1 => String::new(),
            n => format!(" (the last of {n} such errors)"),
        }
    )?;
    if let Some(request) = &o.request {
        let base = paths_base([request], options.full_paths);
        writeln!(
            out,
            "  asked for by {}",
            site_cell(request, options.frames, &base).replace('\n', "\n  ")
        )?;
    }
    match (o.cache, o.usable, o.device_free) {
        (Some(cache), Some(usable), Some(device_free)) => {
            writeln!(
                out,
                "  free then: {} on the device, and {} in the allocator's cache in {} piece{}; \
                 of these, {} in {} piece{} could serve the request (its stream and pool), the \
                 largest {}",
                size(device_free),
                size(cache.bytes),
                cache.pieces,
                if cache.pieces == 1 { "" } else { "s" },
                size(usable.bytes),
                usable.pieces,
                if usable.pieces == 1 { "" } else { "s" },
                size(usable.largest)
            )?;
        }
        (_, _, Some(device_free)) => writeln!(
            out,
            "  free then: {} on the device (the allocator's cache is not known: the snapshot was \
             taken later)",
            size(device_free)
        )?,
        _ => {}
    }
    let free = o
        .cache
        .map(|c| c.bytes)
        .zip(o.device_free)
        .map(|(c, d)| c + d);
    match (o.fits_without_fragmentation, free) {
        (Some(true), Some(free)) => writeln!(
            out,
            "  fragmentation: {} was free in all, enough for the request, but in pieces too small \
             (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets free memory join up)",
            size(free)
        )?,
        (Some(false), Some(free)) => writeln!(
            out,
            "  the device was full: {} free in all, {} short of the request",
            size(free),
            size(o.requested_bytes.saturating_sub(free))
        )?,
        _ => {}
    }
    if let Some(leak) = o.grew.first() {
        let base = paths_base([&leak.site], options.full_paths);
        let growth: u64 = o.grew.iter().map(|s| s.growth_bytes).sum();
        writeln!(
            out,
            "  kept growing before the error: {} at {}{}",
            size(growth),
            site_cell(&leak.site, 1, &base).replace('\n', "\n  "),
            match o.grew.len() {
                1 => String::new(),
                n => format!(" and {} more sites (snapdiff trend shows them)", n - 1),
            }
        )?;
        // How fast, and so for how many steps it had been eating the room.
        let per_step: f64 = o.grew.iter().filter_map(|s| s.growth_per_step).sum();
        if per_step >= 1.0 {
            writeln!(
                out,
                "  it grew {} a step, for about {} steps",
                size(per_step.round() as u64),
                (growth as f64 / per_step).round() as u64
            )?;
        }
        match o.fits_without_growth {
            Some(true) => writeln!(out, "  without that growth the request would have fit")?,
            Some(false) => writeln!(
                out,
                "  even without that growth the request would not have fit"
            )?,
            None => {}
        }
    }
    writeln!(
        out,
        "what held the {} allocated then:",
        size(o.allocated_bytes)
    )?;
    let cache_bytes = o
        .reserved_bytes
        .map(|r| r.saturating_sub(o.allocated_bytes));
    crate::peak::write_live(
        &o.categories,
        &o.sites,
        o.allocated_bytes,
        cache_bytes,
        options,
        out,
    )
}
