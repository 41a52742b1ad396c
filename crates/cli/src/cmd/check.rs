//! `snapdiff check BASELINE RUN...`.

use anyhow::Context;
use snapdiff_analyze::TrendOptions;
use snapdiff_analyze::baseline::{BASELINE_FORMAT, Baseline, Tolerance, check, ratchet};

use crate::args::{CheckArgs, CheckFormat};
use crate::exit::Exit;

/// The most a baseline file may hold: a real job's is tens of kilobytes.
const MOST_BASELINE_BYTES: u64 = 64 << 20;

/// The top-level entry point for `snapdiff check`.
pub(crate) fn run(args: CheckArgs) -> anyhow::Result<Exit> {
    let baseline = read_baseline(&args.baseline)?;
    let mut options = TrendOptions::default();
    options.warmup = args.warmup;
    let files = crate::input::snapshot_files(&args.files)?;
    let (run, errored) = crate::judging::files::baseline_of(files, &options);
    let Some(run) = run else {
        return Ok(Exit::Error);
    };
    let tolerance = Tolerance {
        share: args.tolerance,
        bytes: args.min_bytes,
    };
    let checked = check(&baseline, &run, tolerance);
    let shown = crate::output::shown(&args.baseline).to_string();
    let format = if args.json {
        CheckFormat::Json
    } else {
        args.format
    };
    let mut out = crate::output::text_out();
    match format {
        CheckFormat::Json => crate::output::print_json(&checked, 0)?,
        CheckFormat::Text => {
            snapdiff_render::baseline::write_check(&checked, &shown, tolerance, &mut out)?;
        }
        CheckFormat::Markdown => {
            snapdiff_render::baseline::write_check_markdown(&checked, &shown, tolerance, &mut out)?;
        }
    }
    let over = !checked.over.is_empty();
    if args.update && !errored {
        if over && !args.allow_increase {
            eprintln!(
                "snapdiff: {shown} not updated: memory rose over it (--allow-increase writes it)"
            );
        } else {
            let updated = ratchet(&baseline, &run, args.allow_increase);
            crate::output::write_output(&args.baseline, true, |out| {
                serde_json::to_writer_pretty(&mut *out, &updated)?;
                writeln!(out)
            })?;
            eprintln!("snapdiff: {shown} updated");
            return Ok(Exit::Clean);
        }
    }
    Ok(match (errored, over) {
        (true, _) => Exit::Error,
        (false, false) => Exit::Clean,
        (false, true) => Exit::OverThreshold,
    })
}

/// Reads the baseline file at `path`: a regular file of at most
/// [`MOST_BASELINE_BYTES`], in the layout `snapdiff baseline` writes.
pub(crate) fn read_baseline(path: &std::path::Path) -> anyhow::Result<Baseline> {
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
