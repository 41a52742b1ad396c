//! `snapdiff oom FILE`.

use std::io::Write;

use crate::args::OomArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff oom`.
pub(crate) fn run(args: OomArgs) -> anyhow::Result<Exit> {
    let snap = crate::input::read(&args.file)?;
    if args.report.json {
        // Plain stdout: JSON escapes control characters itself, and must
        // stay exact (the terminal writer's escapes are not JSON's).
        crate::reports::oom_dump(&snap, &args.report, &mut std::io::stdout().lock())?;
    } else {
        let mut out = crate::output::text_out();
        writeln!(out, "{}", crate::output::shown(&args.file))?;
        crate::reports::oom_dump(&snap, &args.report, &mut out)?;
    }
    crate::input::release([snap]);
    Ok(Exit::Clean)
}
