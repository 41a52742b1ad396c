//! Steps as text: `snapdiff steps`.

use snapdiff_format::DeviceName;
use std::io::{self, Write};

use snapdiff_analyze::Steps;
use snapdiff_analyze::steps::{DeviceSteps, Step};

use crate::TextOptions;
use crate::text::{align_right, delta, paths_base, paths_note, site_cell, size, table};
use crate::text::{delta_colored, write_table};
use crate::trend::source_label;

/// `steps` of `file` as `snapdiff steps` prints it.
pub fn write_text(
    steps: &Steps,
    file: &str,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(out, "{file}")?;
    for device in &steps.devices {
        write_device(device, options, out)?;
    }
    for note in &steps.notes {
        // A note may quote the file (a marker's name): escaped.
        writeln!(out, "note: {}", snapdiff_format::visible::escaped(note))?;
    }
    Ok(())
}

fn write_device(d: &DeviceSteps, options: &TextOptions, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "{}: {} step{} ({})",
        DeviceName(d.device),
        d.steps.len(),
        if d.steps.len() == 1 { "" } else { "s" },
        source_label(d.source)
    )?;
    // The first and last steps when there are more than --top.
    let limit = options.top_limit();
    let (head, tail) = if d.steps.len() > limit {
        let tail = limit / 2;
        (&d.steps[..limit - tail], &d.steps[d.steps.len() - tail..])
    } else {
        (&d.steps[..], &d.steps[..0])
    };
    let mut t = table(
        options,
        [
            "step",
            "start",
            "peak",
            "allocated",
            "freed",
            "retained",
            "retained by",
        ],
    );
    // The sites the table names: of the steps that retained something.
    let sites: Vec<_> = head
        .iter()
        .chain(tail)
        .filter(|s| s.retained_bytes > 0)
        .flat_map(|s| s.retained_by.first())
        .map(|r| &r.site)
        .collect();
    let base = paths_base(sites.iter().copied(), options.full_paths);
    let row = |s: &Step| -> Vec<String> {
        let by = s
            .retained_by
            .first()
            .filter(|_| s.retained_bytes > 0)
            .map(|r| format!("{} ({})", site_cell(&r.site, 0, &base), delta(r.bytes)))
            .unwrap_or_default();
        vec![
            s.step.to_string(),
            size(s.start_bytes),
            size(s.peak_bytes),
            size(s.allocated_bytes),
            size(s.freed_bytes),
            delta_colored(s.retained_bytes, options.color),
            by,
        ]
    };
    for s in head {
        t.add_row(row(s));
    }
    if !tail.is_empty() {
        let hidden = d.steps.len() - head.len() - tail.len();
        let mut gap = vec![String::new(); 6];
        gap[0] = "...".to_owned();
        gap.push(format!("{hidden} more steps (--top 0 shows all)"));
        t.add_row(gap);
        for s in tail {
            t.add_row(row(s));
        }
    }
    align_right(&mut t, &[0, 1, 2, 3, 4, 5]);
    write_table(
        out,
        "each step: memory at its start and peak, and what it kept:",
        &t,
    )?;
    paths_note(out, &base)?;
    let retained: i64 = d.steps.iter().skip(1).map(|s| s.retained_bytes).sum();
    if d.steps.len() > 1 {
        writeln!(
            out,
            "after the first step: {} retained in all, the peak {} {}",
            delta(retained),
            if d.peak_growth >= 0 { "rose" } else { "fell" },
            size(d.peak_growth.unsigned_abs())
        )?;
    }
    if let Some(explained) = d.explained_by_growth {
        write!(
            out,
            "the sites that keep growing (snapdiff trend) gained {} over these steps",
            delta(explained)
        )?;
        if d.peak_growth > 0 {
            write!(
                out,
                ": {:.0}% of the peak's rise",
                100.0 * explained.max(0) as f64 / d.peak_growth as f64
            )?;
        }
        writeln!(out)?;
    }
    if let Some(detail) = &d.detail {
        writeln!(
            out,
            "step {}: what was live at its peak of {}",
            detail.step,
            size(detail.peak_bytes)
        )?;
        crate::peak::write_live(
            &detail.categories,
            &detail.sites,
            detail.peak_bytes,
            None,
            options,
            out,
        )?;
    }
    Ok(())
}
