//! The flags of the commands that read one snapshot (or two): `summary`,
//! `peak`, `oom`, `steps`, `report`, `flamegraph`, `pprof`, `convert`.

use super::*;

/// Show the moment each device held the most memory, and what held it.
///
/// Replays the file's trace to find the highest allocated memory, then
/// groups what was live at that moment by site and by category
/// (parameters, gradients and backward, optimizer state, activations,
/// unknown), with the allocator's cache beside them.
#[derive(Debug, Args)]
pub(crate) struct PeakArgs {
    /// Snapshot file with a trace (.snap, .json, PyTorch pickle or torch.save zip).
    pub(crate) file: PathBuf,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// Explain an out-of-memory error from the snapshot taken at it.
///
/// Says what was asked for and where, how much was free and in how many
/// pieces (would it have fit if the free memory were one piece?), what held
/// the memory by category and site, and what kept growing before the error.
/// For snapshots dumped at the error: PyTorch's OOM observer, capture's
/// `oom` dumps, snapdiff-runtime's own.
#[derive(Debug, Args)]
pub(crate) struct OomArgs {
    /// Snapshot file with a trace (.snap, .json, PyTorch pickle or torch.save zip).
    pub(crate) file: PathBuf,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// Follow a trace step by step: what each step allocated, its peak, and
/// what it retained.
///
/// Steps are found as `trend` finds checkpoints (step marks, snapshot
/// markers, annotations, the iterations of the training loop), all of them.
/// A step that retains memory (live at its end less at its start) names the
/// sites that retained it.
#[derive(Debug, Args)]
pub(crate) struct StepsArgs {
    /// Snapshot file with a trace (.snap, .json, PyTorch pickle or torch.save zip).
    pub(crate) file: PathBuf,
    /// Also break down what was live at step N's peak, by category and site.
    #[arg(long, value_name = "N")]
    pub(crate) step: Option<u64>,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// Write a self-contained HTML report: the verdict, the timeline, the peak
/// and a flame graph.
///
/// One file with a trace: its trend, timeline of live memory (top sites
/// stacked, growing ones in red), peak and flame graph. Several snapshots:
/// their trend. Two: their comparison. With --fleet, a job of many ranks:
/// its verdict, a heat map of every rank and each rank's own report. The
/// page holds its data, script and styles: it opens from disk, offline.
#[derive(Debug, Args)]
pub(crate) struct ReportPageArgs {
    /// Snapshot files (a trace, several snapshots, or BEFORE AFTER), or a
    /// folder of them (as for trend).
    #[arg(required = true, value_name = "FILE")]
    pub(crate) files: Vec<PathBuf>,
    /// File to write (e.g. report.html).
    #[arg(short, long, value_name = "OUT")]
    pub(crate) output: PathBuf,
    /// Replace OUT if it exists.
    #[arg(long, short)]
    pub(crate) force: bool,
    /// Checkpoints at the start that are warm-up, as for trend.
    #[arg(long, value_name = "N", default_value_t = snapdiff_analyze::DEFAULT_WARMUP)]
    pub(crate) warmup: usize,
    /// The page of a whole job, as `fleet` judges it: FILEs are its
    /// snapshots, folders of ranks or site-table folders.
    #[arg(long)]
    pub(crate) fleet: bool,
    /// Show the run beside a baseline file (`snapdiff baseline`): the
    /// peak by site and category before and after, the sites whose code
    /// moved marked, and what `check` says at its default tolerance.
    #[arg(long, value_name = "BASELINE", conflicts_with = "fleet")]
    pub(crate) baseline: Option<PathBuf>,
}

/// Draw live memory by stack as a flame graph (SVG), or write folded stacks.
///
/// The width of each frame is the bytes live under it: when the snapshot
/// was taken, or at --at. With --diff BEFORE AFTER, a differential flame
/// graph of growth: widths are AFTER's bytes, red grew and blue shrank.
#[derive(Debug, Args)]
pub(crate) struct FlamegraphArgs {
    #[command(flatten)]
    pub(crate) picture: PictureArgs,
    /// Write folded stacks (for speedscope, inferno and the like) instead of an SVG.
    #[arg(long)]
    pub(crate) folded: bool,
}

/// Write live memory by stack as a pprof profile (gzipped profile.proto).
///
/// Sample types inuse_space (bytes) and inuse_objects (blocks); with --diff
/// BEFORE AFTER, growth_space (bytes) and AFTER's inuse_space. Frames carry
/// function, file and line: `go tool pprof -top OUT`, `-web`, Pyroscope.
#[derive(Debug, Args)]
pub(crate) struct PprofArgs {
    #[command(flatten)]
    pub(crate) picture: PictureArgs,
}

/// What `flamegraph` and `pprof` draw, and where they write it.
#[derive(Debug, Args)]
pub(crate) struct PictureArgs {
    /// Snapshot file (two with --diff: BEFORE AFTER).
    #[arg(required = true, num_args = 1..=2, value_name = "FILE")]
    pub(crate) files: Vec<PathBuf>,
    /// File to write (`-`: standard output).
    #[arg(short, long, value_name = "OUT")]
    pub(crate) output: PathBuf,
    /// Show the growth from BEFORE to AFTER.
    #[arg(long)]
    pub(crate) diff: bool,
    /// When: peak, event:N (after N events of the trace), step:N (at step
    /// N's start). Default: when the snapshot was taken.
    #[arg(long, value_name = "WHEN", value_parser = crate::pictures::parse_moment)]
    pub(crate) at: Option<snapdiff_analyze::LiveMoment>,
    /// Replace OUT if it exists.
    #[arg(long, short)]
    pub(crate) force: bool,
}

/// Show what a snapshot holds: totals per pool, fragmentation, top sites, trace events.
#[derive(Debug, Args)]
pub(crate) struct SummaryArgs {
    /// Snapshot file (.snap, .json, PyTorch pickle or torch.save zip).
    pub(crate) file: PathBuf,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// Convert a snapshot to .snap, .json or .pickle (chosen by OUT's extension).
#[derive(Debug, Args)]
pub(crate) struct ConvertArgs {
    /// Snapshot file to read (any supported kind).
    pub(crate) input: PathBuf,
    /// File to write: NAME.snap, NAME.json, or NAME.pickle (PyTorch's
    /// snapshot schema, for its memory viewer and torch.cuda._memory_viz).
    pub(crate) output: PathBuf,
    /// Replace OUT if it exists.
    #[arg(long, short)]
    pub(crate) force: bool,
}
