//! `snapdiff capture [-o DIR] [--every N | --interval T] -- CMD [ARGS...]`.
//!
//! Runs CMD under capture ([`crate::job`]), returns its exit code, and then
//! judges what it wrote, each process on its own; what it says is drawn by
//! `snapdiff-render`.

use std::io::Write;

use crate::job::capture;

use crate::args::CaptureArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff capture`.
pub(crate) fn run(args: CaptureArgs) -> anyhow::Result<Exit> {
    let captured = capture(&args)?;
    // JSON escapes control characters itself, and must stay exact.
    let mut out: Box<dyn std::io::Write> = if args.report.json {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(crate::output::text_out())
    };
    // What was written is said on stderr under --json, which stdout keeps for JSON.
    if args.report.json {
        crate::reports::captured(&mut std::io::stderr().lock(), &args.output, &captured)?;
    } else {
        crate::reports::captured(&mut *out, &args.output, &captured)?;
    }
    if args.no_report || captured.snapshots.is_empty() {
        if captured.failed_fast {
            return Ok(failed_fast());
        }
        return Ok(match args.max_growth {
            Some(_) if captured.exit == Exit::Clean => {
                eprintln!("snapdiff: no snapshot to judge, so no verdict (--max-growth)");
                Exit::Error
            }
            _ => captured.exit,
        });
    }
    // Snapshots of different processes (ranks, or a job and its children)
    // are never mixed: each process is reported on its own.
    let processes = snapdiff_runs::by_process(captured.snapshots.clone());
    if processes.len() > 1 {
        let names: Vec<&str> = processes.iter().map(|(p, _)| p.as_str()).collect();
        snapdiff_render::capture::write_processes(&names, &mut *out)?;
    }
    let mut over = Vec::new();
    let mut growing = Vec::new();
    for (process, files) in &processes {
        writeln!(out)?;
        if processes.len() > 1 {
            writeln!(out, "{process}:")?;
        }
        let trend = crate::reports::trend(files, &args.report, &mut out)?;
        if trend.as_ref().is_some_and(|t| t.suspected_bytes > 0) {
            growing.push(process.as_str());
        }
        if let Some(o) = (trend.as_ref()).and_then(|t| args.max_growth?.over(t)) {
            over.push(format!("{process}: {}", o.limit.amount(o.kept)));
        }
        // A job that died of an out-of-memory error: what it asked for and
        // what held the memory, from the dump taken at the error.
        if let Some(oom_dump) = files.iter().rev().find(|f| {
            f.file_stem()
                .is_some_and(|s| s.to_string_lossy().ends_with("-oom"))
        }) && !args.report.json
        {
            let shown = oom_dump.display().to_string();
            snapdiff_render::capture::write_oom_heading(&shown, &mut *out)?;
            match crate::input::read(oom_dump) {
                Ok(snap) => crate::reports::oom_dump(&snap, &args.report, &mut out)?,
                Err(e) => eprintln!(
                    "snapdiff: {}",
                    snapdiff_format::visible::escaped(&e.to_string())
                ),
            }
        }
    }
    for stopped in &captured.stopped {
        // The dumps after it hold nothing new: no all-clear rests on them.
        writeln!(
            out,
            "\nnote: {stopped}; what it allocated after is in no dump, so its verdict covers \
             only the time before"
        )?;
    }
    if !growing.is_empty() && growing.len() < processes.len() && !args.report.json {
        writeln!(
            out,
            "\nnote: {}",
            snapdiff_render::trend::one_rank_note(&growing)
        )?;
    }
    out.flush()?;
    if captured.failed_fast {
        return Ok(failed_fast());
    }
    if captured.exit != Exit::Clean {
        return Ok(captured.exit);
    }
    let Some(limit) = args.max_growth else {
        return Ok(Exit::Clean);
    };
    if !over.is_empty() {
        eprintln!(
            "snapdiff: suspected growth over the {limit} limit (--max-growth) in {}",
            over.join("; ")
        );
        return Ok(Exit::OverThreshold);
    }
    if !captured.stopped.is_empty() {
        eprintln!(
            "snapdiff: the recording stopped while the job ran ({}), so the evidence is \
             incomplete: no verdict (--max-growth)",
            captured.stopped.join("; ")
        );
        return Ok(Exit::Error);
    }
    if !captured.failed.is_empty() {
        eprintln!(
            "snapdiff: {} of {} dumps failed, so the evidence is incomplete: no verdict \
             (--max-growth)",
            captured.failed.len(),
            captured.failed.len() + captured.snapshots.len()
        );
        return Ok(Exit::Error);
    }
    Ok(Exit::Clean)
}

/// What capture says and returns when `--fail-fast` ended the job.
fn failed_fast() -> Exit {
    eprintln!("snapdiff: a line started leaking (--fail-fast): the job was ended");
    Exit::OverThreshold
}
