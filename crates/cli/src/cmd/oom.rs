//! `snapdiff oom FILE`.

use std::io::Write;

use snapdiff_analyze::{OomOptions, oom};
use snapdiff_format::Snapshot;

use crate::args::{OomArgs, ReportArgs};
use crate::exit::Exit;

/// The top-level entry point for `snapdiff oom`.
pub(crate) fn run(args: OomArgs) -> anyhow::Result<Exit> {
    let snap = crate::input::read(&args.file)?;
    if args.report.json {
        // Plain stdout: JSON escapes control characters itself, and must
        // stay exact (the terminal writer's escapes are not JSON's).
        report(&snap, &args.report, &mut std::io::stdout().lock())?;
    } else {
        let mut out = crate::output::text_out();
        writeln!(out, "{}", crate::output::shown(&args.file))?;
        report(&snap, &args.report, &mut out)?;
    }
    crate::input::release([snap]);
    Ok(Exit::Clean)
}

/// The out-of-memory report of `snap`, as `oom` prints it and `capture`
/// prints it after a job died of one.
pub(crate) fn report(
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
