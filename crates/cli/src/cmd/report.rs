//! `snapdiff report FILE... -o report.html`.

use crate::args::ReportPageArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff report`.
pub(crate) fn run(args: ReportPageArgs) -> anyhow::Result<Exit> {
    let page = crate::report::page(&args.files)?;
    crate::pictures::write_output(&args.output, args.force, |out| {
        out.write_all(page.as_bytes())
    })?;
    Ok(Exit::Clean)
}
