//! `snapdiff trend FILE...`.

use snapdiff_analyze::{Trend, TrendOptions};

use crate::args::TrendArgs;
use crate::exit::Exit;
use snapdiff_render::trend::{per_process_json, process_name, write_per_process, write_text};

/// The top-level entry point for `snapdiff trend`.
pub(crate) fn run(args: TrendArgs) -> anyhow::Result<Exit> {
    let mut options = TrendOptions::default();
    options.rules = args.report.rules()?;
    options.warmup = args.warmup;
    if let Some(n) = args.checkpoints {
        // A number the user asked for limits every way of cutting.
        options.checkpoints = n;
        options.limit_all = true;
    }
    options.cut = args.cut.map(crate::args::Cut::source);
    options.device_memory = args.device_memory;
    let files = crate::input::snapshot_files(&args.files)?;
    let (trends, errored) = crate::judging::files::judge_files(files, &options)?;
    match trends.len() {
        0 => Ok(Exit::Error),
        1 => print_one(&trends, errored, &args),
        _ => print_per_process(&trends, errored, &args),
    }
}

/// The report of one series of snapshots (or one trace): `one` holds one
/// process's trend. Its JSON has the shape of several processes' (one
/// shape for every `trend --json`).
fn print_one(one: &[(String, Trend)], errored: bool, args: &TrendArgs) -> anyhow::Result<Exit> {
    let trend = &one[0].1;
    let over = args.max_growth.and_then(|limit| limit.over(trend));
    let exit = match over {
        _ if errored => Exit::Error,
        Some(over) => {
            eprintln!(
                "snapdiff: {} of suspected growth, over the {} limit (--max-growth)",
                over.limit.amount(over.kept),
                over.limit
            );
            Exit::OverThreshold
        }
        None => Exit::Clean,
    };
    if args.report.json {
        crate::output::print_json(&per_process_json(one, args.max_growth), args.report.top)?;
    } else {
        write_text(trend, &args.report.text(), &mut crate::output::text_out())?;
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
        .filter_map(|(p, t)| {
            let over = args.max_growth?.over(t)?;
            Some(format!(
                "{}: {}",
                process_name(p),
                over.limit.amount(over.kept)
            ))
        })
        .collect();
    if let (false, Some(limit)) = (over.is_empty(), args.max_growth) {
        eprintln!(
            "snapdiff: suspected growth over the {limit} limit (--max-growth) in {}",
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
    if args.report.json {
        crate::output::print_json(&per_process_json(trends, args.max_growth), args.report.top)?;
    } else {
        write_per_process(trends, &args.report.text(), &mut crate::output::text_out())?;
    }
    Ok(exit)
}
