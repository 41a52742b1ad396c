//! `snapdiff steps FILE`.

use snapdiff_analyze::{StepsOptions, steps};

use crate::args::StepsArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff steps`.
pub(crate) fn run(args: StepsArgs) -> anyhow::Result<Exit> {
    let snap = crate::input::read(&args.file)?;
    let mut options = StepsOptions::default();
    options.rules = args.report.rules()?;
    options.detail = args.step;
    let result = steps(&snap, &options);
    crate::input::release([snap]);
    if args.report.json {
        crate::output::print_json(&result, args.report.top)?;
        return Ok(Exit::Clean);
    }
    let mut out = crate::output::text_out();
    let file = crate::output::shown(&args.file);
    snapdiff_render::steps::write_text(&result, &file, &args.report.text(), &mut out)?;
    Ok(Exit::Clean)
}
