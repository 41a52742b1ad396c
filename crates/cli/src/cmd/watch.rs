//! `snapdiff watch PATH...`: a job's verdict kept current while it runs
//! (see [`crate::live`]).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::args::WatchArgs;
use crate::exit::Exit;
use crate::live::{Say, Watcher};

/// The top-level entry point for `snapdiff watch`.
pub(crate) fn run(args: WatchArgs) -> anyhow::Result<Exit> {
    let trend = args.judge.trend(&args.report)?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The first asks for the verdict so far; a second ends at once.
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&stop))?;
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    refuse_what_is_not_dumps(&args.paths)?;
    for path in args.paths.iter().filter(|p| !p.exists()) {
        eprintln!(
            "snapdiff: {}: does not exist yet; waiting for it (Ctrl-C for the verdict so far)",
            crate::output::shown(path)
        );
    }
    let mut watcher = Watcher::new(&args.paths, &args.live, &args.report, trend, Say::Stdout)?;
    // A folder used again: its ended runs are not the one to follow.
    let (dumps, runs) = watcher.pass_over_ended_runs();
    if dumps > 0 {
        eprintln!(
            "snapdiff: passed over {dumps} dump{} of {runs} process{} that had ended before \
             the watch began; waiting for a new run (snapdiff fleet judges the ended ones)",
            if dumps == 1 { "" } else { "s" },
            if runs == 1 { "" } else { "es" },
        );
    }
    let failed_fast = watcher.follow(&args.live, &stop, || false)?;
    let (fleet, verdicts) = watcher.finish();
    if fleet.files == 0 && fleet.unreadable.is_empty() {
        eprintln!("snapdiff: no dump was read while watching, so no verdict");
        return Ok(Exit::NoVerdict);
    }
    if args.report.json {
        // One line, after the changes' lines: a stream of JSON lines.
        snapdiff_render::json::write_line(&mut std::io::stdout().lock(), &fleet, args.report.top)?;
    } else {
        let mut out = crate::output::text_out();
        writeln!(out)?;
        let paths = crate::output::shell_paths(&args.paths);
        snapdiff_render::fleet::write_text(&fleet, &paths, &args.report.text(), &mut out)?;
    }
    if failed_fast {
        return Ok(Exit::OverThreshold);
    }
    Ok(crate::judging::fleet::exit_code(
        &verdicts,
        &fleet.unreadable,
        args.judge.max_growth,
    ))
}

/// Site tables and capture's own files are no job's dumps: watching them
/// would wait forever, so they are refused with one line.
fn refuse_what_is_not_dumps(paths: &[PathBuf]) -> anyhow::Result<()> {
    for path in paths {
        let shown = crate::output::shown(path);
        if path.is_dir() && snapdiff_fleet::is_table_folder(path) {
            anyhow::bail!(
                "{shown}: holds site tables, not a running job's dumps: judge them with `snapdiff fleet`"
            );
        }
        if path.is_file() && snapdiff_format::names::is_capture_file(path) {
            anyhow::bail!("{shown}: is capture's own file, not a dump: give its folder");
        }
    }
    Ok(())
}
