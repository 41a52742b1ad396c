//! The reports more than one command prints: what a job wrote and a
//! process's trend (`capture`, `demo`), and an out-of-memory dump (`oom`,
//! `capture`).

use std::io::Write;
use std::path::{Path, PathBuf};

use snapdiff_analyze::{OomOptions, Trend, TrendOptions, oom};
use snapdiff_format::Snapshot;
use snapdiff_render::trend::write_text;

use crate::args::ReportArgs;
use crate::job::Captured;

/// The trend report of `files` with default options, as `capture` and `demo`
/// show it (capture has told processes apart by their files' names already).
/// Returns the verdict, or `None` when no file could be read.
pub(crate) fn trend(
    files: &[PathBuf],
    report: &ReportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<Option<Trend>> {
    let mut options = TrendOptions::default();
    options.rules = report.rules()?;
    let Some(trend) = crate::judging::files::judge_one_process(files, &options)? else {
        return Ok(None);
    };
    if report.json {
        snapdiff_render::json::write(out, &trend, report.top)?;
    } else {
        write_text(&trend, &report.text(), out)?;
    }
    Ok(Some(trend))
}

/// The out-of-memory report of `snap`, as `oom` prints it and `capture`
/// prints it after a job died of one.
pub(crate) fn oom_dump(
    snap: &Snapshot,
    report: &ReportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut options = OomOptions::default();
    options.rules = report.rules()?;
    let result = oom(snap, &options);
    if report.json {
        snapdiff_render::json::write(out, &result, report.top)?;
    } else {
        snapdiff_render::oom::write_text(&result, &report.text(), out)?;
    }
    Ok(())
}

/// Lists what the job wrote in `dir`, or says plainly that it wrote nothing
/// (drawn by `snapdiff-render`).
pub(crate) fn captured(out: &mut dyn Write, dir: &Path, captured: &Captured) -> anyhow::Result<()> {
    let folder = dir.display().to_string();
    let dumps = snapdiff_render::capture::Dumps {
        folder: &folder,
        snapshots: captured
            .snapshots
            .iter()
            .map(|p| {
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect(),
        abandoned: captured.abandoned,
        lost: &captured.failed,
        nothing_because: captured.nothing_because.as_deref(),
        held: captured.held,
    };
    snapdiff_render::capture::write_dumps(&dumps, out)?;
    Ok(())
}
