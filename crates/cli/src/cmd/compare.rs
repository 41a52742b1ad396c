//! `snapdiff compare BEFORE AFTER`.

use std::io::Write;

use snapdiff_analyze::compare::Change;
use snapdiff_analyze::{CompareOptions, compare};
use snapdiff_format::Parts;

use crate::args::CompareArgs;
use crate::exit::Exit;
use crate::json;
use crate::processes::process_of_snapshot;
use crate::render::{self, align_right, delta, size, table};

/// Files up to this size together are read at the same time, on two
/// threads. Larger ones are read one after the other: a pickle's reading
/// takes several times its size for a moment, and two at once would double
/// that peak (the state kept after reading is far smaller).
const TOGETHER_BYTES: u64 = 128 << 20;

/// The top-level entry point for `snapdiff compare`.
pub(crate) fn run(args: CompareArgs) -> anyhow::Result<Exit> {
    let rules = render::rules(&args.report)?;
    // The comparison is of the state at dump time: the trace is not needed.
    let read = |path| render::read_parts(path, Parts::WithoutEvents);
    let file_size = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |m| m.len());
    let (before, after) = if file_size(&args.before) + file_size(&args.after) <= TOGETHER_BYTES {
        std::thread::scope(|s| {
            let a = s.spawn(|| read(&args.before));
            let b = read(&args.after);
            (a.join().expect("reader thread"), b)
        })
    } else {
        let before = read(&args.before);
        render::return_freed_memory();
        (before, read(&args.after))
    };
    let (before, after) = (before?, after?);
    let mut options = CompareOptions::default();
    options.rules = rules;
    let mut cmp = compare(&before, &after, &options);
    let mut pair = [(&args.before, before), (&args.after, after)];
    let writers = crate::manifest::describe(&mut pair);
    let [(_, before), (_, after)] = pair;
    let process_a = process_of_snapshot(&args.before, &before, writers[0].as_deref());
    let process_b = process_of_snapshot(&args.after, &after, writers[1].as_deref());
    if !process_a.is_empty() && !process_b.is_empty() && process_a != process_b {
        cmp.notes.push(format!(
            "the two files are from different processes ({process_a}, {process_b}): what one \
             holds more than the other is not growth of one job"
        ));
    }
    render::release([before, after]);
    let exit = match args.fail_over {
        Some(limit) if cmp.leaked_bytes > limit => {
            eprintln!(
                "snapdiff: {} leaked, over the {} limit (--fail-over)",
                size(cmp.leaked_bytes),
                size(limit)
            );
            Exit::OverThreshold
        }
        _ => Exit::Clean,
    };
    if args.report.json {
        json::print(&cmp, args.report.top)?;
        return Ok(exit);
    }

    let mut out = render::text_out();
    writeln!(out, "{} -> {}", args.before.display(), args.after.display())?;
    writeln!(
        out,
        "reserved {} -> {} ({}), allocated {} -> {} ({})",
        size(cmp.reserved_before),
        size(cmp.reserved_after),
        delta(cmp.reserved_after as i64 - cmp.reserved_before as i64),
        size(cmp.allocated_before),
        size(cmp.allocated_after),
        delta(cmp.allocated_after as i64 - cmp.allocated_before as i64),
    )?;
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
    if !cmp.groups.is_empty() {
        let mut t = table(["", "culprit", "blocks", "bytes", "delta", "share"]);
        let shown = &cmp.groups[..cmp.groups.len().min(args.report.top_limit())];
        let base = render::paths_base(shown.iter().map(|g| &g.site), &args.report);
        for (i, g) in shown.iter().enumerate() {
            let share = if g.delta_bytes > 0 && cmp.leaked_bytes > 0 {
                format!(
                    "{:.0}%",
                    100.0 * g.delta_bytes as f64 / cmp.leaked_bytes as f64
                )
            } else {
                String::new()
            };
            let mut bytes = format!("{} -> {}", size(g.bytes_before), size(g.bytes_after));
            let rounded =
                g.allocated_before != g.bytes_before || g.allocated_after != g.bytes_after;
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
                delta(g.delta_bytes)
            };
            t.add_row(vec![
                (i + 1).to_string(),
                render::site_cell(&g.site, args.report.frames, &base),
                format!(
                    "{} -> {}",
                    render::count(g.blocks_before),
                    render::count(g.blocks_after)
                ),
                bytes,
                change,
                share,
            ]);
        }
        align_right(&mut t, &[0, 2, 3, 4, 5]);
        writeln!(out, "{t}")?;
        render::paths_note(&mut out, &base)?;
        if cmp.groups.len() > shown.len() {
            writeln!(
                out,
                "... and {} more sites (--top N shows more, --top 0 all)",
                cmp.groups.len() - shown.len()
            )?;
        }
    }
    for note in &cmp.notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(exit)
}
