//! Command-line flags. Parsing only validates; files are opened by the commands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use snapdiff_analyze::Limit;

use crate::output::ColorWhen;

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
    /// Colour growth red and shrinking green: auto (on a terminal, unless
    /// NO_COLOR is set; CLICOLOR_FORCE forces it), always or never.
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = ColorWhen::Auto)]
    pub(crate) color: ColorWhen,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    Capture(CaptureArgs),
    Demo(DemoArgs),
    Compare(CompareArgs),
    Trend(TrendArgs),
    Fleet(FleetArgs),
    Watch(WatchArgs),
    Export(ExportArgs),
    Summary(SummaryArgs),
    Peak(PeakArgs),
    Oom(OomArgs),
    Steps(StepsArgs),
    Report(ReportPageArgs),
    Flamegraph(FlamegraphArgs),
    Pprof(PprofArgs),
    Convert(ConvertArgs),
    Completions(CompletionsArgs),
    Man(ManArgs),
    /// Run the built-in training workload (what `demo` captures).
    #[command(hide = true)]
    Train(snapdiff_train::TrainArgs),
}

/// Run a command with snapshot capture on, then report what grew.
///
/// A program that allocates through snapdiff-runtime's Allocator::new dumps
/// snapshots into DIR with no code change; so does a PyTorch script (through
/// a start-up hook, when torch with CUDA is there). Ctrl-C and termination
/// are passed on to the command, whose exit code is returned. Afterwards the
/// snapshots written are listed and the trend report over them printed.
#[derive(Debug, Args)]
pub(crate) struct CaptureArgs {
    /// Folder for the snapshots (created if missing).
    #[arg(
        short,
        long = "output",
        value_name = "DIR",
        default_value = "snapdiff-capture"
    )]
    pub(crate) output: PathBuf,
    /// Dump a snapshot every N training steps: in a PyTorch job, steps of
    /// the first optimizer that steps (a second optimizer, say a GAN's,
    /// does not count twice); in a Rust job, Allocator::mark_step calls.
    #[arg(long, value_name = "N", conflicts_with = "interval", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) every: Option<u64>,
    /// Dump a snapshot every interval (e.g. 90s, 500ms, 2min, 1h30m).
    #[arg(long, value_name = "T", value_parser = parse_interval)]
    pub(crate) interval: Option<std::time::Duration>,
    /// Events the trace ring buffer keeps (0: no trace).
    #[arg(long, value_name = "N")]
    pub(crate) max_entries: Option<usize>,
    /// Record no stacks (cheaper; reports then cannot name lines).
    #[arg(long)]
    pub(crate) no_stacks: bool,
    /// After each dump of a PyTorch job, find what keeps its live tensors
    /// alive (a global, a local, the autograd graph) and write it beside
    /// the dump; reports show it as "held by" under each suspect. Costs
    /// about 1-2 s a dump: the search stops at SNAPDIFF_OWNERS_BUDGET
    /// seconds (default 1), after listing every object of the process.
    #[arg(long)]
    pub(crate) owners: bool,
    /// Do not print the trend report afterwards.
    #[arg(long)]
    pub(crate) no_report: bool,
    /// Judge the dumps while the job runs, as `snapdiff watch` does: a
    /// status on stderr, a line when a site starts or stops leaking.
    /// --exec, --fail-fast and --metrics turn it on.
    #[arg(long)]
    pub(crate) watch: bool,
    #[command(flatten)]
    pub(crate) live: LiveArgs,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
    /// Exit with code 1 when suspected growth in any process exceeds LIMIT
    /// (1MiB in all after warm-up, 256B/step a step), and with 2 when dumps
    /// failed so the evidence is incomplete (the command's own failure
    /// comes first).
    #[arg(
        long,
        visible_alias = "fail-over",
        value_name = "LIMIT",
        value_parser = parse_limit,
        conflicts_with = "no_report"
    )]
    pub(crate) max_growth: Option<Limit>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

/// Watch snapdiff find a leak: train a small model that leaks, under capture.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// The leak the training job reproduces.
    #[arg(long, value_enum, default_value_t = snapdiff_train::Leak::KeepActivations)]
    pub(crate) leak: snapdiff_train::Leak,
    /// Training steps.
    #[arg(long, default_value_t = 40)]
    pub(crate) steps: u64,
    /// Keep the snapshots in DIR instead of a temporary folder.
    #[arg(long, value_name = "DIR")]
    pub(crate) keep: Option<PathBuf>,
}

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

impl Default for ReportArgs {
    /// The flags' defaults.
    fn default() -> ReportArgs {
        ReportArgs {
            json: false,
            top: 10,
            frames: 0,
            focus: None,
            ignore: None,
            library: None,
            full_paths: false,
            by: Rows::Culprit,
            width: None,
        }
    }
}

/// How reports are shown; shared by compare, trend and summary.
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// Print one JSON object instead of tables (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
    /// Show at most N sites, in tables and JSON (0: all).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) top: usize,
    /// Show K frames of each site's stack under its culprit.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub(crate) frames: usize,
    /// Pick as culprit the innermost frame matching RE ("function file:line").
    #[arg(long, value_name = "RE", value_parser = parse_regex)]
    pub(crate) focus: Option<String>,
    /// Never pick as culprit a frame matching RE ("function file:line").
    #[arg(long, value_name = "RE", value_parser = parse_regex)]
    pub(crate) ignore: Option<String>,
    /// Show file paths whole (tables show them from the folder that holds
    /// your code; JSON always has them whole).
    #[arg(long)]
    pub(crate) full_paths: bool,
    /// Count frames matching RE ("function file:line") as a library's, like
    /// torch's (e.g. your company's framework: "/mycorp_train/").
    #[arg(long, value_name = "RE", value_parser = parse_regex)]
    pub(crate) library: Option<String>,
    /// One row per culprit line (sites whose stacks reach it by different
    /// paths together), or per whole stack (each shows where it differs).
    #[arg(long, value_enum, value_name = "ROWS", default_value_t = Rows::Culprit)]
    pub(crate) by: Rows,
    /// Fit tables in N columns when the output is no terminal (a file, a
    /// test's failure message); by default they are as wide as their text.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(40..))]
    pub(crate) width: Option<u16>,
}

/// What a report's rows are (`--by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Rows {
    /// One row per culprit line.
    Culprit,
    /// One row per whole stack.
    Stack,
}

impl ReportArgs {
    /// The layout of text reports these flags ask for.
    pub(crate) fn text(&self) -> snapdiff_render::TextOptions {
        snapdiff_render::TextOptions {
            top: self.top,
            frames: self.frames,
            full_paths: self.full_paths,
            color: crate::output::colors(),
            width: self.width,
        }
    }

    /// The culprit rules that `--focus`, `--ignore` and `--library` ask for.
    pub(crate) fn rules(&self) -> anyhow::Result<snapdiff_analyze::CulpritRules> {
        Ok(
            snapdiff_analyze::CulpritRules::new(self.focus.as_deref(), self.ignore.as_deref())?
                .with_library(self.library.as_deref())?
                .with_rows_by_stack(self.by == Rows::Stack),
        )
    }
}

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

/// One verdict for a whole job of many ranks: which ranks leak, at which
/// line and how fast, and which ranks hold far more than their peers.
///
/// PATHs are snapshot files, folders (searched recursively), globs (quote
/// them when there are more files than a command line holds), and folders
/// of site tables written by `snapdiff export` (one per machine, say).
/// Ranks are told apart as `trend` tells processes apart (file names,
/// manifest.jsonl, the recorded process id) and each is judged as `trend`
/// judges one process, each device on its own. Files are read in parallel;
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

/// How a job is followed while it runs (`watch`, `capture --watch`).
#[derive(Debug, Args)]
pub(crate) struct LiveArgs {
    /// How often to look for new dumps (e.g. 2s, 500ms).
    #[arg(long, value_name = "T", default_value = "2s", value_parser = parse_interval)]
    pub(crate) poll: std::time::Duration,
    /// Run CMD (with `sh -c`) at each new suspect: the verdict in
    /// SNAPDIFF_* environment variables and as JSON on its stdin.
    #[arg(long, value_name = "CMD")]
    pub(crate) exec: Option<String>,
    /// Exit with code 1 at the first suspect (under capture, the job is
    /// ended first, by SIGTERM, so that it writes its exit dump).
    #[arg(long)]
    pub(crate) fail_fast: bool,
    /// Serve the verdict as OpenMetrics text at http://ADDR/metrics, for
    /// Prometheus: PORT alone for this host only (loopback), HOST:PORT
    /// otherwise (0.0.0.0:PORT for every interface); port 0 picks a free
    /// one, and the address is said on stderr.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<String>,
    /// No status on stderr, only the lines (for logs).
    #[arg(long)]
    pub(crate) no_status: bool,
    /// The most checkpoints kept of each device: past it, every other
    /// older one is dropped, so that memory stays flat however long the run.
    #[arg(long, value_name = "N", default_value_t = snapdiff_fleet::DEFAULT_KEEP_CHECKPOINTS)]
    pub(crate) keep_checkpoints: usize,
}

impl Default for LiveArgs {
    /// What the flags' defaults are (for a capture built in code: `demo`).
    fn default() -> LiveArgs {
        LiveArgs {
            poll: std::time::Duration::from_secs(2),
            exec: None,
            fail_fast: false,
            metrics: None,
            no_status: false,
            keep_checkpoints: snapdiff_fleet::DEFAULT_KEEP_CHECKPOINTS,
        }
    }
}

impl LiveArgs {
    /// Whether any flag asks for a live verdict.
    pub(crate) fn asked(&self) -> bool {
        self.exec.is_some() || self.fail_fast || self.metrics.is_some()
    }
}

/// Write the site tables of a job's snapshots as Parquet, for SQL tools.
///
/// Writes sites.parquet (each site's live blocks and bytes per rank,
/// device and checkpoint, with its culprit line), checkpoints.parquet (each
/// checkpoint's step, time, file and totals), stacks.parquet (each
/// site's frames) and owners.parquet (what kept each site's blocks alive,
/// from capture --owners) into DIR; schema in docs/format.md. `snapdiff fleet DIR`
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
            Cut::Troughs => S::Troughs,
            Cut::Evenly => S::EvenlySpaced,
        }
    }
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

/// Print a shell's completion script for snapdiff.
///
/// For example: `snapdiff completions bash > ~/.local/share/bash-completion/completions/snapdiff`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell: bash, elvish, fish, powershell or zsh.
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

/// Print snapdiff's man page (roff), e.g. `snapdiff man > snapdiff.1`.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {}

fn parse_size(text: &str) -> Result<u64, String> {
    snapdiff_format::units::parse_size(text).map_err(|e| e.to_string())
}

fn parse_limit(text: &str) -> Result<Limit, String> {
    text.parse()
        .map_err(|e: snapdiff_analyze::ParseLimitError| e.to_string())
}

fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    snapdiff_runtime::config::parse_interval(text).ok_or_else(|| {
        format!("invalid interval '{text}', expected a duration such as 90s, 500ms, 2min or 1h30m")
    })
}

fn parse_checkpoints(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 2 => Ok(n),
        _ => Err(format!(
            "invalid number of checkpoints '{text}', expected 2 or more"
        )),
    }
}

fn parse_regex(text: &str) -> Result<String, String> {
    regex::Regex::new(text)
        .map(|_| text.to_owned())
        .map_err(|e| format!("invalid regular expression: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("snapdiff").chain(args.iter().copied()))
    }

    #[test]
    fn compare_defaults() {
        let Command::Compare(c) = parse(&["compare", "a", "b"]).unwrap().command else {
            panic!()
        };
        assert_eq!(
            (c.report.top, c.report.frames, c.report.json, c.max_growth),
            (10, 0, false, None)
        );
    }

    #[test]
    fn sizes_and_patterns_are_checked_while_parsing() {
        let Command::Compare(c) = parse(&["compare", "a", "b", "--max-growth", "1.5MiB"])
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(c.max_growth, Some(1_572_864));
        // The earlier name still works.
        let Command::Compare(c) = parse(&["compare", "a", "b", "--fail-over", "2KiB"])
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(c.max_growth, Some(2048));
        assert!(parse(&["compare", "a", "b", "--fail-over", "12XB"]).is_err());
        assert!(parse(&["compare", "a", "b", "--fail-over", "99999999999999999999T"]).is_err());
        assert!(parse(&["compare", "a", "b", "--focus", "("]).is_err());
        assert!(parse(&["trend"]).is_err(), "trend needs a file");
        assert!(parse(&["trend", "a", "--checkpoints", "1"]).is_err());
    }

    #[test]
    fn capture_takes_a_command_after_two_dashes() {
        let Command::Capture(c) = parse(&[
            "capture", "-o", "out", "--every", "5", "--", "train", "--steps", "3",
        ])
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(c.command, ["train", "--steps", "3"]);
        assert_eq!((c.every, c.output.to_str()), (Some(5), Some("out")));
        assert!(
            parse(&["capture", "--every", "5", "--interval", "30s", "--", "x"]).is_err(),
            "one or the other"
        );
        assert!(parse(&["capture", "--interval", "soon", "--", "x"]).is_err());
        assert!(parse(&["capture", "--every", "0", "--", "x"]).is_err());
        assert!(parse(&["capture"]).is_err(), "a command is required");
    }
}
