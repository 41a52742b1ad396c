//! `snapdiff peak FILE`.

use snapdiff_analyze::{PeakOptions, peak};

use crate::args::PeakArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff peak`.
pub(crate) fn run(args: PeakArgs) -> anyhow::Result<Exit> {
    let mut options = PeakOptions::default();
    options.rules = args.report.rules()?;
    let snap = crate::input::read(&args.file)?;
    let result = peak(&snap, &options);
    crate::input::release([snap]);
    if args.report.json {
        crate::output::print_json(&result, args.report.top)?;
        return Ok(Exit::Clean);
    }
    let mut out = crate::output::text_out();
    let file = crate::output::shown(&args.file);
    snapdiff_render::peak::write_text(&result, &file, &args.report.text(), &mut out)?;
    Ok(Exit::Clean)
}
