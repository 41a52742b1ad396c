//! `snapdiff compare BEFORE AFTER`.

use snapdiff_analyze::{CompareOptions, compare};
use snapdiff_format::Parts;

use crate::args::CompareArgs;
use crate::exit::Exit;
use snapdiff_render::text::size;
use snapdiff_runs::process_said;

/// Files up to this size together are read at the same time, on two
/// threads. Reading a pickle peaks at about 1.25 times its size and keeps
/// about 0.9 times, so two at once raise the peak by a fifth (two 213 MiB
/// real-shaped pickles: 450 → 516 MiB) for 0.6 of the time (1.98 → 1.25 s);
/// larger pairs are read one after the other, keeping the peak lower where
/// it is counted in gigabytes.
const TOGETHER_BYTES: u64 = 2 << 30;

/// The top-level entry point for `snapdiff compare`.
pub(crate) fn run(args: CompareArgs) -> anyhow::Result<Exit> {
    let rules = args.report.rules()?;
    // The comparison is of the state at dump time: the trace is not needed.
    let read = |path| crate::input::read_parts(path, Parts::WithoutEvents);
    let file_size = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |m| m.len());
    let (before, after) = if file_size(&args.before) + file_size(&args.after) <= TOGETHER_BYTES {
        let read = |path| crate::input::read_beside(path, Parts::WithoutEvents);
        std::thread::scope(|s| {
            let a = s.spawn(|| read(&args.before));
            let b = read(&args.after);
            (a.join().expect("reader thread"), b)
        })
    } else {
        let before = read(&args.before);
        (before, read(&args.after))
    };
    let (before, after) = (before?, after?);
    let mut pair = [(&args.before, before), (&args.after, after)];
    let writers = snapdiff_runs::manifest::describe(&mut pair);
    let [(_, before), (_, after)] = pair;
    let process_a = process_said(&args.before, &before, writers[0].as_deref());
    let process_b = process_said(&args.after, &after, writers[1].as_deref());
    let mut options = CompareOptions::default();
    options.rules = rules;
    // Files of two processes are two runs, whatever their blocks look like.
    if let (Some(a), Some(b)) = (process_a, process_b)
        && a != b
    {
        options.two_runs = Some(format!("different processes: {a} and {b}"));
    }
    let mut cmp = compare(&before, &after, &options);
    let (before_traces, after_traces) = (before.traces.len(), after.traces.len());
    crate::owners::add_held_by_to_comparison(
        &mut cmp,
        (&args.before, &before),
        (&args.after, &after),
        &options.rules,
    );
    crate::input::release([before, after]);
    // Two runs: what each ran up to matters as much as where it ended, and
    // their traces say it. Read again, with events, only then.
    if cmp.runs.count == 2 && before_traces > 0 && after_traces > 0 {
        let read = |path| crate::input::read_parts(path, Parts::All);
        let (a, b) = (read(&args.before)?, read(&args.after)?);
        cmp.peaks_from(&a, &b);
        crate::input::release([a, b]);
    }
    let exit = match args.max_growth {
        Some(limit) if cmp.leaked_bytes > limit => {
            eprintln!(
                "snapdiff: {} leaked, over the {} limit (--max-growth)",
                size(cmp.leaked_bytes),
                size(limit)
            );
            Exit::OverThreshold
        }
        _ => Exit::Clean,
    };
    if args.report.json {
        crate::output::print_json(&cmp, args.report.top)?;
        return Ok(exit);
    }

    let mut out = crate::output::text_out();
    let (before, after) = (
        crate::output::shown(&args.before),
        crate::output::shown(&args.after),
    );
    snapdiff_render::compare::write_text(
        &cmp,
        &before.to_string(),
        &after.to_string(),
        &args.report.text(),
        &mut out,
    )?;
    Ok(exit)
}
