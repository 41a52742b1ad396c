//! The exit codes, named in one place.

use std::process::ExitCode;

/// How a run of `snapdiff` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// It ran, and nothing was over the threshold.
    Clean = 0,
    /// It ran, and leaked (or, for trend, suspected) bytes exceeded `--fail-over`.
    OverThreshold = 1,
    /// Bad usage or unreadable input.
    Error = 2,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}
