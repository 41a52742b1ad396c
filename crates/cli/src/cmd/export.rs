//! `snapdiff export PATH... -o DIR`: a job's site tables as Parquet.

use std::sync::Mutex;

use snapdiff_fleet::{StackStore, TABLE_FILES, TableWriter};
use snapdiff_render::text::{count, size};

use crate::args::ExportArgs;
use crate::exit::Exit;
use crate::judging::fleet::{in_pool, read_table_folders};
use crate::judging::ranks::read_processes;
use snapdiff_runs::{census, with_paths_from};

/// The top-level entry point for `snapdiff export`.
pub(crate) fn run(args: ExportArgs) -> anyhow::Result<Exit> {
    let paths = with_paths_from(&args.paths, args.paths_from.as_deref())?;
    // Its own output is never its input: a folder inside the one given
    // would be read as tables and every rank written twice.
    let mut census = census(&paths, None, Some(&args.output))?;
    let table_folders = std::mem::take(&mut census.table_folders);
    let found_unreadable = std::mem::take(&mut census.unreadable);
    let existing: Vec<String> = TABLE_FILES
        .iter()
        .map(|name| args.output.join(name))
        .filter(|p| p.exists())
        .map(|p| crate::output::shown(&p))
        .collect();
    if !existing.is_empty() && !args.force {
        anyhow::bail!(
            "{}: already exists; pass --force to replace it",
            existing.join(", ")
        );
    }
    let stacks = StackStore::new();
    let writer = Mutex::new(TableWriter::create(&args.output, Default::default())?);
    let failed = Mutex::new(None);
    let write = |mut rows| {
        let mut writer = writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = writer.write(&mut rows, &stacks.read()) {
            failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
    };
    let (unreadable, outcome) = in_pool(&args.threads, || {
        let unreadable = read_table_folders(&table_folders, None, &stacks, write);
        (unreadable, read_processes(census, &stacks, None, write))
    })?;
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.into());
    }
    writer
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .finish()?;
    let run_notes = outcome.run_notes();
    let mut all_unreadable = unreadable;
    all_unreadable.extend(outcome.unreadable);
    all_unreadable.extend(found_unreadable);
    for u in &all_unreadable {
        eprintln!("snapdiff: {}", u.error);
    }
    for note in &run_notes {
        eprintln!("snapdiff: note: {note}");
    }
    if args.json {
        let said = serde_json::json!({
            "files": outcome.files,
            "bytes": outcome.bytes,
            "unreadable": all_unreadable,
            "notes": run_notes,
        });
        println!("{said}");
    } else {
        eprintln!(
            "snapdiff: wrote {} from {} snapshot{} ({})",
            crate::output::shown(&args.output),
            count(outcome.files as u64),
            if outcome.files == 1 { "" } else { "s" },
            size(outcome.bytes)
        );
    }
    Ok(if all_unreadable.is_empty() {
        Exit::Clean
    } else {
        Exit::Error
    })
}
