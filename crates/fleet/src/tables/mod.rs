//! The site tables as Parquet files: `sites.parquet`, `checkpoints.parquet`,
//! `stacks.parquet` and `owners.parquet` in one folder (schema in
//! `docs/format.md`).
//!
//! Written and read with the Apache Arrow crates, so that DuckDB, pandas,
//! Spark and any Parquet reader see the same rows the fleet verdict is
//! computed from, and `snapdiff fleet DIR` judges them exactly as it judges
//! the snapshots they came from.

//!
//! Tables are read back in one pass holding one process's rows at a time
//! when each process's rows are together, as `export` writes them
//! ([`in_order`]); tables re-saved by other tools in any order are read a
//! group of processes a pass ([`in_groups`]).

mod in_groups;
mod in_order;
mod read;
mod write;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::stacks::StackStore;
use snapdiff_analyze::rows::ProcessRows;

pub use write::TableWriter;

pub use snapdiff_runs::{TABLE_FILES, is_table_folder};

/// What went wrong with a table folder.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A file could not be read or written.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong, in one line.
        message: String,
    },
}

fn file_error(path: &Path, message: impl std::fmt::Display) -> TableError {
    TableError::File {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// A schema of a table whose rows each belong to a checkpoint of a
/// process: the four columns that place a row (read back by
/// `read::Placing`), then `columns`.
fn placed_schema(columns: impl IntoIterator<Item = Field>) -> SchemaRef {
    let placing = [
        Field::new("process", DataType::Utf8, false),
        Field::new("rank", DataType::UInt32, true),
        Field::new("device", DataType::UInt32, false),
        Field::new("checkpoint", DataType::UInt32, false),
    ];
    Arc::new(Schema::new(
        placing.into_iter().chain(columns).collect::<Vec<_>>(),
    ))
}

fn sites_schema() -> SchemaRef {
    placed_schema([
        Field::new("step", DataType::UInt64, true),
        Field::new("time_us", DataType::Int64, true),
        Field::new("stack_key", DataType::Utf8, false),
        Field::new("culprit_function", DataType::Utf8, false),
        Field::new("culprit_file", DataType::Utf8, false),
        Field::new("culprit_line", DataType::UInt32, false),
        Field::new("category", DataType::Utf8, true),
        Field::new("blocks", DataType::UInt64, false),
        Field::new("live_bytes", DataType::UInt64, false),
        Field::new("requested_bytes", DataType::UInt64, false),
    ])
}

fn checkpoints_schema() -> SchemaRef {
    placed_schema([
        Field::new("step", DataType::UInt64, true),
        Field::new("time_us", DataType::Int64, true),
        Field::new("source", DataType::Utf8, false),
        Field::new("reserved_bytes", DataType::UInt64, false),
        Field::new("allocated_bytes", DataType::UInt64, false),
        Field::new("active_bytes", DataType::UInt64, false),
        Field::new("device_memory", DataType::UInt64, true),
        Field::new("rss_bytes", DataType::UInt64, true),
        Field::new("device_used_bytes", DataType::UInt64, true),
        Field::new("recorded_on_cpu", DataType::Boolean, true),
    ])
}

/// Columns that tables written before them lack: read as empty.
const ADDED_COLUMNS: [&str; 3] = ["rss_bytes", "device_used_bytes", "recorded_on_cpu"];

fn stacks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("stack_key", DataType::Utf8, false),
        Field::new("frame", DataType::UInt32, false),
        Field::new("function", DataType::Utf8, false),
        Field::new("file", DataType::Utf8, false),
        Field::new("line", DataType::UInt32, false),
    ]))
}

fn owners_schema() -> SchemaRef {
    placed_schema([
        Field::new("stack_key", DataType::Utf8, false),
        Field::new("owner", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("container", DataType::Utf8, true),
        Field::new("example", DataType::Utf8, false),
        Field::new("blocks", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
    ])
}

/// Reads the site tables in `dir`, adding the stacks of their sites to
/// `stacks`, and hands each process's rows to `each`. Every row is checked
/// before the first process is handed on: a folder that cannot be read
/// hands on none.
pub fn read_tables(
    dir: &Path,
    stacks: &StackStore,
    each: impl FnMut(ProcessRows),
) -> Result<(), TableError> {
    read::read_stacks(dir, &mut stacks.write())?;
    if in_order::in_order(dir, stacks)? {
        in_order::read_in_order(dir, stacks, each)
    } else {
        in_groups::read_in_groups(dir, stacks, in_groups::CHECKPOINTS_PER_PASS, each)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::stacks::Stacks;
    use arrow_array::{Array, UInt32Array};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use snapdiff_analyze::rows::{CheckpointRow, DeviceRows, SiteRow};
    use snapdiff_analyze::{CulpritRules, HeldBy, StackKey};
    use snapdiff_format::Frame;

    /// Process `rank`'s rows: `checkpoints` checkpoints on `device`, each
    /// holding `rank` MiB at site 1 and its step's KiB at site 2, the first
    /// with site 1's owner found.
    fn process(rank: u64, device: u32, checkpoints: u64) -> ProcessRows {
        let mut rows = ProcessRows::new(format!("rank{rank}"));
        rows.devices.push(DeviceRows {
            device,
            checkpoints: (0..checkpoints)
                .map(|step| CheckpointRow {
                    step: Some(step),
                    source: format!("rank{rank}-step{step}.pickle"),
                    ..CheckpointRow::default()
                })
                .collect(),
            sites: (0..checkpoints)
                .map(|step| {
                    vec![
                        SiteRow::one_block(1, rank << 20),
                        SiteRow::one_block(2, step << 10),
                    ]
                })
                .collect(),
            owners: (0..checkpoints)
                .map(|step| {
                    (step == 0).then(|| {
                        let held = HeldBy {
                            owner: format!("model.layer{rank}"),
                            kind: "Linear".into(),
                            container: None,
                            example: "weight".into(),
                            blocks: 1,
                            bytes: rank << 20,
                            blocks_per_step: None,
                        };
                        [(StackKey(1), vec![held])].into_iter().collect()
                    })
                })
                .collect(),
            cut: None,
        });
        rows
    }

    /// A folder of tables written by [`TableWriter`] from `parts` (some
    /// processes' rows, written in this order), and the processes they
    /// hold.
    pub(in crate::tables) fn written_tables(
        name: &str,
        parts: &[ProcessRows],
    ) -> (PathBuf, Vec<ProcessRows>) {
        let dir =
            std::env::temp_dir().join(format!("snapdiff-tables-{name}-{}", std::process::id()));
        let mut stacks = Stacks::default();
        let frame = Frame {
            name: "step".into(),
            file: "train.py".into(),
            line: 10,
            extra: Vec::new(),
        };
        for key in [1, 2] {
            stacks.insert(StackKey(key), Some([&frame].into_iter()), None);
        }
        let mut tables = TableWriter::create(&dir, CulpritRules::default()).unwrap();
        let mut processes: Vec<ProcessRows> = Vec::new();
        for part in parts {
            tables.write(&mut part.clone(), &stacks).unwrap();
            match processes.iter_mut().find(|p| p.process == part.process) {
                Some(p) => p.devices.extend(part.devices.iter().cloned()),
                None => processes.push(part.clone()),
            }
        }
        tables.finish().unwrap();
        (dir, processes)
    }

    /// Seven ranks of 1 to 3 checkpoints each, twelve in all.
    pub(in crate::tables) fn seven_ranks() -> Vec<ProcessRows> {
        (0..7).map(|r| process(r, 0, 1 + r % 3)).collect()
    }

    /// Every process of the tables in `dir`, as `read_tables` hands them on.
    pub(in crate::tables) fn read_all(dir: &Path) -> Vec<ProcessRows> {
        let mut read = Vec::new();
        read_tables(dir, &StackStore::new(), |rows| read.push(rows)).unwrap();
        read
    }

    /// A change made to a column of a table.
    type ColumnChange = fn(&arrow_array::ArrayRef) -> arrow_array::ArrayRef;

    /// Rewrites table `name` in `dir` with the rows `take` picks (by
    /// index, from the number of rows) and, where given, column `change`
    /// changed.
    fn rewrite(
        dir: &Path,
        name: &str,
        take: impl FnOnce(u32) -> Vec<u32>,
        change: Option<(&str, ColumnChange)>,
    ) {
        let path = dir.join(name);
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<_> = reader.map(Result::unwrap).collect();
        let whole = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
        let picked = arrow_array::UInt32Array::from(take(whole.num_rows() as u32));
        let schema = whole.schema();
        let columns = (whole.columns().iter().zip(schema.fields()))
            .map(|(c, field)| {
                let taken = arrow_select::take::take(c, &picked, None).unwrap();
                match change {
                    Some((name, change)) if field.name() == name => change(&taken),
                    _ => taken,
                }
            })
            .collect();
        let rewritten = arrow_array::RecordBatch::try_new(schema.clone(), columns).unwrap();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, schema, None).unwrap();
        writer.write(&rewritten).unwrap();
        writer.close().unwrap();
    }

    /// The error `read_tables` gives for the tables in `dir`, having
    /// handed on no process.
    fn refusal(dir: &Path) -> String {
        let mut handed_on = 0;
        let error = read_tables(dir, &StackStore::new(), |_| handed_on += 1).unwrap_err();
        assert_eq!(handed_on, 0, "{error}");
        error.to_string()
    }

    #[test]
    fn tables_export_wrote_are_read_in_one_pass_a_process_at_a_time() {
        let (dir, written) = written_tables("in-order", &seven_ranks());
        assert!(in_order::in_order(&dir, &StackStore::new()).unwrap());
        let read = read_all(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read, written);
    }

    #[test]
    fn tables_in_any_order_give_the_same_rows() {
        // Rank 0's two devices written apart, rank 1 between them.
        let interleaved = [process(0, 0, 2), process(1, 0, 3), process(0, 1, 1)];
        let (dir, written) = written_tables("interleaved", &interleaved);
        assert!(!in_order::in_order(&dir, &StackStore::new()).unwrap());
        assert_eq!(read_all(&dir), written);
        std::fs::remove_dir_all(&dir).unwrap();

        // The sites, the owners, then the checkpoints in reverse order, as
        // a tool sorting them otherwise would leave them: out of order
        // until all three are reversed alike.
        let (dir, written) = written_tables("reversed", &seven_ranks());
        for (name, ordered) in [
            (TABLE_FILES[0], false),
            (TABLE_FILES[3], false),
            (TABLE_FILES[1], true),
        ] {
            rewrite(&dir, name, |n| (0..n).rev().collect(), None);
            assert_eq!(
                in_order::in_order(&dir, &StackStore::new()).unwrap(),
                ordered
            );
            let mut read = read_all(&dir);
            // A checkpoint's sites come in the sites table's order; the
            // processes in the checkpoints table's, each device's
            // checkpoints too.
            for rows in &mut read {
                rows.put_in_order();
                for device in &mut rows.devices {
                    device
                        .sites
                        .iter_mut()
                        .for_each(|s| s.sort_by_key(|s| s.key));
                }
            }
            read.sort_by(|a, b| a.process.cmp(&b.process));
            assert_eq!(read, written, "{name} reversed");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tables_in_order_with_a_bad_row_are_refused_naming_it_and_hand_on_nothing() {
        // A checkpoint row repeated in place: the tables stay in process
        // order, and the row is named.
        let (dir, _) = written_tables("repeated", &seven_ranks());
        rewrite(
            &dir,
            TABLE_FILES[1],
            |n| [0].into_iter().chain(0..n).collect(),
            None,
        );
        let error = refusal(&dir);
        assert!(
            error.contains("checkpoint 0 of rank0 device 0 appears twice"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        // The last site row at a checkpoint its rank does not have.
        let (dir, _) = written_tables("no-checkpoint", &seven_ranks());
        let last_at_nine = |column: &arrow_array::ArrayRef| -> arrow_array::ArrayRef {
            let column = column.as_any().downcast_ref::<UInt32Array>().unwrap();
            let mut values = column.values().to_vec();
            *values.last_mut().unwrap() = 9;
            Arc::new(UInt32Array::from(values))
        };
        rewrite(
            &dir,
            TABLE_FILES[0],
            |n| (0..n).collect(),
            Some(("checkpoint", last_at_nine)),
        );
        let error = refusal(&dir);
        assert!(
            error
                .contains("a row of rank6 device 0 checkpoint 9 has no row in checkpoints.parquet"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
