//! Every output snapdiff writes, from one place: the text tables people
//! read, the `--json` reports, flame graphs and folded stacks, pprof
//! profiles and the HTML report.
//!
//! Each renderer takes an analysis result from `snapdiff-analyze` and a
//! `&mut dyn Write`; none reads files or parses flags. The `snapdiff`
//! command and `snapdiff::testing`'s failure messages both print through
//! it, so a leak reads the same in a terminal and in a failed test.
//!
//! ```
//! use snapdiff_render::{TextOptions, compare};
//! let (a, b) = (snapdiff_format::Snapshot::default(), snapdiff_format::Snapshot::default());
//! let cmp = snapdiff_analyze::compare(&a, &b, &Default::default());
//! let mut out = Vec::new();
//! compare::write_text(&cmp, "a.snap", "b.snap", &TextOptions::default(), &mut out).unwrap();
//! assert!(String::from_utf8(out).unwrap().contains("no site holds more live memory"));
//! ```

#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod baseline;
pub mod capture;
pub mod compare;
pub mod flamegraph;
#[cfg(feature = "fleet")]
pub mod fleet;
mod held_by;
pub mod html;
pub mod json;
pub mod oom;
pub mod outside;
pub mod peak;
pub mod pinned_host;
pub mod pprof;
mod private_pools;
pub mod steps;
pub mod summary;
pub mod text;
pub mod trend;
#[cfg(feature = "fleet")]
pub mod watch;

/// How text reports are laid out: what `--top`, `--frames` and
/// `--full-paths` ask for on the command line.
#[derive(Clone, Debug, Default)]
pub struct TextOptions {
    /// At most this many sites a table (0: all).
    pub top: usize,
    /// Frames of each site's stack shown under its culprit.
    pub frames: usize,
    /// File paths whole, instead of from the folder that holds the code.
    pub full_paths: bool,
    /// Growth in red and shrinking in green (for a terminal; see
    /// [`text::TerminalText::with_colors`]).
    pub color: bool,
    /// The columns tables fit in when the output is no terminal (a test's
    /// failure message, a file); `None`: as wide as their text.
    pub width: Option<u16>,
}

impl TextOptions {
    /// How many sites a table shows: `top`, where 0 means all.
    pub fn top_limit(&self) -> usize {
        match self.top {
            0 => usize::MAX,
            n => n,
        }
    }
}
