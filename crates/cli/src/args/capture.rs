//! The flags of `capture` and `demo`, and those that follow a running job
//! (`--watch`, `--exec`, `--metrics`: `capture` and `watch`).

use super::*;

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
    /// Do not look for what keeps a PyTorch job's live tensors alive. By
    /// default, after each dump, capture finds it (a global, a local, the
    /// autograd graph) and writes it beside the dump; reports show it as
    /// "held by" under each suspect. Measured: about 0.1 s a dump of a
    /// small model's job, 0.2-0.4 s in a process of a million objects
    /// (docs/performance.md). A search stops at SNAPDIFF_OWNERS_BUDGET
    /// seconds (default 1); one that spends it all makes later searches
    /// come at every other dump, then fewer (said once).
    #[arg(long)]
    pub(crate) no_owners: bool,
    /// Find owners after each dump: the default, kept so that scripts
    /// written for earlier versions still run.
    #[arg(long, hide = true, conflicts_with = "no_owners")]
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
