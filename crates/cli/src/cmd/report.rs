//! `snapdiff report FILE... -o report.html`.

use crate::args::ReportPageArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff report`.
pub(crate) fn run(args: ReportPageArgs) -> anyhow::Result<Exit> {
    // Two files are a comparison; one or three and more have a trend.
    let trend = (args.files.len() != 2)
        .then(|| crate::cmd::trend::trend_of(&args.files))
        .flatten();
    let page = crate::report::page(&args.files, trend.as_ref())?;
    crate::pictures::write_output(&args.output, args.force, |out| {
        out.write_all(page.as_bytes())
    })?;
    Ok(Exit::Clean)
}
