//! `snapdiff demo`: the built-in training job leaks, under capture, and the
//! report names the line.

use std::io::Write;

use clap::ValueEnum;

use crate::args::{CaptureArgs, DemoArgs, ReportArgs};
use crate::exit::Exit;

/// The top-level entry point for `snapdiff demo`.
pub(crate) fn run(args: DemoArgs) -> anyhow::Result<Exit> {
    let temp = tempfile::Builder::new()
        .prefix("snapdiff-demo-")
        .tempdir()?;
    let dir = args.keep.clone().unwrap_or_else(|| temp.path().to_owned());
    let leak = args
        .leak
        .to_possible_value()
        .expect("no skipped values")
        .get_name()
        .to_owned();
    let exe = std::env::current_exe()?;
    let mut out = crate::output::text_out();
    writeln!(
        out,
        "snapdiff demo: training a small MLP for {} steps with the leak '{leak}', under capture\n\
         (a snapshot every 5 steps into {})\n",
        args.steps,
        dir.display()
    )?;
    out.flush()?;
    drop(out);

    let report = ReportArgs {
        frames: 2,
        ..ReportArgs::default()
    };
    let steps = args.steps.to_string();
    let command = [
        exe.as_os_str(),
        "train".as_ref(),
        "--steps".as_ref(),
        steps.as_ref(),
        "--batch".as_ref(),
        "256".as_ref(),
        "--hidden".as_ref(),
        "512".as_ref(),
        "--leak".as_ref(),
        leak.as_ref(),
        "--capacity-mib".as_ref(),
        "2048".as_ref(),
        "--log-every".as_ref(),
        "10".as_ref(),
    ];
    let capture_args = CaptureArgs {
        output: dir.clone(),
        every: Some(5),
        interval: None,
        max_entries: None,
        no_stacks: false,
        owners: false,
        no_owners: false,
        no_report: false,
        watch: false,
        live: crate::args::LiveArgs::default(),
        max_growth: None,
        report,
        command: command.iter().map(|s| s.to_os_string()).collect(),
    };
    let captured = crate::job::capture(&capture_args)?;
    let mut out = crate::output::text_out();
    writeln!(out)?;
    crate::reports::captured(&mut out, &dir, &captured)?;
    writeln!(out)?;
    crate::reports::trend(&captured.snapshots, &capture_args.report, &mut out)?;
    let leaks = args.leak != snapdiff_train::Leak::None;
    // A verdict needs four checkpoints (one of warm-up): 20 steps.
    if leaks && captured.snapshots.len() >= 4 {
        writeln!(
            out,
            "\nThe culprit is the line of crates/train that allocates the buffers the leak keeps."
        )?;
    } else if leaks {
        writeln!(
            out,
            "\nToo few snapshots for a verdict: snapdiff demo --steps 20 or more names the line."
        )?;
    }
    match (
        &args.keep,
        captured.snapshots.first(),
        captured.snapshots.last(),
    ) {
        // The snapshots stay: a command to look closer at them.
        (Some(_), Some(first), Some(last)) => writeln!(
            out,
            "To see it between two snapshots: snapdiff compare {} {} --frames 3",
            first.display(),
            last.display()
        )?,
        // The temporary folder goes when the demo ends.
        _ => writeln!(
            out,
            "(the snapshots were in a temporary folder, now removed; --keep DIR keeps them, to \
             look closer with snapdiff compare or snapdiff report)"
        )?,
    }
    Ok(captured.exit)
}
