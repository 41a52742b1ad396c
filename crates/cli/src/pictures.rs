//! The sites `flamegraph`, `pprof` and `report` draw, read from the files given.

use std::path::{Path, PathBuf};

use anyhow::bail;
use snapdiff_analyze::{CulpritRules, LiveMoment, SiteBytes, live_by_site};
use snapdiff_render::flamegraph::Drawn;

/// Reads `files` (one, or BEFORE AFTER with `diff`) and takes their live
/// memory by site at `moment`.
pub(crate) fn sites_of(files: &[PathBuf], diff: bool, moment: LiveMoment) -> anyhow::Result<Drawn> {
    match (files, diff) {
        ([file], false) => Ok(Drawn::One(sites_in(file, moment)?)),
        ([before, after], true) => Ok(Drawn::diff(
            sites_in(before, moment)?,
            sites_in(after, moment)?,
        )),
        (_, true) => bail!("--diff takes two files: BEFORE AFTER"),
        (_, false) => bail!("one file, or two with --diff (BEFORE AFTER)"),
    }
}

fn sites_in(file: &Path, moment: LiveMoment) -> anyhow::Result<Vec<SiteBytes>> {
    let snap = crate::input::read(file)?;
    let sites = live_by_site(&snap, &CulpritRules::default(), moment)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    crate::input::release([snap]);
    Ok(sites)
}

/// Parses `--at`: `peak`, `event:N` (after N events of the trace) or
/// `step:N` (at the start of step N).
pub(crate) fn parse_moment(text: &str) -> Result<LiveMoment, String> {
    let number = |n: &str| {
        n.parse::<u64>()
            .map_err(|_| format!("{n:?} is not a number (try peak, event:N or step:N)"))
    };
    match text.split_once(':') {
        None if text == "peak" => Ok(LiveMoment::Peak),
        Some(("event", n)) => Ok(LiveMoment::Event(number(n)? as usize)),
        Some(("step", n)) => Ok(LiveMoment::Step(number(n)?)),
        _ => Err(format!(
            "{text:?}: expected peak, event:N (after N events of the trace) or step:N"
        )),
    }
}
