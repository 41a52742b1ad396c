//! `snapdiff check` as text: what rose over the tolerance, named by line,
//! then the peak's change site by site.

use std::io::{self, Write};

use snapdiff_analyze::baseline::{Check, Over, Tolerance};
use snapdiff_format::units::{format_delta, format_size};
use snapdiff_format::visible::escaped;

/// Sites of the peak's change listed under the verdict.
const CHANGED_SHOWN: usize = 5;

/// Writes `check` of a run against the baseline file `baseline`.
pub fn write_check(
    check: &Check,
    baseline: &str,
    tolerance: Tolerance,
    out: &mut dyn Write,
) -> io::Result<()> {
    let allowed = allowed(tolerance);
    match check.over.len() {
        0 => writeln!(
            out,
            "within {baseline}: nothing rose by more than {allowed}"
        )?,
        n => {
            writeln!(
                out,
                "over {baseline}: {n} figure{} rose by more than {allowed}:",
                if n == 1 { "" } else { "s" }
            )?;
            for o in &check.over {
                writeln!(out, "  {}", line_of(o))?;
            }
        }
    }
    if !check.changed.is_empty() {
        writeln!(out, "the peak's change, site by site (largest first):")?;
        for o in check.changed.iter().take(CHANGED_SHOWN) {
            writeln!(out, "  {}", line_of(o))?;
        }
        if check.changed.len() > CHANGED_SHOWN {
            writeln!(
                out,
                "  ... and {} more sites",
                check.changed.len() - CHANGED_SHOWN
            )?;
        }
    }
    Ok(())
}

/// `check` as a Markdown table, for a CI job's summary: the verdict, then
/// each figure over the tolerance and the peak's largest changes.
pub fn write_check_markdown(
    check: &Check,
    baseline: &str,
    tolerance: Tolerance,
    out: &mut dyn Write,
) -> io::Result<()> {
    let allowed = allowed(tolerance);
    let cell = |text: &str| escaped(text).replace('|', "\\|");
    match check.over.len() {
        0 => writeln!(
            out,
            "**Memory within `{}`**: nothing rose by more than {allowed}.",
            cell(baseline)
        )?,
        n => writeln!(
            out,
            "**Memory over `{}`**: {n} figure{} rose by more than {allowed}.",
            cell(baseline),
            if n == 1 { "" } else { "s" }
        )?,
    }
    let rows: Vec<(&str, &Over)> = check
        .over
        .iter()
        .map(|o| ("over", o))
        .chain(
            check
                .changed
                .iter()
                .take(CHANGED_SHOWN)
                .map(|o| ("changed", o)),
        )
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(out, "\n| | what | baseline | now | change |")?;
    writeln!(out, "|---|---|---:|---:|---:|")?;
    for (kind, o) in rows {
        let what = what(o, |line| format!("`{}`", cell(line)));
        writeln!(
            out,
            "| {kind} | {what} | {} | {} | {} |",
            format_size(o.before),
            format_size(o.now),
            format_delta(o.now as i64 - o.before as i64)
        )?;
    }
    Ok(())
}

/// What a tolerance lets rise: `5% and 1.00 MiB`.
fn allowed(tolerance: Tolerance) -> String {
    format!(
        "{:.0}% and {}",
        100.0 * tolerance.share,
        format_size(tolerance.bytes)
    )
}

/// What figure `o` is, its site's line shown by `shown`.
fn what(o: &Over, shown: impl Fn(&str) -> String) -> String {
    match o.figure {
        "peak_allocated" => format!("device {} peak allocated", o.device),
        "peak_reserved" => format!("device {} peak reserved", o.device),
        "kept_bytes" => format!("{} kept growing after warm-up", shown(&o.line)),
        _ => format!("{} at the peak", shown(&o.line)),
    }
}

/// One figure: what it is, before -> now (the change, the share).
fn line_of(o: &Over) -> String {
    let what = what(o, |line| format!("{} ", escaped(line)));
    let delta = o.now as i64 - o.before as i64;
    let share = match o.before {
        0 => "new".to_owned(),
        before => format!("{:+.0}%", 100.0 * delta as f64 / before as f64),
    };
    let was = match o.was.as_str() {
        "" => String::new(),
        was => format!(" (was {})", escaped(was)),
    };
    format!(
        "{what}: {} -> {} ({}, {share}){was}",
        format_size(o.before),
        format_size(o.now),
        format_delta(delta)
    )
}
