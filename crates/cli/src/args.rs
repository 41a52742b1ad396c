//! Command-line flags. Parsing only validates; files are opened by the commands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Find GPU memory leaks in training jobs.
///
/// snapdiff reads CUDA caching-allocator snapshots (its own .snap files and
/// PyTorch's snapshot pickles), compares them, and names the line of code
/// that holds the memory that keeps growing.
#[derive(Debug, Parser)]
#[command(name = "snapdiff", version, max_term_width = 100)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    Summary(SummaryArgs),
    Convert(ConvertArgs),
}

/// Show what a snapshot holds: memory totals, trace events and actions.
#[derive(Debug, Args)]
pub(crate) struct SummaryArgs {
    /// Snapshot file (.snap, .json, PyTorch pickle or torch.save zip).
    pub(crate) file: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Convert a snapshot to .snap or .json (chosen by OUT's extension).
#[derive(Debug, Args)]
pub(crate) struct ConvertArgs {
    /// Snapshot file to read (any supported kind).
    pub(crate) input: PathBuf,
    /// File to write: NAME.snap or NAME.json.
    pub(crate) output: PathBuf,
    /// Replace OUT if it exists.
    #[arg(long, short)]
    pub(crate) force: bool,
}
