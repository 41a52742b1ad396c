//! The flags of `baseline` and `check`: the memory gate between runs.

use super::*;

/// Write a run's memory as a baseline file to commit.
///
/// Per device the peak allocated and reserved bytes; per site its bytes at
/// the peak, its blocks, and the bytes it kept growing after warm-up. Sites
/// are keyed by their functions and file names, not lines, so that code
/// that only moved keeps its key. The file is sorted JSON with no paths,
/// times or process ids: the same code gives the same file.
#[derive(Debug, Args)]
pub(crate) struct BaselineArgs {
    /// The run: a capture folder, its snapshots, or one file with a trace.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// The baseline file to write; `-` for standard output.
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: PathBuf,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub(crate) force: bool,
    /// Checkpoints at the start that are warm-up (what they allocate is not growth).
    #[arg(long, value_name = "N", default_value_t = snapdiff_analyze::DEFAULT_WARMUP)]
    pub(crate) warmup: usize,
}

/// Check a run against a baseline: exit 1 naming each site over its tolerance.
///
/// A figure (a device's peak, a site's bytes at the peak, a site's growth
/// after warm-up) is over when it rose by more than --tolerance of the
/// baseline's and by more than --min-bytes. A site the baseline lacks
/// counts from zero. Exit code 0 within tolerance, 1 over it, 2 for bad
/// input.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The baseline file (`snapdiff baseline`).
    pub(crate) baseline: PathBuf,
    /// The run to check: a capture folder, its snapshots, or one file with a trace.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// How much a figure may rise, as a share of the baseline's (5%).
    #[arg(long, value_name = "SHARE", default_value = "5%", value_parser = parse_share)]
    pub(crate) tolerance: f64,
    /// How many bytes a figure may rise whatever its share.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = parse_size)]
    pub(crate) min_bytes: u64,
    /// Checkpoints at the start that are warm-up.
    #[arg(long, value_name = "N", default_value_t = snapdiff_analyze::DEFAULT_WARMUP)]
    pub(crate) warmup: usize,
    /// How to print the check: text, json, or markdown (a table for a CI
    /// job's summary).
    #[arg(long, value_enum, default_value_t = CheckFormat::Text)]
    pub(crate) format: CheckFormat,
    /// Print the check as JSON (`--format json`).
    #[arg(long, conflicts_with = "format")]
    pub(crate) json: bool,
    /// Rewrite BASELINE from the run: each figure the lower of the two (a
    /// ratchet), sites where the code now has them. Refused when a figure is
    /// over the tolerance, unless --allow-increase.
    #[arg(long)]
    pub(crate) update: bool,
    /// With --update, write the run's figures even where they rose.
    #[arg(long, requires = "update")]
    pub(crate) allow_increase: bool,
}

/// How `check` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CheckFormat {
    /// Lines of text.
    Text,
    /// One JSON object.
    Json,
    /// A Markdown table.
    Markdown,
}

/// A share: `5%`, or `0.05`.
fn parse_share(text: &str) -> Result<f64, String> {
    let (number, scale) = match text.trim().strip_suffix('%') {
        Some(n) => (n, 100.0),
        None => (text.trim(), 1.0),
    };
    match number.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => Ok(n / scale),
        _ => Err(format!("{text:?} is not a share (5% or 0.05)")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn shares_read_as_percent_or_fraction() {
        assert_eq!(super::parse_share("5%"), Ok(0.05));
        assert_eq!(super::parse_share("0.1"), Ok(0.1));
        assert!(super::parse_share("-1%").is_err());
        assert!(super::parse_share("five").is_err());
    }
}
