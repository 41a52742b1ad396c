//! `snapdiff summary FILE`.

use snapdiff_analyze::{SummaryOptions, summarize};

use crate::args::SummaryArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff summary`.
pub(crate) fn run(args: SummaryArgs) -> anyhow::Result<Exit> {
    let mut options = SummaryOptions::default();
    options.rules = args.report.rules()?;
    options.top = args.report.text().top_limit();
    let snap = crate::input::read(&args.file)?;
    let mut summary = summarize(&snap, &options);
    if let Some(owners) = crate::owners::by_site(&args.file, &snap) {
        let mut lines = snapdiff_analyze::held_by::SiteLines::new(&[&snap], &options.rules);
        summary.add_held_by(&owners, &options.rules, |key| lines.line(key));
    }
    let (source, producer) = (snap.meta.source.clone(), snap.meta.producer.clone());
    crate::input::release([snap]);
    if args.report.json {
        crate::output::print_json(&summary, args.report.top)?;
        return Ok(Exit::Clean);
    }
    let mut out = crate::output::text_out();
    snapdiff_render::summary::write_text(
        &summary,
        &crate::output::shown(&args.file),
        source.as_deref(),
        &producer,
        &args.report.text(),
        &mut out,
    )?;
    Ok(Exit::Clean)
}
