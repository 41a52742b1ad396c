//! Trends as text: the verdict of `snapdiff trend`, with the evidence it
//! rests on.

use std::io::{self, Write};

use snapdiff_analyze::trend::CheckpointSource;
use snapdiff_analyze::{CulpritKind, HeldBy, Suspect, Trend};

use crate::TextOptions;
use crate::text::{add_rows, grew, write_table};
use crate::text::{
    align_right, duration, paths_base, paths_note, site_cell_before, size, sparkline, table,
    where_stacks_differ,
};

/// Where checkpoints (or steps) were cut, for people.
pub fn source_label(source: CheckpointSource) -> &'static str {
    match source {
        CheckpointSource::Snapshots => "one per snapshot",
        CheckpointSource::SnapshotMarkers => "at the trace's snapshot markers",
        CheckpointSource::StepMarks => "at the trace's step marks",
        CheckpointSource::Annotations => "at the trace's annotations",
        CheckpointSource::Iterations => "at the same point of each iteration found in the trace",
        CheckpointSource::Calls => "at each call of the loop's function found in the trace",
        CheckpointSource::Troughs => "at the low points between the trace's iterations",
        CheckpointSource::EvenlySpaced => "evenly spaced through the trace",
    }
}

/// `trend` as `snapdiff trend` prints it: the checkpoints, the verdict,
/// the suspects with their evidence, then the notes.
pub fn write_text(trend: &Trend, options: &TextOptions, out: &mut dyn Write) -> io::Result<()> {
    let source = source_label(trend.checkpoint_source);
    write!(
        out,
        "{} checkpoints ({source}), the first {} as warm-up",
        trend.checkpoints, trend.warmup
    )?;
    let first = trend.points.first();
    let last = trend.points.last();
    if let (Some(a), Some(b)) = (first.and_then(|p| p.step), last.and_then(|p| p.step)) {
        write!(out, "; steps {a} to {b}")?;
    }
    if let (Some(a), Some(b)) = (first.and_then(|p| p.time_us), last.and_then(|p| p.time_us)) {
        write!(out, "; spanning {}", duration((b - a).max(0) as f64 / 1e6))?;
    }
    writeln!(out)?;
    let by_step = trend.suspects.iter().all(|s| s.growth_per_step.is_some());
    if trend.no_verdict.is_some() {
        writeln!(out, "no verdict: see the note below")?;
    } else if trend.suspects.is_empty() {
        let pinned = trend.pinned_host.as_ref().is_some_and(|h| h.rising.grows);
        let outside = trend.outside.as_ref().is_some_and(|o| o.grows());
        if pinned || outside {
            writeln!(
                out,
                "no site's {}memory keeps growing, but memory outside the sites does:",
                if pinned && !outside { "device " } else { "" }
            )?;
        } else {
            writeln!(
                out,
                "no site's memory keeps growing: nothing here looks like a leak"
            )?;
        }
    } else {
        let n = trend.suspects.len();
        write!(
            out,
            "{n} site{} keep{} growing: {} after warm-up",
            if n == 1 { "" } else { "s" },
            if n == 1 { "s" } else { "" },
            size(trend.suspected_bytes)
        )?;
        if let Some(rate) = trend.growth_per_second {
            write!(out, ", {}/s", size(rate as u64))?;
        }
        writeln!(out)?;
        match (trend.seconds_to_full, trend.device_memory) {
            (Some(secs), Some(total)) => writeln!(
                out,
                "at this rate the device ({} in all, {} allocated now) is full in about {}",
                size(total),
                size(trend.allocated_bytes),
                duration(secs)
            )?,
            (_, None) if trend.growth_per_second.is_some() => writeln!(
                out,
                "device size unknown: pass --device-memory SIZE for a time-to-full estimate"
            )?,
            _ => {}
        }
        let mut t = table(
            options,
            [
                "",
                "culprit",
                "growth",
                if by_step {
                    "per step"
                } else {
                    "per checkpoint"
                },
                "per second",
                "live bytes",
            ],
        );
        let shown = &trend.suspects[..trend.suspects.len().min(options.top_limit())];
        let base = paths_base(shown.iter().map(|s| &s.site), options.full_paths);
        let via = where_stacks_differ(&shown.iter().map(|s| &s.site).collect::<Vec<_>>(), &base);
        let mut rows = Vec::new();
        for (i, s) in shown.iter().enumerate() {
            let mut cell = site_cell_before(&s.site, s.before_recording, options.frames, &base);
            cell.push_str(via[i].as_deref().unwrap_or(""));
            if let Some(device) = s.device {
                cell.push_str(&format!("\n  (on {})", snapdiff_format::DeviceName(device)));
            }
            if s.before_recording && s.site.culprit.kind != CulpritKind::NoStack {
                cell.push_str("\n  (some blocks older than the trace)");
            }
            rows.push(vec![
                (i + 1).to_string(),
                cell,
                grew(size(s.growth_bytes), options.color),
                match s.growth_per_step {
                    Some(per_step) if by_step => grew(size(per_step.round() as u64), options.color),
                    _ => grew(size(s.growth_per_checkpoint), options.color),
                },
                s.growth_per_second
                    .map_or(String::new(), |r| format!("{}/s", size(r as u64))),
                format!(
                    "{} {}",
                    sparkline(&s.series),
                    size(*s.series.last().unwrap_or(&0))
                ),
            ]);
        }
        add_rows(&mut t, rows, 1);
        align_right(&mut t, &[0, 2, 3, 4]);
        write_table(out, "sites that keep growing:", &t)?;
        paths_note(out, &base)?;
        let owners: Vec<&[HeldBy]> = shown.iter().map(|s| &s.held_by[..]).collect();
        crate::held_by::write_held_by(&owners, "a step", "the last snapshot", out)?;
        write_evidence(trend, shown, out)?;
    }
    if let Some(host) = &trend.pinned_host
        && trend.no_verdict.is_none()
    {
        crate::pinned_host::write_trend(host, options.color, out)?;
    }
    if let Some(outside) = &trend.outside
        && trend.no_verdict.is_none()
    {
        crate::outside::write_trend(outside, options.color, out)?;
    }
    crate::private_pools::write_idle(&trend.idle_private_pools, out)?;
    for note in &trend.notes {
        // A note may quote the file (a marker's name): escaped.
        writeln!(out, "note: {}", snapdiff_format::visible::escaped(note))?;
    }
    Ok(())
}

/// The note for processes of which only some grow.
/// A process's name for people, escaped (names can come from a manifest):
/// files that say nothing of theirs are "other files".
pub fn process_name(process: &str) -> std::borrow::Cow<'_, str> {
    if process.is_empty() {
        "other files".into()
    } else {
        snapdiff_format::visible::escaped(process)
    }
}

/// The note on processes' trends when some grow and others do not.
fn per_process_note(trends: &[(String, Trend)]) -> Option<String> {
    let growing: Vec<std::borrow::Cow<'_, str>> = trends
        .iter()
        .filter(|(_, t)| !t.suspects.is_empty())
        .map(|(p, _)| process_name(p))
        .collect();
    let growing: Vec<&str> = growing.iter().map(|p| p.as_ref()).collect();
    (!growing.is_empty() && growing.len() < trends.len()).then(|| one_rank_note(&growing))
}

/// The reports of several processes' (ranks') trends, each judged on its
/// own, with a note when some grow and the others do not.
pub fn write_per_process(
    trends: &[(String, Trend)],
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let names: Vec<_> = trends.iter().map(|(p, _)| process_name(p)).collect();
    writeln!(
        out,
        "snapshots of {} processes ({}): each is judged on its own",
        names.len(),
        names.join(", ")
    )?;
    for (name, (_, trend)) in names.iter().zip(trends) {
        writeln!(out, "\n{name}:")?;
        write_text(trend, options, out)?;
    }
    if let Some(note) = per_process_note(trends) {
        writeln!(out, "\nnote: {note}")?;
    }
    Ok(())
}

/// The `--json` of `trend`, one shape however many processes the files
/// hold: `{"processes": [{"process", "trend"}], "notes": [...]}`, each
/// trend with the verdict of `limit` (`--max-growth`) as its `limit` when
/// one was given. `process` is what [`process_name`] shows, `""` where
/// nothing names the files' process.
pub fn per_process_json(
    trends: &[(String, Trend)],
    limit: Option<snapdiff_analyze::Limit>,
) -> serde_json::Value {
    /// A trend, with the limit's verdict when one was given.
    #[derive(serde::Serialize)]
    struct Judged<'a> {
        #[serde(flatten)]
        trend: &'a Trend,
        #[serde(skip_serializing_if = "Option::is_none")]
        limit: Option<snapdiff_analyze::Gate>,
    }
    let processes: Vec<serde_json::Value> = trends
        .iter()
        .map(|(p, trend)| {
            let limit = limit.map(|l| l.gate(trend));
            serde_json::json!({ "process": p, "trend": Judged { trend, limit } })
        })
        .collect();
    let notes: Vec<String> = per_process_note(trends).into_iter().collect();
    serde_json::json!({ "processes": processes, "notes": notes })
}

/// The note of a trend of several processes when only some grow.
pub fn one_rank_note(growing: &[&str]) -> String {
    format!(
        "{} {} growth and the other processes do not: a leak in some ranks only (a code path \
         only they run, say rank 0's logging or evaluation)",
        growing.join(", "),
        if growing.len() == 1 { "shows" } else { "show" }
    )
}

/// At most this many checkpoints are shown as a suspect's evidence.
const EVIDENCE_COLUMNS: usize = 8;

/// The evidence each verdict rests on, so a user can check it: for each
/// suspect, its live bytes, floor and blocks at checkpoints after warm-up
/// (all of them, or an even sample including the first and last).
fn write_evidence(trend: &Trend, shown: &[Suspect], out: &mut dyn Write) -> io::Result<()> {
    let after_warmup = trend.warmup.min(trend.checkpoints.saturating_sub(1))..trend.checkpoints;
    let picked = sample(after_warmup, EVIDENCE_COLUMNS);
    let by_step = picked.iter().all(|&i| trend.points[i].step.is_some());
    let header: Vec<String> = picked
        .iter()
        .map(|&i| match trend.points[i].step {
            Some(step) if by_step => step.to_string(),
            _ => format!("#{}", i + 1),
        })
        .collect();
    writeln!(
        out,
        "\nevidence: the floor is the least live memory from a checkpoint on; a leak's floor keeps rising"
    )?;
    for (n, s) in shown.iter().enumerate() {
        let rows = [
            (if by_step { "step" } else { "checkpoint" }, header.clone()),
            ("live", picked.iter().map(|&i| size(s.series[i])).collect()),
            ("floor", picked.iter().map(|&i| size(s.floor[i])).collect()),
            (
                "blocks",
                picked.iter().map(|&i| s.blocks[i].to_string()).collect(),
            ),
        ];
        let widths: Vec<usize> = (0..picked.len())
            .map(|c| {
                rows.iter()
                    .map(|(_, r)| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for (r, (name, cells)) in rows.iter().enumerate() {
            let number = if r == 0 {
                format!("{}", n + 1)
            } else {
                String::new()
            };
            write!(out, "{number:>3}  {name:<10}")?;
            for (cell, width) in cells.iter().zip(&widths) {
                write!(out, "  {cell:>width$}")?;
            }
            writeln!(out)?;
        }
        write_staircase(trend, s, by_step, out)?;
    }
    Ok(())
}

/// For a suspect whose floor rose at fewer than a third of the checkpoints
/// after warm-up (a staircase: a leak that grows once an epoch), how often
/// and by how much it rose, which the sampled columns may not show.
fn write_staircase(
    trend: &Trend,
    s: &Suspect,
    by_step: bool,
    out: &mut dyn Write,
) -> io::Result<()> {
    let start = trend.warmup.min(s.floor.len().saturating_sub(1));
    let risen: Vec<usize> = (start + 1..s.floor.len())
        .filter(|&i| s.floor[i] > s.floor[i - 1])
        .collect();
    let intervals = s.floor.len() - 1 - start;
    if risen.is_empty() || 3 * risen.len() >= intervals {
        return Ok(());
    }
    let every = intervals as f64 / risen.len() as f64;
    let steps = match (
        trend.points[start].step,
        trend.points.last().and_then(|p| p.step),
    ) {
        (Some(a), Some(b)) if by_step && b > a => Some((b - a) as f64 / risen.len() as f64),
        _ => None,
    };
    let period = match steps {
        Some(k) => format!("about once every {k:.0} steps"),
        None => format!("about once every {every:.0} checkpoints"),
    };
    writeln!(
        out,
        "     grows in steps: {period} ({} rises after warm-up, {} each on average)",
        risen.len(),
        size(s.growth_bytes / risen.len() as u64)
    )
}

/// Up to `most` indices of `range`, evenly spread, the first and last always in.
fn sample(range: std::ops::Range<usize>, most: usize) -> Vec<usize> {
    let len = range.len();
    if len <= most {
        return range.collect();
    }
    (0..most)
        .map(|k| range.start + k * (len - 1) / (most - 1))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn evidence_samples_keep_both_ends() {
        assert_eq!(super::sample(2..5, 8), [2, 3, 4]);
        let picked = super::sample(1..101, 8);
        assert_eq!(picked.len(), 8);
        assert_eq!((picked[0], picked[7]), (1, 100));
        assert!(picked.windows(2).all(|w| w[0] < w[1]));
    }
}
