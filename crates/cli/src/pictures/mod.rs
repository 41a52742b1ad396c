//! Live memory by stack as pictures other tools draw: folded stacks and
//! flame graphs (inferno), and pprof profiles (`go tool pprof`, Pyroscope).

pub(crate) mod folded;
pub(crate) mod pprof;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::bail;
use snapdiff_analyze::CulpritRules;
use snapdiff_analyze::profile::{Moment, SiteBytes, live_by_site};
use snapdiff_format::Existing;

/// The sites to draw: of one file at `moment`, or (`diff`) of two files,
/// paired by site as `(before, after)` bytes.
pub(crate) enum Drawn {
    One(Vec<SiteBytes>),
    Diff(Vec<(SiteBytes, u64, u64)>),
}

/// Reads `files` (one, or BEFORE AFTER with `diff`) and takes their live
/// memory by site at `moment`.
pub(crate) fn sites_of(files: &[PathBuf], diff: bool, moment: Moment) -> anyhow::Result<Drawn> {
    match (files, diff) {
        ([file], false) => Ok(Drawn::One(sites_in(file, moment)?)),
        ([before, after], true) => {
            let before = sites_in(before, moment)?;
            let mut after = sites_in(after, moment)?;
            let mut paired: Vec<(SiteBytes, u64, u64)> = Vec::new();
            let mut earlier: rustc_hash::FxHashMap<_, _> =
                before.into_iter().map(|s| (s.site.key, s)).collect();
            for s in after.drain(..) {
                let was = earlier.remove(&s.site.key).map_or(0, |b| b.bytes);
                let now = s.bytes;
                paired.push((s, was, now));
            }
            paired.extend(earlier.into_values().map(|s| {
                let was = s.bytes;
                (s, was, 0)
            }));
            paired.sort_by(|a, b| {
                let growth = |p: &(SiteBytes, u64, u64)| p.2 as i64 - p.1 as i64;
                growth(b)
                    .cmp(&growth(a))
                    .then(a.0.site.key.cmp(&b.0.site.key))
            });
            Ok(Drawn::Diff(paired))
        }
        (_, true) => bail!("--diff takes two files: BEFORE AFTER"),
        (_, false) => bail!("one file, or two with --diff (BEFORE AFTER)"),
    }
}

fn sites_in(file: &Path, moment: Moment) -> anyhow::Result<Vec<SiteBytes>> {
    let snap = crate::render::read(file)?;
    let sites = live_by_site(&snap, &CulpritRules::default(), moment)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    crate::render::release([snap]);
    Ok(sites)
}

/// Parses `--at`: `peak`, `event:N` (after N events of the trace) or
/// `step:N` (at the start of step N).
pub(crate) fn parse_moment(text: &str) -> Result<Moment, String> {
    let number = |n: &str| {
        n.parse::<u64>()
            .map_err(|_| format!("{n:?} is not a number (try peak, event:N or step:N)"))
    };
    match text.split_once(':') {
        None if text == "peak" => Ok(Moment::Peak),
        Some(("event", n)) => Ok(Moment::Event(number(n)? as usize)),
        Some(("step", n)) => Ok(Moment::Step(number(n)?)),
        _ => Err(format!(
            "{text:?}: expected peak, event:N (after N events of the trace) or step:N"
        )),
    }
}

/// Writes `output` through `encode`, atomically, refusing to replace an
/// existing file unless `force`; `-` is standard output.
pub(crate) fn write_output(
    output: &Path,
    force: bool,
    encode: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    if output == Path::new("-") {
        let mut out = std::io::stdout().lock();
        encode(&mut out)?;
        out.flush()?;
        return Ok(());
    }
    if output.exists() && !force {
        bail!(
            "{}: already exists; pass --force to replace it",
            output.display()
        );
    }
    let existing = if force {
        Existing::Replace
    } else {
        Existing::Keep
    };
    snapdiff_format::write_atomically(output, existing, |out| {
        encode(out).map_err(|e| snapdiff_format::Error::io("cannot write", e))
    })?;
    Ok(())
}
