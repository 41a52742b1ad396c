//! What `snapdiff capture` says of a run besides the trend reports: the
//! snapshots the job wrote, the dumps it lost, and the headings between the
//! reports of several processes.

use std::io::{self, Write};

use snapdiff_format::visible;

use crate::text::duration;

/// A dump that could not be written (a full disk, say), as the job's
/// manifest line describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LostDump {
    /// The steps done when it was due.
    pub step: Option<u64>,
    /// Why it was due: step, interval, signal, oom or exit.
    pub reason: Option<String>,
    /// Why it failed.
    pub error: String,
}

/// How long a job's dumps held it, as its manifest lines say.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DumpTime {
    /// The dumps timed.
    pub dumps: usize,
    /// Seconds in all, summed over the job's processes.
    pub seconds: f64,
    /// Seconds of the longest one.
    pub longest: f64,
    /// Seconds of the longest one, its owners' search left out.
    pub longest_without_owners: f64,
    /// Of those, the seconds finding owners took (unless `--no-owners`), in all and
    /// the longest; `None` without owners.
    pub owners: Option<(f64, f64)>,
    /// Interval dumps not taken because a dump was being written, summed
    /// over the job's processes.
    pub skipped_ticks: u64,
    /// The widest interval a process moved to because its dumps took
    /// more than a tenth of its time, in seconds.
    pub widened_to: Option<f64>,
}

/// What a captured job left in its folder.
#[derive(Clone, Debug, Default)]
pub struct Dumps<'a> {
    /// The folder, as it is shown.
    pub folder: &'a str,
    /// The names of the snapshots written, oldest first.
    pub snapshots: Vec<String>,
    /// Half-written dumps and owners files of killed processes that were removed.
    pub abandoned: usize,
    /// Dumps that could not be written.
    pub lost: &'a [LostDump],
    /// When no snapshot was written, why, as the job's processes said.
    pub nothing_because: Option<&'a str>,
    /// How long the dumps held the job; `None` when none said (the Rust
    /// runtime's dumps, or an older hook's).
    pub held: Option<DumpTime>,
}

/// Snapshots listed before the rest are said in a count.
const LISTED: usize = 8;

/// Lists what was written (or says plainly that nothing was), the
/// half-written dumps removed, and the dumps lost with their steps.
pub fn write_dumps(dumps: &Dumps<'_>, out: &mut dyn Write) -> io::Result<()> {
    let folder = visible::escaped(dumps.folder);
    match dumps.snapshots.len() {
        0 => writeln!(
            out,
            "no snapshot was written to {folder}: {}",
            dumps.nothing_because.unwrap_or(
                "no process imported torch or allocated through snapdiff-runtime's Allocator::new"
            )
        )?,
        n => {
            writeln!(out, "{n} snapshot{} in {folder}:", plural(n))?;
            for name in dumps.snapshots.iter().take(LISTED) {
                writeln!(out, "  {}", visible::escaped(name))?;
            }
            if n > LISTED {
                writeln!(out, "  ... and {} more", n - LISTED)?;
            }
        }
    }
    if let Some(held) = dumps.held {
        writeln!(
            out,
            "dumping held the job for {} in all ({} dump{}, the longest {})",
            duration(held.seconds),
            held.dumps,
            plural(held.dumps),
            duration(held.longest)
        )?;
        if let Some((all, longest)) = held.owners {
            writeln!(
                out,
                "  of which finding owners {} (the longest {}); without them {} (the longest dump {})",
                duration(all),
                duration(longest),
                duration((held.seconds - all).max(0.0)),
                duration(held.longest_without_owners),
            )?;
        }
        if held.skipped_ticks > 0 {
            writeln!(
                out,
                "{} interval dump{} not taken: a dump was still being written",
                held.skipped_ticks,
                plural(held.skipped_ticks as usize)
            )?;
        }
        if let Some(widened) = held.widened_to {
            writeln!(
                out,
                "dumps took more than a tenth of the job's time: the interval widened to {}",
                duration(widened)
            )?;
        }
    }
    if dumps.abandoned > 0 {
        writeln!(
            out,
            "removed {} half-written file{} (dumps, owners) of a killed process",
            dumps.abandoned,
            plural(dumps.abandoned)
        )?;
    }
    if let Some(first) = dumps.lost.first() {
        let steps: Vec<String> = dumps
            .lost
            .iter()
            .filter_map(|f| match (f.step, f.reason.as_deref()) {
                (Some(step), Some("step") | None) => Some(step.to_string()),
                (Some(step), Some(reason)) => {
                    Some(format!("{step} ({})", visible::escaped(reason)))
                }
                (None, _) => None,
            })
            .collect();
        writeln!(
            out,
            "{} dump{} could not be written (at step{} {}): {}; the report covers only the \
             snapshots listed",
            dumps.lost.len(),
            plural(dumps.lost.len()),
            plural(steps.len()),
            steps.join(", "),
            visible::escaped(&first.error)
        )?;
    }
    Ok(())
}

/// The line before the reports of several processes.
pub fn write_processes(names: &[&str], out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nsnapshots of {} processes ({}): each is reported on its own",
        names.len(),
        names.join(", ")
    )
}

/// The heading of the out-of-memory report of a job that died of one.
pub fn write_oom_heading(file: &str, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "\nout of memory: {}", visible::escaped(file))
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
