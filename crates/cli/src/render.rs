//! Shared pieces of the human-readable output.

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};
use snapdiff_analyze::{Culprit, CulpritKind, CulpritRules, Site};
use std::io::Write;

pub(crate) use snapdiff_format::units::{format_delta as delta, format_size as size};

/// A table with snapdiff's look: header underlined, no inner grid.
pub(crate) fn table<I: IntoIterator<Item = &'static str>>(header: I) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    t
}

/// Right-aligns the given columns (numbers read better that way).
pub(crate) fn align_right(t: &mut Table, columns: &[usize]) {
    for &c in columns {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
}

/// Writes `value` as one line of JSON to stdout.
pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// The culprit rules that `--focus` and `--ignore` ask for.
pub(crate) fn rules(report: &crate::args::ReportArgs) -> anyhow::Result<CulpritRules> {
    Ok(CulpritRules::new(
        report.focus.as_deref(),
        report.ignore.as_deref(),
    )?)
}

/// A site for a table cell: its culprit, and `frames` more frames of its stack.
pub(crate) fn site_cell(site: &Site, frames: usize) -> String {
    let mut cell = site.culprit.display();
    if site.culprit.kind == CulpritKind::Fallback {
        cell.push_str("  (no frame of your code)");
    }
    let culprit_at = site.frames.iter().position(|f| {
        f.name == site.culprit.name && f.file == site.culprit.file && f.line == site.culprit.line
    });
    let below = culprit_at.map_or(0, |i| i + 1);
    for f in site.frames.iter().skip(below).take(frames) {
        let culprit = Culprit {
            name: f.name.clone(),
            file: f.file.clone(),
            line: f.line,
            kind: CulpritKind::User,
        };
        cell.push_str("\n  from ");
        cell.push_str(&culprit.display());
    }
    cell
}

/// A series of byte counts as a sparkline of at most 24 characters (long
/// series are shown by the maximum of each stretch).
pub(crate) fn sparkline(series: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    const WIDTH: usize = 24;
    let points: Vec<u64> = if series.len() <= WIDTH {
        series.to_vec()
    } else {
        (0..WIDTH)
            .map(|i| {
                let (a, b) = (i * series.len() / WIDTH, (i + 1) * series.len() / WIDTH);
                series[a..b.max(a + 1)].iter().copied().max().unwrap_or(0)
            })
            .collect()
    };
    let (lo, hi) = (
        points.iter().copied().min().unwrap_or(0),
        points.iter().copied().max().unwrap_or(0),
    );
    points
        .iter()
        .map(|&v| {
            if hi == lo {
                BARS[0]
            } else {
                BARS[((v - lo) as f64 / (hi - lo) as f64 * 7.0).round() as usize]
            }
        })
        .collect()
}

/// A duration in seconds for people: `45 s`, `12 min`, `3.5 h`, `2.1 days`.
pub(crate) fn duration(seconds: f64) -> String {
    if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else if seconds < 90.0 {
        format!("{seconds:.0} s")
    } else if seconds < 90.0 * 60.0 {
        format!("{:.0} min", seconds / 60.0)
    } else if seconds < 48.0 * 3600.0 {
        format!("{:.1} h", seconds / 3600.0)
    } else {
        format!("{:.1} days", seconds / 86400.0)
    }
}

/// Files at least this large get a spinner on stderr while they are read.
const PROGRESS_FROM_BYTES: u64 = 64 << 20;

/// Reads a snapshot file, showing a spinner on stderr for large files when
/// stderr is a terminal.
pub(crate) fn read(path: &std::path::Path) -> snapdiff_format::Result<snapdiff_format::Snapshot> {
    use std::io::IsTerminal;
    let large = std::fs::metadata(path).is_ok_and(|m| m.len() >= PROGRESS_FROM_BYTES);
    if !large || !std::io::stderr().is_terminal() {
        return snapdiff_format::read_path(path);
    }
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_message(format!("reading {}", path.display()));
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let result = snapdiff_format::read_path(path);
    spinner.finish_and_clear();
    result
}

/// Hands a loaded snapshot to the operating system instead of freeing it
/// piece by piece: the process exits right after printing, and dropping
/// millions of trace events one by one costs tens of milliseconds for nothing.
pub(crate) fn release(snapshots: impl IntoIterator<Item = snapdiff_format::Snapshot>) {
    for snap in snapshots {
        std::mem::forget(snap);
    }
}
