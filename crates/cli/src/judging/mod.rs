//! From files to verdicts: the reading and judging every command that
//! gives a verdict shares. Which process and run wrote a file is
//! `snapdiff_runs`'s; the judge is `snapdiff_analyze::judge`'s.

pub(crate) mod files;
pub(crate) mod fleet;
pub(crate) mod ranks;
