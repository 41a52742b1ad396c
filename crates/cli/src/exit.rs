//! The exit codes, named in one place.

use std::process::ExitCode;

/// How a run of `snapdiff` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// It ran, and nothing was over the threshold.
    Clean,
    /// It ran, and leaked (or, for trend, suspected) bytes exceeded `--max-growth` (alias `--fail-over`).
    OverThreshold,
    /// Bad usage or unreadable input.
    Error,
    /// `fleet`: no rank had checkpoints enough to judge.
    NoVerdict,
    /// `capture` passes on the exit code of the command it ran.
    Code(u8),
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(match e {
            Exit::Clean => 0,
            Exit::OverThreshold => 1,
            Exit::Error => 2,
            Exit::NoVerdict => 3,
            Exit::Code(code) => code,
        })
    }
}
