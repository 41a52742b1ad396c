//! `snapdiff fleet PATH...`: one verdict for a whole job of many ranks.

use snapdiff_format::DeviceName;
use std::io::Write;
use std::sync::Mutex;

use snapdiff_fleet::{ProcessVerdict, Rows};

use crate::args::FleetArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff fleet`.
pub(crate) fn run(args: FleetArgs) -> anyhow::Result<Exit> {
    let trend = args.judge.trend(&args.report)?;
    let paths = snapdiff_runs::with_paths_from(&args.paths, args.paths_from.as_deref())?;
    if let Some(rank) = args.rank.as_deref() {
        let verdicts = Mutex::new(Vec::new());
        let read = crate::judging::fleet::read_judging(
            &paths,
            Some(rank),
            &trend,
            &args.threads,
            |verdict, _| {
                verdicts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(verdict);
            },
        )?;
        let verdicts = verdicts.into_inner().unwrap_or_else(|e| e.into_inner());
        let exit =
            crate::judging::fleet::exit_code(&verdicts, &read.unreadable, args.judge.max_growth);
        for note in &read.run_notes {
            eprintln!("snapdiff: note: {note}");
        }
        print_rank(&verdicts, &args)?;
        return Ok(exit);
    }
    // The text verdict keeps of each rank only what it shows, as each is
    // judged, so that memory barely grows with the number of ranks.
    let rows = if args.report.json {
        Rows::All
    } else {
        Rows::Named
    };
    let max_growth = args.judge.max_growth;
    let (mut fleet, facts) =
        crate::judging::fleet::judge_fleet(&paths, trend, &args.threads, rows, max_growth)?;
    let exit = facts.exit(&fleet.unreadable);
    if args.report.json {
        // A row a rank: written one at a time (10,000 ranks' rows as one
        // tree took 200 MB).
        let members = std::mem::take(&mut fleet.members);
        crate::output::print_json_with_list(&fleet, "members", members, args.report.top)?;
    } else {
        snapdiff_render::fleet::write_text(
            &fleet,
            &crate::output::shell_paths(&paths),
            &args.report.text(),
            &mut crate::output::text_out(),
        )?;
    }
    Ok(exit)
}

/// `--rank R`: that rank's full trend report, device by device.
fn print_rank(verdicts: &[ProcessVerdict], args: &FleetArgs) -> anyhow::Result<()> {
    if args.report.json {
        let rows: Vec<serde_json::Value> = verdicts
            .iter()
            .flat_map(|v| {
                v.devices.iter().map(|d| {
                    serde_json::json!({ "process": v.process, "device": d.device, "trend": d.trend })
                })
            })
            .collect();
        crate::output::print_json(&serde_json::json!({ "devices": rows }), args.report.top)?;
        return Ok(());
    }
    let mut out = crate::output::text_out();
    for v in verdicts {
        for d in &v.devices {
            if v.devices.len() > 1 || verdicts.len() > 1 {
                writeln!(out, "{} {}:", v.process, DeviceName(d.device))?;
            }
            snapdiff_render::trend::write_text(&d.trend, &args.report.text(), &mut out)?;
        }
    }
    Ok(())
}
