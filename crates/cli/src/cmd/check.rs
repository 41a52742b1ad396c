//! `snapdiff check BASELINE RUN...`.

use anyhow::Context;
use snapdiff_analyze::TrendOptions;
use snapdiff_analyze::baseline::{BASELINE_FORMAT, Baseline, Tolerance, check};

use crate::args::CheckArgs;
use crate::exit::Exit;

/// The most a baseline file may hold: a real job's is tens of kilobytes.
const MOST_BASELINE_BYTES: u64 = 64 << 20;

/// The top-level entry point for `snapdiff check`.
pub(crate) fn run(args: CheckArgs) -> anyhow::Result<Exit> {
    let baseline = read_baseline(&args.baseline)?;
    let mut options = TrendOptions::default();
    options.warmup = args.warmup;
    let files = crate::input::snapshot_files(&args.files)?;
    let (run, errored) = crate::judging::files::baseline_of(files, &options)?;
    let tolerance = Tolerance {
        share: args.tolerance,
        bytes: args.min_bytes,
    };
    let checked = check(&baseline, &run, tolerance);
    if args.json {
        crate::output::print_json(&checked, 0)?;
    } else {
        let shown = crate::output::shown(&args.baseline).to_string();
        snapdiff_render::baseline::write_check(
            &checked,
            &shown,
            tolerance,
            &mut crate::output::text_out(),
        )?;
    }
    Ok(match (errored, checked.over.is_empty()) {
        (true, _) => Exit::Error,
        (false, true) => Exit::Clean,
        (false, false) => Exit::OverThreshold,
    })
}

/// Reads the baseline file at `path`: a regular file of at most
/// [`MOST_BASELINE_BYTES`], in the layout `snapdiff baseline` writes.
fn read_baseline(path: &std::path::Path) -> anyhow::Result<Baseline> {
    let shown = crate::output::shown(path);
    let meta = std::fs::metadata(path).with_context(|| format!("{shown}: cannot read"))?;
    if !meta.is_file() {
        anyhow::bail!("{shown}: not a regular file");
    }
    if meta.len() > MOST_BASELINE_BYTES {
        anyhow::bail!(
            "{shown}: {} bytes is too large for a baseline file",
            meta.len()
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("{shown}: cannot read"))?;
    let baseline: Baseline = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{shown}: not a snapdiff baseline file ({e})"))?;
    if baseline.snapdiff_baseline != BASELINE_FORMAT {
        anyhow::bail!(
            "{shown}: baseline format {} (this snapdiff reads {BASELINE_FORMAT})",
            baseline.snapdiff_baseline
        );
    }
    Ok(baseline)
}
