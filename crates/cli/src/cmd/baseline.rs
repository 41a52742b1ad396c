//! `snapdiff baseline RUN... -o FILE`.

use snapdiff_analyze::TrendOptions;

use crate::args::BaselineArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff baseline`.
pub(crate) fn run(args: BaselineArgs) -> anyhow::Result<Exit> {
    let mut options = TrendOptions::default();
    options.warmup = args.warmup;
    let files = crate::input::snapshot_files(&args.files)?;
    let (baseline, errored) = crate::judging::files::baseline_of(files, &options);
    let Some(baseline) = baseline else {
        return Ok(Exit::Error);
    };
    crate::output::write_output(&args.output, args.force, |out| {
        serde_json::to_writer_pretty(&mut *out, &baseline)?;
        writeln!(out)
    })?;
    Ok(if errored { Exit::Error } else { Exit::Clean })
}
