//! The flags of the commands that read a job of many ranks: `fleet`,
//! `watch`, `export`, and how they judge each rank.

use super::*;

/// One verdict for a whole job of many ranks: which ranks leak, at which
/// line and how fast, and which ranks hold far more than their peers.
///
/// PATHs are snapshot files, folders (searched recursively), globs (quote
/// them when there are more files than a command line holds), and folders
/// of site tables written by `snapdiff export` (one per machine, say).
/// Ranks are told apart as `trend` tells processes apart (file names,
/// manifest.jsonl, the recorded process id, else the folder), runs of one
/// rank by process id, machine or folder, and each is judged as `trend`
/// judges one process (a rank of one file by its trace), each device on
/// its own. Files are read in parallel;
/// one that cannot be read is named and left out, and the exit code is 2.
/// Exit code 1 when --max-growth is given and a rank's suspected growth
/// exceeds it.
#[derive(Debug, Args)]
pub(crate) struct FleetArgs {
    /// Snapshot files, folders, globs, or site-table folders.
    #[arg(required_unless_present = "paths_from")]
    pub(crate) paths: Vec<PathBuf>,
    /// Read more PATHs from FILE (`-`: standard input), one a line, or
    /// separated by NUL bytes: for more paths than a command line holds.
    #[arg(long, value_name = "FILE")]
    pub(crate) paths_from: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
    /// Print one rank's full trend report instead: a rank number (7) or a
    /// process as the verdict names it (rank7, pid812).
    #[arg(long, value_name = "R")]
    pub(crate) rank: Option<String>,
    #[command(flatten)]
    pub(crate) judge: JudgeArgs,
    #[command(flatten)]
    pub(crate) threads: ThreadArgs,
}

/// Follow a running job's dumps and say when a line starts leaking.
///
/// Reads each dump once, as it is written (into a capture's folder, or
/// many ranks' folders on one machine or a shared file system), and keeps
/// each process's verdict current: a line on stdout when a site becomes a
/// suspect or stops being one, with its growth and when the device would
/// be full, and a status on stderr (on a terminal). Ends when every process
/// the manifests name has ended, or on Ctrl-C, with the verdict `fleet`
/// gives. Exit codes as for `fleet`; 1 at the first suspect with
/// --fail-fast.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// Folders a job dumps into (followed recursively, also those made
    /// later; one that does not exist yet is waited for), or dump files.
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) live: LiveArgs,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
    #[command(flatten)]
    pub(crate) judge: JudgeArgs,
}

/// How each rank of a job is judged, and when that fails the command
/// (`fleet`, `watch`).
#[derive(Debug, Args)]
pub(crate) struct JudgeArgs {
    /// Exit with code 1 when a rank's suspected growth exceeds LIMIT: 1GiB
    /// in all after warm-up, 256B/step a step, 4KiB/checkpoint a checkpoint.
    #[arg(long, value_name = "LIMIT", value_parser = parse_limit)]
    pub(crate) max_growth: Option<Limit>,
    /// Checkpoints at the start of each rank's series that are warm-up.
    #[arg(long, value_name = "N", default_value_t = snapdiff_analyze::DEFAULT_WARMUP)]
    pub(crate) warmup: usize,
    /// Total device memory, for the time-to-full estimate, when the files do not record it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) device_memory: Option<u64>,
}

impl JudgeArgs {
    /// The trend options these flags ask for, with `report`'s culprit rules.
    pub(crate) fn trend(
        &self,
        report: &ReportArgs,
    ) -> anyhow::Result<snapdiff_analyze::TrendOptions> {
        let mut trend = snapdiff_analyze::TrendOptions::default();
        trend.rules = report.rules()?;
        trend.warmup = self.warmup;
        trend.device_memory = self.device_memory;
        Ok(trend)
    }
}

/// Write the site tables of a job's snapshots as Parquet, for SQL tools.
///
/// Writes sites.parquet (each site's live blocks and bytes per rank,
/// device and checkpoint, with its culprit line), checkpoints.parquet (each
/// checkpoint's step, time, file and totals), stacks.parquet (each
/// site's frames) and owners.parquet (what kept each site's blocks alive,
/// from capture's owners files) into DIR; schema in docs/format.md. `snapdiff fleet DIR`
/// gives the same verdict as from the snapshots.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// Snapshot files, folders (searched recursively) or globs.
    #[arg(required_unless_present = "paths_from")]
    pub(crate) paths: Vec<PathBuf>,
    /// Read more PATHs from FILE (`-`: standard input), one a line, or
    /// separated by NUL bytes.
    #[arg(long, value_name = "FILE")]
    pub(crate) paths_from: Option<PathBuf>,
    /// Folder to write the tables into (created if missing).
    #[arg(long, short, value_name = "DIR")]
    pub(crate) output: PathBuf,
    /// Replace tables already in DIR.
    #[arg(long, short)]
    pub(crate) force: bool,
    /// Print what was read as one JSON object (files, bytes, and the files
    /// that could not be read) instead of a line on stderr.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) threads: ThreadArgs,
}

/// How many threads read files (`--threads`).
#[derive(Debug, Args)]
pub(crate) struct ThreadArgs {
    /// Threads reading files (default: one per core).
    #[arg(long, short = 'j', value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) threads: Option<u16>,
}
