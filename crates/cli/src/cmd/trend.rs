//! `snapdiff trend FILE...`.

use std::io::Write;
use std::path::PathBuf;

use snapdiff_analyze::trend::CheckpointSource;
use snapdiff_analyze::{Suspect, Trend, TrendOptions, trend_snapshots, trend_trace};
use snapdiff_format::Snapshot;

use crate::args::{ReportArgs, TrendArgs};
use crate::exit::Exit;
use crate::json;
use crate::render::{self, align_right, duration, size, sparkline, table};

/// The top-level entry point for `snapdiff trend`.
pub(crate) fn run(args: TrendArgs) -> anyhow::Result<Exit> {
    let mut options = TrendOptions::default();
    options.rules = render::rules(&args.report)?;
    options.warmup = args.warmup;
    if let Some(n) = args.checkpoints {
        // A number the user asked for limits every way of cutting.
        options.checkpoints = n;
        options.limit_all = true;
    }
    options.cut = args.cut.map(crate::args::Cut::source);
    options.device_memory = args.device_memory;
    let files = snapshots_in(&args.files)?;
    // Files are read a process at a time as their names tell processes
    // apart; files whose names do not are told apart after reading, by
    // manifest or recorded process id.
    let mut trends = Vec::new();
    let mut errored = false;
    for (_, files) in crate::processes::by_process(&files) {
        let (read, e) = read_all(&files);
        errored |= e;
        for (process, snapshots) in split_by_process(read) {
            trends.push((process, judge(snapshots, &options)?));
        }
    }
    match trends.len() {
        0 => Ok(Exit::Error),
        1 => print_one(&trends[0].1, errored, &args),
        _ => print_per_process(&trends, errored, &args),
    }
}

/// File names snapdiff reads as snapshots when given a folder.
const SNAPSHOT_EXTENSIONS: [&str; 6] = ["snap", "pickle", "pkl", "json", "pt", "zip"];

/// `files`, with each folder among them replaced by the snapshot files in
/// it (by their extension; `manifest.jsonl` and others are passed over).
fn snapshots_in(files: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for path in files {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| anyhow::anyhow!("{}: cannot read the folder: {e}", path.display()))?
            .filter_map(|entry| Some(entry.ok()?.path()))
            .filter(|p| {
                p.is_file()
                    && p.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| SNAPSHOT_EXTENSIONS.contains(&e))
            })
            .collect();
        if found.is_empty() {
            anyhow::bail!(
                "{}: no snapshot files in this folder (looked for .{})",
                path.display(),
                SNAPSHOT_EXTENSIONS.join(", .")
            );
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// The report of one series of snapshots (or one trace).
fn print_one(trend: &Trend, errored: bool, args: &TrendArgs) -> anyhow::Result<Exit> {
    let exit = match args.fail_over {
        _ if errored => Exit::Error,
        Some(limit) if trend.suspected_bytes > limit => {
            eprintln!(
                "snapdiff: {} of suspected growth, over the {} limit (--fail-over)",
                size(trend.suspected_bytes),
                size(limit)
            );
            Exit::OverThreshold
        }
        _ => Exit::Clean,
    };
    if args.report.json {
        json::print(trend, args.report.top)?;
    } else {
        print_table(trend, &args.report, &mut render::text_out())?;
    }
    Ok(exit)
}

/// The reports of several processes (ranks), each judged on its own; a rank
/// that grows while others do not is said.
fn print_per_process(
    trends: &[(String, Trend)],
    errored: bool,
    args: &TrendArgs,
) -> anyhow::Result<Exit> {
    let over: Vec<String> = trends
        .iter()
        .filter(|(_, t)| {
            args.fail_over
                .is_some_and(|limit| t.suspected_bytes > limit)
        })
        .map(|(p, t)| format!("{}: {}", process_name(p), size(t.suspected_bytes)))
        .collect();
    if let (false, Some(limit)) = (over.is_empty(), args.fail_over) {
        eprintln!(
            "snapdiff: suspected growth over the {} limit (--fail-over) in {}",
            size(limit),
            over.join("; ")
        );
    }
    let exit = if errored {
        Exit::Error
    } else if !over.is_empty() {
        Exit::OverThreshold
    } else {
        Exit::Clean
    };
    let growing: Vec<&str> = trends
        .iter()
        .filter(|(_, t)| !t.suspects.is_empty())
        .map(|(p, _)| process_name(p))
        .collect();
    let disagree = !growing.is_empty() && growing.len() < trends.len();
    let note = disagree.then(|| one_rank_note(&growing));
    if args.report.json {
        let processes: Vec<serde_json::Value> = trends
            .iter()
            .map(|(p, t)| serde_json::json!({ "process": p, "trend": t }))
            .collect();
        json::print(
            &serde_json::json!({ "processes": processes, "notes": note.iter().collect::<Vec<_>>() }),
            args.report.top,
        )?;
        return Ok(exit);
    }
    let mut out = render::text_out();
    let names: Vec<&str> = trends.iter().map(|(p, _)| process_name(p)).collect();
    writeln!(
        out,
        "snapshots of {} processes ({}): each is judged on its own",
        names.len(),
        names.join(", ")
    )?;
    for (process, trend) in trends {
        writeln!(out, "\n{}:", process_name(process))?;
        print_table(trend, &args.report, &mut out)?;
    }
    if let Some(note) = note {
        writeln!(out, "\nnote: {note}")?;
    }
    Ok(exit)
}

/// A process's name for people: files that say nothing of theirs are
/// "other files".
fn process_name(process: &str) -> &str {
    if process.is_empty() {
        "other files"
    } else {
        process
    }
}

/// The note for processes of which only some grow.
pub(crate) fn one_rank_note(growing: &[&str]) -> String {
    format!(
        "{} {} growth and the other processes do not: a leak in some ranks only (a code path \
         only they run, say rank 0's logging or evaluation)",
        growing.join(", "),
        if growing.len() == 1 { "shows" } else { "show" }
    )
}

/// The trend report of `files` with default options, as `capture` and `demo`
/// show it (capture has told processes apart by their files' names already).
/// Returns the suspected growth in bytes, or `None` when no file could be
/// read.
pub(crate) fn report(
    files: &[PathBuf],
    report: &ReportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<Option<u64>> {
    let mut options = TrendOptions::default();
    options.rules = render::rules(report)?;
    let (read, _) = read_all(files);
    if read.is_empty() {
        return Ok(None);
    }
    let trend = judge(read.into_iter().map(|(r, _)| r).collect(), &options)?;
    if report.json {
        json::write(out, &trend, report.top)?;
    } else {
        print_table(&trend, report, out)?;
    }
    Ok(Some(trend.suspected_bytes))
}

/// The trend of `files` with default options, for the report: of the first
/// process's files when they come from several. `None` when none can be
/// read or they have no trend (one file without a trace).
pub(crate) fn trend_of(files: &[PathBuf]) -> Option<Trend> {
    let (read, _) = read_all(files);
    let (_, first) = split_by_process(read).into_iter().next()?;
    judge(first, &TrendOptions::default()).ok()
}

/// A snapshot read, with its path.
struct Read<'a> {
    path: &'a PathBuf,
    snapshot: Snapshot,
}

/// Reads `files` in parallel, with what their manifests say of them, each
/// paired with the process that wrote it. An unreadable file is reported on
/// stderr and left out (the flag says so).
fn read_all(files: &[PathBuf]) -> (Vec<(Read<'_>, String)>, bool) {
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .map(|p| s.spawn(move || render::read(p)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread"))
            .collect()
    });
    let mut errored = false;
    let mut read = Vec::new();
    for (r, path) in results.into_iter().zip(files) {
        match r {
            Ok(s) => read.push((path, s)),
            Err(e) => {
                eprintln!("snapdiff: {}", render::escape_controls(&e.to_string()));
                errored = true;
            }
        }
    }
    let writers = crate::manifest::describe(&mut read);
    let read = read
        .into_iter()
        .zip(writers)
        .map(|((path, snapshot), writer)| {
            let process = crate::processes::process_of_snapshot(path, &snapshot, writer.as_deref());
            (Read { path, snapshot }, process)
        })
        .collect();
    (read, errored)
}

/// Snapshots grouped by the process that wrote them.
fn split_by_process(read: Vec<(Read<'_>, String)>) -> Vec<(String, Vec<Read<'_>>)> {
    crate::processes::group(read.into_iter().map(|(r, process)| (process, r)))
}

/// Analyses the snapshots of one process: one by its trace, several as
/// checkpoints.
fn judge(mut read: Vec<Read<'_>>, options: &TrendOptions) -> anyhow::Result<Trend> {
    let mut notes = Vec::new();
    // An exit dump is taken after the program freed its own variables, so
    // what leaked into them is gone: among enough other dumps it would hide
    // every leak.
    let is_exit = |path: &PathBuf| {
        path.file_stem()
            .is_some_and(|s| s.to_string_lossy().ends_with("-exit"))
    };
    let exits = read.iter().filter(|r| is_exit(r.path)).count();
    if exits > 0 && read.len() - exits >= 3 {
        read.retain(|r| !is_exit(r.path));
        notes.push(format!(
            "{exits} exit snapshot{} left out: taken after the program freed its variables, \
             {} would hide what leaked into them",
            if exits == 1 { "" } else { "s" },
            if exits == 1 { "it" } else { "they" },
        ));
    }
    // Snapshots that record neither step nor time (PyTorch's) are ordered by
    // file name (then path), numbers compared as numbers: step-200 before
    // step-1000, whatever order the shell's glob gave.
    let unordered = !read.iter().all(|r| r.snapshot.meta.step.is_some())
        && !read.iter().all(|r| r.snapshot.meta.created_us.is_some());
    if unordered {
        read.sort_by_cached_key(|r| {
            let name = r
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (natural_key(&name), natural_key(&r.path.to_string_lossy()))
        });
    }
    let first = read[0].path.clone();
    let snaps: Vec<_> = read.into_iter().map(|r| r.snapshot).collect();
    let mut trend = if snaps.len() == 1 {
        trend_trace(&snaps[0], options).map_err(|e| anyhow::anyhow!("{}: {e}", first.display()))?
    } else {
        let mut trend = trend_snapshots(&snaps, options);
        if unordered {
            for note in &mut trend.notes {
                if note.contains("taken in the order given") {
                    *note = "the snapshots record neither step nor time; they are ordered by file name \
                             (numbers as numbers)"
                        .to_owned();
                }
            }
        }
        trend
    };
    trend.notes.extend(notes);
    render::release(snaps);
    Ok(trend)
}

/// A sort key that compares runs of digits as numbers: `step-200` < `step-1000`.
fn natural_key(text: &str) -> Vec<(u8, u128, String)> {
    let mut key = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits > 0 {
            let (num, tail) = rest.split_at(digits);
            key.push((0, num.parse().unwrap_or(u128::MAX), String::new()));
            rest = tail;
        } else {
            let text_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let (word, tail) = rest.split_at(text_len);
            key.push((1, 0, word.to_owned()));
            rest = tail;
        }
    }
    key
}

/// Where checkpoints (or steps) were cut, for people.
pub(crate) fn source_label(source: CheckpointSource) -> &'static str {
    match source {
        CheckpointSource::Snapshots => "one per snapshot",
        CheckpointSource::SnapshotMarkers => "at the trace's snapshot markers",
        CheckpointSource::StepMarks => "at the trace's step marks",
        CheckpointSource::Annotations => "at the trace's annotations",
        CheckpointSource::Iterations => "at the same point of each iteration found in the trace",
        CheckpointSource::Troughs => "at the low points between the trace's iterations",
        CheckpointSource::EvenlySpaced => "evenly spaced through the trace",
    }
}

/// The trend as tables for people.
fn print_table(trend: &Trend, report: &ReportArgs, out: &mut dyn Write) -> anyhow::Result<()> {
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
    if trend.checkpoint_source == CheckpointSource::EvenlySpaced {
        writeln!(out, "no verdict: see the note below")?;
    } else if trend.suspects.is_empty() {
        writeln!(
            out,
            "no site's memory keeps growing: nothing here looks like a leak"
        )?;
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
        let mut t = table([
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
        ]);
        let shown = &trend.suspects[..trend.suspects.len().min(report.top_limit())];
        let base = render::paths_base(shown.iter().map(|s| &s.site), report);
        for (i, s) in shown.iter().enumerate() {
            let mut cell =
                render::site_cell_before(&s.site, s.before_recording, report.frames, &base);
            if s.before_recording && s.site.culprit.kind != snapdiff_analyze::CulpritKind::NoStack {
                cell.push_str("\n  (some blocks allocated before recording began)");
            }
            t.add_row(vec![
                (i + 1).to_string(),
                cell,
                size(s.growth_bytes),
                match s.growth_per_step {
                    Some(per_step) if by_step => size(per_step.round() as u64),
                    _ => size(s.growth_per_checkpoint),
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
        align_right(&mut t, &[0, 2, 3, 4]);
        writeln!(out, "{t}")?;
        render::paths_note(out, &base)?;
        print_evidence(trend, shown, out)?;
    }
    for note in &trend.notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(())
}

/// At most this many checkpoints are shown as a suspect's evidence.
const EVIDENCE_COLUMNS: usize = 8;

/// The evidence each verdict rests on, so a user can check it: for each
/// suspect, its live bytes, floor and blocks at checkpoints after warm-up
/// (all of them, or an even sample including the first and last).
fn print_evidence(trend: &Trend, shown: &[Suspect], out: &mut dyn Write) -> std::io::Result<()> {
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
    }
    Ok(())
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

    #[test]
    fn natural_order_compares_numbers_as_numbers() {
        let mut names = vec![
            "step-1000.pickle",
            "step-200.pickle",
            "step-30.pickle",
            "a.pickle",
        ];
        names.sort_by_cached_key(|n| super::natural_key(n));
        assert_eq!(
            names,
            [
                "a.pickle",
                "step-30.pickle",
                "step-200.pickle",
                "step-1000.pickle"
            ]
        );
    }
}
