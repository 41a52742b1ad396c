//! Command-line flags. Parsing only validates; files are opened by the commands.
//!
//! The command line and what every report shares are here; each family of
//! commands' flags in a file of its own.

mod baseline;
mod capture;
mod files;
mod fleet;
mod verdicts;

pub(crate) use baseline::{BaselineArgs, CheckArgs, CheckFormat};
pub(crate) use capture::{CaptureArgs, DemoArgs, LiveArgs};
pub(crate) use files::{
    ConvertArgs, FlamegraphArgs, OomArgs, PeakArgs, PprofArgs, ReportPageArgs, StepsArgs,
    SummaryArgs,
};
pub(crate) use fleet::{ExportArgs, FleetArgs, ThreadArgs, WatchArgs};
pub(crate) use verdicts::{CompareArgs, Cut, TrendArgs};

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
    Baseline(BaselineArgs),
    Check(CheckArgs),
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
