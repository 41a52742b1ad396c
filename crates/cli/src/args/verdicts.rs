//! The flags of `compare` and `trend`.

use super::*;

/// Compare two snapshots: which code holds more memory in AFTER than in BEFORE.
///
/// Live blocks are grouped by the stack that allocated them; each group is
/// named by its culprit, the innermost frame of your own code. Exit code 1
/// when --max-growth is given and the leaked bytes exceed it.
#[derive(Debug, Args)]
pub(crate) struct CompareArgs {
    /// The earlier snapshot (any supported kind).
    pub(crate) before: PathBuf,
    /// The later snapshot (any supported kind).
    pub(crate) after: PathBuf,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
    /// Exit with code 1 when leaked bytes exceed SIZE (e.g. 1MiB).
    #[arg(long, visible_alias = "fail-over", value_name = "SIZE", value_parser = parse_size)]
    pub(crate) max_growth: Option<u64>,
}

/// Find the code whose memory keeps growing, over several snapshots or within one trace.
///
/// With several files (or a folder of them), each is a checkpoint, in the
/// order of the steps they record, else of their times, else of their file
/// names with numbers compared as numbers (step-200 before step-1000); files
/// of different processes (ranks) are judged apart. With one file, its trace
/// is cut into checkpoints at its step marks, snapshot markers or
/// annotations, else at its iterations, else at the low points between
/// them; a trace with none of these gets no verdict. A site is a suspect when its memory
/// keeps growing after warm-up; one-time allocations and periodic rise and
/// fall are not. Exit code 1 when --max-growth is given and suspected growth
/// exceeds it.
#[derive(Debug, Args)]
pub(crate) struct TrendArgs {
    /// Snapshot files, or one file with a trace.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
    /// Exit with code 1 when suspected growth exceeds LIMIT: 1MiB in all
    /// after warm-up, 256B/step a step, 4KiB/checkpoint a checkpoint.
    #[arg(long, visible_alias = "fail-over", value_name = "LIMIT", value_parser = parse_limit)]
    pub(crate) max_growth: Option<Limit>,
    /// Checkpoints at the start that are warm-up (what they allocate is not growth).
    #[arg(long, value_name = "N", default_value_t = snapdiff_analyze::DEFAULT_WARMUP)]
    pub(crate) warmup: usize,
    /// At most N checkpoints of a trace, however it is cut (default: 10 when
    /// cut at iterations found in it or evenly; every mark or marker else).
    #[arg(long, value_name = "N", value_parser = parse_checkpoints)]
    pub(crate) checkpoints: Option<usize>,
    /// How to cut a trace: at its step marks, snapshot markers,
    /// annotations, the iterations found in it, the low points between
    /// them, or evenly (no verdict). Default: the first of these it has.
    #[arg(long, value_name = "HOW", value_enum)]
    pub(crate) cut: Option<Cut>,
    /// Total device memory, for the time-to-full estimate, when the files do not record it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) device_memory: Option<u64>,
}

/// Ways of cutting a trace into checkpoints (`--cut`).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Cut {
    /// At the program's step marks (snapdiff-runtime's mark_step).
    Steps,
    /// At the snapshot markers (where earlier dumps were taken).
    Markers,
    /// At the times of the trace's annotations (record_function).
    Annotations,
    /// At the same point of each iteration found in the trace.
    Iterations,
    /// At each call of the loop's function found in the trace's stacks.
    Calls,
    /// At the low points between iterations.
    Troughs,
    /// Evenly (for the series only: no verdict).
    Evenly,
}

impl Cut {
    /// The analysis's name for it.
    pub(crate) fn source(self) -> snapdiff_analyze::trend::CheckpointSource {
        use snapdiff_analyze::trend::CheckpointSource as S;
        match self {
            Cut::Steps => S::StepMarks,
            Cut::Markers => S::SnapshotMarkers,
            Cut::Annotations => S::Annotations,
            Cut::Iterations => S::Iterations,
            Cut::Calls => S::Calls,
            Cut::Troughs => S::Troughs,
            Cut::Evenly => S::EvenlySpaced,
        }
    }
}
