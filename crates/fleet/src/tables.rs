//! The site tables as Parquet files: `sites.parquet`, `checkpoints.parquet`,
//! `stacks.parquet` and `owners.parquet` in one folder (schema in
//! `docs/format.md`).
//!
//! Written and read with the Apache Arrow crates, so that DuckDB, pandas,
//! Spark and any Parquet reader see the same rows the fleet verdict is
//! computed from, and `snapdiff fleet DIR` judges them exactly as it judges
//! the snapshots they came from.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Int64Builder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Int32Array, Int64Array, RecordBatch,
    StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rustc_hash::{FxHashMap, FxHashSet};
use snapdiff_analyze::{Culprit, CulpritRules, HeldBy, SiteTotals, StackKey, describe_site};
use snapdiff_format::Frame;

use crate::rows::{CheckpointRow, DeviceRows, ProcessRows, SiteRow, rank_of};
use crate::stacks::{StackStore, Stacks};

/// The files of a site-table folder. The last, what kept sites' blocks
/// alive (`capture --owners`), may be missing from folders written before
/// it was.
pub const TABLE_FILES: [&str; 4] = [
    "sites.parquet",
    "checkpoints.parquet",
    "stacks.parquet",
    "owners.parquet",
];

/// Rows per row group: large enough for fast scans, small enough that a
/// writer buffers tens of megabytes, not the whole table.
const ROWS_PER_GROUP: usize = 1 << 17;

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

/// Whether `dir` is a site-table folder (it holds `sites.parquet`).
pub fn is_table_folder(dir: &Path) -> bool {
    dir.join(TABLE_FILES[0]).is_file()
}

fn sites_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("process", DataType::Utf8, false),
        Field::new("rank", DataType::UInt32, true),
        Field::new("device", DataType::UInt32, false),
        Field::new("checkpoint", DataType::UInt32, false),
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
    ]))
}

fn checkpoints_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("process", DataType::Utf8, false),
        Field::new("rank", DataType::UInt32, true),
        Field::new("device", DataType::UInt32, false),
        Field::new("checkpoint", DataType::UInt32, false),
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
    ]))
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
    Arc::new(Schema::new(vec![
        Field::new("process", DataType::Utf8, false),
        Field::new("rank", DataType::UInt32, true),
        Field::new("device", DataType::UInt32, false),
        Field::new("checkpoint", DataType::UInt32, false),
        Field::new("stack_key", DataType::Utf8, false),
        Field::new("owner", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("container", DataType::Utf8, true),
        Field::new("example", DataType::Utf8, false),
        Field::new("blocks", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
    ]))
}

/// One table being written: to a hidden file of a name nobody could
/// plant (made new, never through a link), renamed into place when done
/// and removed if it is not.
struct TableFile {
    writer: ArrowWriter<File>,
    schema: SchemaRef,
    partial: tempfile::TempPath,
    path: PathBuf,
}

impl TableFile {
    fn create(dir: &Path, name: &str, schema: SchemaRef) -> Result<TableFile, TableError> {
        let path = dir.join(name);
        let (file, partial) = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .tempfile_in(dir)
            .map_err(|e| file_error(dir, format!("cannot create a temporary file: {e}")))?
            .into_parts();
        let properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(ROWS_PER_GROUP))
            .build();
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(properties))
            .map_err(|e| file_error(&path, e))?;
        Ok(TableFile {
            writer,
            schema,
            partial,
            path,
        })
    }

    fn write(&mut self, columns: Vec<ArrayRef>) -> Result<(), TableError> {
        let batch = RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| file_error(&self.path, e))?;
        if batch.num_rows() > 0 {
            self.writer
                .write(&batch)
                .map_err(|e| file_error(&self.path, e))?;
        }
        Ok(())
    }

    fn finish(self) -> Result<(), TableError> {
        self.writer.close().map_err(|e| file_error(&self.path, e))?;
        self.partial
            .persist(&self.path)
            .map_err(|e| file_error(&self.path, e.error))
    }
}

/// Writes the site tables of a fleet, a process at a time.
pub struct TableWriter {
    sites: TableFile,
    checkpoints: TableFile,
    stacks: TableFile,
    owners: TableFile,
    rules: CulpritRules,
    culprits: FxHashMap<StackKey, Culprit>,
    stacks_written: FxHashSet<StackKey>,
}

impl TableWriter {
    /// Starts the three tables in `dir` (made if missing). Each is written
    /// to a hidden file first, so that a table in place is always whole.
    /// Culprit columns are chosen by `rules`.
    pub fn create(dir: &Path, rules: CulpritRules) -> Result<TableWriter, TableError> {
        std::fs::create_dir_all(dir).map_err(|e| file_error(dir, e))?;
        Ok(TableWriter {
            sites: TableFile::create(dir, TABLE_FILES[0], sites_schema())?,
            checkpoints: TableFile::create(dir, TABLE_FILES[1], checkpoints_schema())?,
            stacks: TableFile::create(dir, TABLE_FILES[2], stacks_schema())?,
            owners: TableFile::create(dir, TABLE_FILES[3], owners_schema())?,
            rules,
            culprits: FxHashMap::default(),
            stacks_written: FxHashSet::default(),
        })
    }

    /// Writes the rows of one process, its checkpoints put in order first,
    /// and the stacks of its sites not written yet.
    pub fn write(&mut self, rows: &mut ProcessRows, stacks: &Stacks) -> Result<(), TableError> {
        rows.put_in_order();
        let rank = rank_of(&rows.process);
        self.write_checkpoints(&rows.process, rank, &rows.devices)?;
        self.write_owners(&rows.process, rank, &rows.devices)?;
        let mut process = StringBuilder::new();
        let mut ranks = UInt32Builder::new();
        let mut devices = UInt32Builder::new();
        let mut indices = UInt32Builder::new();
        let mut steps = UInt64Builder::new();
        let mut times = Int64Builder::new();
        let mut keys = StringBuilder::new();
        let mut functions = StringBuilder::new();
        let mut files = StringBuilder::new();
        let mut lines = UInt32Builder::new();
        let mut categories = StringBuilder::new();
        let mut blocks = UInt64Builder::new();
        let mut live = UInt64Builder::new();
        let mut requested = UInt64Builder::new();
        let mut new_stacks = Vec::new();
        for device in &rows.devices {
            for (index, (checkpoint, sites)) in
                device.checkpoints.iter().zip(&device.sites).enumerate()
            {
                for site in sites {
                    let culprit = self.culprits.entry(site.key).or_insert_with(|| {
                        describe_site(
                            stacks.snapshot(),
                            site.key,
                            stacks.stack(site.key),
                            &self.rules,
                        )
                        .culprit
                    });
                    if self.stacks_written.insert(site.key) {
                        new_stacks.push(site.key);
                    }
                    process.append_value(&rows.process);
                    ranks.append_option(rank);
                    devices.append_value(device.device);
                    indices.append_value(index as u32);
                    steps.append_option(checkpoint.step);
                    times.append_option(checkpoint.time_us);
                    keys.append_value(site.key.to_string());
                    functions.append_value(&culprit.name);
                    files.append_value(&culprit.file);
                    lines.append_value(culprit.line);
                    categories.append_option(stacks.category(site.key).map(category_name));
                    blocks.append_value(site.totals.blocks);
                    live.append_value(site.totals.allocated);
                    requested.append_value(site.totals.bytes);
                }
            }
        }
        self.sites.write(vec![
            Arc::new(process.finish()),
            Arc::new(ranks.finish()),
            Arc::new(devices.finish()),
            Arc::new(indices.finish()),
            Arc::new(steps.finish()),
            Arc::new(times.finish()),
            Arc::new(keys.finish()),
            Arc::new(functions.finish()),
            Arc::new(files.finish()),
            Arc::new(lines.finish()),
            Arc::new(categories.finish()),
            Arc::new(blocks.finish()),
            Arc::new(live.finish()),
            Arc::new(requested.finish()),
        ])?;
        self.write_stacks(&new_stacks, stacks)
    }

    fn write_checkpoints(
        &mut self,
        process: &str,
        rank: Option<u32>,
        devices: &[DeviceRows],
    ) -> Result<(), TableError> {
        let mut names = StringBuilder::new();
        let mut ranks = UInt32Builder::new();
        let mut device_ids = UInt32Builder::new();
        let mut indices = UInt32Builder::new();
        let mut steps = UInt64Builder::new();
        let mut times = Int64Builder::new();
        let mut sources = StringBuilder::new();
        let mut reserved = UInt64Builder::new();
        let mut allocated = UInt64Builder::new();
        let mut active = UInt64Builder::new();
        let mut memory = UInt64Builder::new();
        let mut rss = UInt64Builder::new();
        let mut used = UInt64Builder::new();
        let mut on_cpu = BooleanBuilder::new();
        for device in devices {
            for (index, c) in device.checkpoints.iter().enumerate() {
                names.append_value(process);
                ranks.append_option(rank);
                device_ids.append_value(device.device);
                indices.append_value(index as u32);
                steps.append_option(c.step);
                times.append_option(c.time_us);
                sources.append_value(&c.source);
                reserved.append_value(c.reserved_bytes);
                allocated.append_value(c.allocated_bytes);
                active.append_value(c.active_bytes);
                memory.append_option(c.device_memory);
                rss.append_option(c.rss_bytes);
                used.append_option(c.device_used_bytes);
                on_cpu.append_value(c.recorded_on_cpu);
            }
        }
        self.checkpoints.write(vec![
            Arc::new(names.finish()),
            Arc::new(ranks.finish()),
            Arc::new(device_ids.finish()),
            Arc::new(indices.finish()),
            Arc::new(steps.finish()),
            Arc::new(times.finish()),
            Arc::new(sources.finish()),
            Arc::new(reserved.finish()),
            Arc::new(allocated.finish()),
            Arc::new(active.finish()),
            Arc::new(memory.finish()),
            Arc::new(rss.finish()),
            Arc::new(used.finish()),
            Arc::new(on_cpu.finish()),
        ])
    }

    fn write_owners(
        &mut self,
        process: &str,
        rank: Option<u32>,
        devices: &[DeviceRows],
    ) -> Result<(), TableError> {
        let mut names = StringBuilder::new();
        let mut ranks = UInt32Builder::new();
        let mut device_ids = UInt32Builder::new();
        let mut indices = UInt32Builder::new();
        let mut keys = StringBuilder::new();
        let mut owners = StringBuilder::new();
        let mut kinds = StringBuilder::new();
        let mut containers = StringBuilder::new();
        let mut examples = StringBuilder::new();
        let mut blocks = UInt64Builder::new();
        let mut bytes = UInt64Builder::new();
        for device in devices {
            for (index, sites) in device.owners.iter().enumerate() {
                let Some(sites) = sites else { continue };
                // In key order, so that a table is the same each time.
                let mut sites: Vec<_> = sites.iter().collect();
                sites.sort_by_key(|(key, _)| **key);
                for (key, held) in sites {
                    for h in held {
                        names.append_value(process);
                        ranks.append_option(rank);
                        device_ids.append_value(device.device);
                        indices.append_value(index as u32);
                        keys.append_value(key.to_string());
                        owners.append_value(&h.owner);
                        kinds.append_value(&h.kind);
                        containers.append_option(h.container.as_deref());
                        examples.append_value(&h.example);
                        blocks.append_value(h.blocks);
                        bytes.append_value(h.bytes);
                    }
                }
            }
        }
        self.owners.write(vec![
            Arc::new(names.finish()),
            Arc::new(ranks.finish()),
            Arc::new(device_ids.finish()),
            Arc::new(indices.finish()),
            Arc::new(keys.finish()),
            Arc::new(owners.finish()),
            Arc::new(kinds.finish()),
            Arc::new(containers.finish()),
            Arc::new(examples.finish()),
            Arc::new(blocks.finish()),
            Arc::new(bytes.finish()),
        ])
    }

    fn write_stacks(&mut self, keys: &[StackKey], stacks: &Stacks) -> Result<(), TableError> {
        let mut key_column = StringBuilder::new();
        let mut index = UInt32Builder::new();
        let mut functions = StringBuilder::new();
        let mut files = StringBuilder::new();
        let mut lines = UInt32Builder::new();
        for &key in keys {
            let snapshot = stacks.snapshot();
            for (i, frame) in snapshot.stack_frames(stacks.stack(key)).enumerate() {
                key_column.append_value(key.to_string());
                index.append_value(i as u32);
                functions.append_value(&frame.name);
                files.append_value(&frame.file);
                lines.append_value(frame.line);
            }
        }
        self.stacks.write(vec![
            Arc::new(key_column.finish()),
            Arc::new(index.finish()),
            Arc::new(functions.finish()),
            Arc::new(files.finish()),
            Arc::new(lines.finish()),
        ])
    }

    /// Closes the tables and moves them into place.
    pub fn finish(self) -> Result<(), TableError> {
        self.sites.finish()?;
        self.checkpoints.finish()?;
        self.stacks.finish()?;
        self.owners.finish()
    }
}

/// A category as its JSON names it (`optimizer_state`).
fn category_name(category: snapdiff_analyze::Category) -> String {
    use snapdiff_analyze::Category as C;
    match category {
        C::OptimizerState => "optimizer_state",
        C::Backward => "backward",
        C::Parameters => "parameters",
        C::Activations => "activations",
        C::BeforeRecording => "before_recording",
        C::Unknown => "unknown",
    }
    .to_owned()
}

/// Hands each record batch of one table file, checked against its schema,
/// to `each`, one at a time.
///
/// Memory stays bounded by a batch, whatever the file: batches are not
/// collected, and string columns are read as dictionaries, as Parquet
/// stores them. Read as plain strings, a column of one long value repeated
/// (a few bytes in the file) would be that value copied into every row:
/// 877 KiB of `sites.parquet` once took 3 GiB.
fn for_each_batch(
    dir: &Path,
    name: &str,
    schema: &SchemaRef,
    mut each: impl FnMut(&RecordBatch) -> Result<(), TableError>,
) -> Result<(), TableError> {
    let path = dir.join(name);
    let file = File::open(&path).map_err(|e| file_error(&path, e))?;
    let not_parquet = |e| file_error(&path, format!("not a Parquet file snapdiff can read: {e}"));
    let plain = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(not_parquet)?;
    let fields: Vec<Field> = plain
        .schema()
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                f.as_ref().clone().with_data_type(text_type())
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    let options = ArrowReaderOptions::new().with_schema(Arc::new(Schema::new(fields)));
    let metadata =
        ArrowReaderMetadata::try_new(plain.metadata().clone(), options).map_err(not_parquet)?;
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata)
        .build()
        .map_err(|e| file_error(&path, e))?;
    for batch in reader {
        let batch = batch.map_err(|e| file_error(&path, e))?;
        for field in schema.fields() {
            let column = match batch.column_by_name(field.name()) {
                Some(column) => column,
                None if ADDED_COLUMNS.contains(&field.name().as_str()) => continue,
                None => {
                    let missing = format!("has no column `{}`", field.name());
                    return Err(file_error(&path, missing));
                }
            };
            let expected = match field.data_type() {
                DataType::Utf8 => text_type(),
                other => other.clone(),
            };
            if column.data_type() != &expected {
                return Err(file_error(
                    &path,
                    format!(
                        "column `{}` is {}, not {}",
                        field.name(),
                        column.data_type(),
                        field.data_type()
                    ),
                ));
            }
            if !field.is_nullable() && column.logical_null_count() > 0 {
                return Err(file_error(
                    &path,
                    format!("column `{}` has empty values", field.name()),
                ));
            }
        }
        each(&batch)?;
    }
    Ok(())
}

/// How string columns are read: see [`for_each_batch`].
fn text_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// A string column of a batch checked by [`for_each_batch`].
struct Texts<'b> {
    keys: &'b Int32Array,
    values: &'b StringArray,
}

impl<'b> Texts<'b> {
    fn of(batch: &'b RecordBatch, name: &str) -> Texts<'b> {
        let dictionary = column::<DictionaryArray<Int32Type>>(batch, name);
        Texts {
            keys: dictionary.keys(),
            values: dictionary
                .values()
                .as_any()
                .downcast_ref()
                .expect("a dictionary of strings, checked"),
        }
    }

    fn value(&self, i: usize) -> &'b str {
        self.values.value(self.keys.value(i) as usize)
    }

    fn is_valid(&self, i: usize) -> bool {
        self.keys.is_valid(i)
    }
}

/// A column of a batch already checked by [`for_each_batch`].
fn column<'b, T: Array + 'static>(batch: &'b RecordBatch, name: &str) -> &'b T {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .expect("a column checked against the schema")
}

/// One of [`ADDED_COLUMNS`], where the table has it.
fn added_column<'b, T: Array + 'static>(batch: &'b RecordBatch, name: &str) -> Option<&'b T> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
}

fn parse_key(path: &Path, text: &str) -> Result<StackKey, TableError> {
    u64::from_str_radix(text, 16)
        .map(StackKey)
        .map_err(|_| file_error(path, format!("stack key {text:?} is not 16 hex digits")))
}

fn option<T>(valid: bool, value: T) -> Option<T> {
    valid.then_some(value)
}

/// Checkpoint rows read in one pass over a folder's tables: the ranks of
/// larger folders are read a group at a time, so that what is held is one
/// group's rows (about 6 KB a rank), not the folder's.
const CHECKPOINTS_PER_PASS: usize = 16_384;
/// The most passes over a folder's tables: each reads every row, so past
/// this the groups grow instead (a folder of 100,000 ranks of 10
/// checkpoints is read in 16 passes, not 62).
const MAX_PASSES: usize = 16;

/// Each process of a folder's tables and its checkpoints, from a first
/// pass over `checkpoints.parquet`: what the rows of the other tables are
/// checked against, and how the processes are grouped.
struct TableIndex {
    /// Each process's number, in the order first seen.
    numbers: FxHashMap<String, u32>,
    /// Each process's checkpoint rows, by number.
    checkpoints: Vec<u32>,
    /// Every (process, device, checkpoint) there is.
    known: FxHashSet<(u32, u32, u32)>,
}

impl TableIndex {
    fn of(dir: &Path) -> Result<TableIndex, TableError> {
        let path = dir.join(TABLE_FILES[1]);
        let mut index = TableIndex {
            numbers: FxHashMap::default(),
            checkpoints: Vec::new(),
            known: FxHashSet::default(),
        };
        for_each_batch(dir, TABLE_FILES[1], &checkpoints_schema(), |batch| {
            let names = Texts::of(batch, "process");
            let devices = column::<UInt32Array>(batch, "device");
            let indices = column::<UInt32Array>(batch, "checkpoint");
            for i in 0..batch.num_rows() {
                let name = names.value(i);
                let next = index.numbers.len() as u32;
                let p = *index.numbers.entry(name.to_owned()).or_insert(next);
                if p == next {
                    index.checkpoints.push(0);
                }
                index.checkpoints[p as usize] += 1;
                let (device, checkpoint) = (devices.value(i), indices.value(i));
                if !index.known.insert((p, device, checkpoint)) {
                    return Err(file_error(
                        &path,
                        format!("checkpoint {checkpoint} of {name} device {device} appears twice"),
                    ));
                }
            }
            Ok(())
        })?;
        Ok(index)
    }

    /// The processes in groups of at most `per_pass` checkpoint rows (a
    /// process with more is a group of its own), as ranges of numbers.
    fn groups(&self, per_pass: usize) -> Vec<std::ops::Range<u32>> {
        let mut groups = Vec::new();
        let (mut start, mut rows) = (0, 0);
        for (p, &n) in self.checkpoints.iter().enumerate() {
            if rows > 0 && rows + n as usize > per_pass {
                groups.push(start..p as u32);
                (start, rows) = (p as u32, 0);
            }
            rows += n as usize;
        }
        if rows > 0 {
            groups.push(start..self.checkpoints.len() as u32);
        }
        groups
    }

    /// Whether a row of table `path` for process `name`, (device,
    /// checkpoint) `key`, belongs to `group`; an error when the checkpoints
    /// table has no such checkpoint.
    fn in_group(
        &self,
        path: &Path,
        name: &str,
        key: (u32, u32),
        group: &std::ops::Range<u32>,
    ) -> Result<bool, TableError> {
        match self.numbers.get(name) {
            Some(&p) if self.known.contains(&(p, key.0, key.1)) => Ok(group.contains(&p)),
            _ => Err(file_error(
                path,
                format!(
                    "a row of {name} device {} checkpoint {} has no row in {}",
                    key.0, key.1, TABLE_FILES[1]
                ),
            )),
        }
    }
}

/// Reads the site tables in `dir`, adding the stacks of their sites to
/// `stacks`, and hands each process's rows to `each`, a group of
/// processes at a time (16,384 checkpoint rows a pass, at most 16
/// passes). Every row is checked before the first process is handed on: a
/// folder that cannot be read hands on none.
pub fn read_tables(
    dir: &Path,
    stacks: &StackStore,
    each: impl FnMut(ProcessRows),
) -> Result<(), TableError> {
    read_tables_per_pass(dir, stacks, CHECKPOINTS_PER_PASS, each)
}

/// [`read_tables`], reading the processes of `per_pass` checkpoint rows a
/// pass, or more where [`MAX_PASSES`] would not be enough.
fn read_tables_per_pass(
    dir: &Path,
    stacks: &StackStore,
    per_pass: usize,
    mut each: impl FnMut(ProcessRows),
) -> Result<(), TableError> {
    read_stacks(dir, &mut stacks.write())?;
    let index = TableIndex::of(dir)?;
    let rows = index.checkpoints.iter().map(|&n| n as usize).sum::<usize>();
    for group in index.groups(per_pass.max(rows.div_ceil(MAX_PASSES))) {
        read_group(dir, stacks, &index, &group)?
            .into_iter()
            .for_each(&mut each);
    }
    Ok(())
}

/// Reads `stacks.parquet` into `stacks`.
fn read_stacks(dir: &Path, stacks: &mut Stacks) -> Result<(), TableError> {
    let stacks_path = dir.join(TABLE_FILES[2]);
    // Tables written apart and put together (one folder per task or
    // machine) repeat the stacks they share: each frame is taken once.
    let mut frames: FxHashMap<StackKey, Vec<(u32, Frame)>> = FxHashMap::default();
    let mut seen: FxHashSet<(StackKey, u32)> = FxHashSet::default();
    for_each_batch(dir, TABLE_FILES[2], &stacks_schema(), |batch| {
        let keys = Texts::of(batch, "stack_key");
        let index = column::<UInt32Array>(batch, "frame");
        let functions = Texts::of(batch, "function");
        let files = Texts::of(batch, "file");
        let lines = column::<UInt32Array>(batch, "line");
        for i in 0..batch.num_rows() {
            let key = parse_key(&stacks_path, keys.value(i))?;
            if !seen.insert((key, index.value(i))) {
                continue;
            }
            frames.entry(key).or_default().push((
                index.value(i),
                Frame {
                    name: functions.value(i).into(),
                    file: files.value(i).into(),
                    line: lines.value(i),
                    extra: Vec::new(),
                },
            ));
        }
        Ok(())
    })?;
    for (key, mut frames) in frames {
        frames.sort_by_key(|(i, _)| *i);
        stacks.insert(key, Some(frames.iter().map(|(_, f)| f)), None);
    }
    Ok(())
}

/// The rows of the processes numbered in `group`. The first group's pass
/// checks every row of the tables against `index`; later ones skip the
/// rows of other groups.
fn read_group(
    dir: &Path,
    stacks: &StackStore,
    index: &TableIndex,
    group: &std::ops::Range<u32>,
) -> Result<Vec<ProcessRows>, TableError> {
    let in_group = |name: &str| index.numbers.get(name).is_some_and(|p| group.contains(p));
    // Checkpoints first: they say how many each device has.
    let mut processes: Vec<ProcessRows> = Vec::new();
    let mut index_of: FxHashMap<String, usize> = FxHashMap::default();
    let mut placed: Vec<FxHashMap<(u32, u32), usize>> = Vec::new();
    for_each_batch(dir, TABLE_FILES[1], &checkpoints_schema(), |batch| {
        let names = Texts::of(batch, "process");
        let devices = column::<UInt32Array>(batch, "device");
        let indices = column::<UInt32Array>(batch, "checkpoint");
        let steps = column::<UInt64Array>(batch, "step");
        let times = column::<Int64Array>(batch, "time_us");
        let sources = Texts::of(batch, "source");
        let reserved = column::<UInt64Array>(batch, "reserved_bytes");
        let allocated = column::<UInt64Array>(batch, "allocated_bytes");
        let active = column::<UInt64Array>(batch, "active_bytes");
        let memory = column::<UInt64Array>(batch, "device_memory");
        let rss = added_column::<UInt64Array>(batch, "rss_bytes");
        let used = added_column::<UInt64Array>(batch, "device_used_bytes");
        let on_cpu = added_column::<BooleanArray>(batch, "recorded_on_cpu");
        for i in 0..batch.num_rows() {
            let name = names.value(i);
            if !in_group(name) {
                continue;
            }
            let p = *index_of.entry(name.to_owned()).or_insert_with(|| {
                processes.push(ProcessRows::new(name));
                placed.push(FxHashMap::default());
                processes.len() - 1
            });
            let device = processes[p].device_mut(devices.value(i));
            placed[p].insert(
                (devices.value(i), indices.value(i)),
                device.checkpoints.len(),
            );
            device.checkpoints.push(CheckpointRow {
                step: option(steps.is_valid(i), steps.value(i)),
                time_us: option(times.is_valid(i), times.value(i)),
                source: sources.value(i).to_owned(),
                reserved_bytes: reserved.value(i),
                allocated_bytes: allocated.value(i),
                active_bytes: active.value(i),
                device_memory: option(memory.is_valid(i), memory.value(i)),
                rss_bytes: rss.and_then(|c| option(c.is_valid(i), c.value(i))),
                device_used_bytes: used.and_then(|c| option(c.is_valid(i), c.value(i))),
                recorded_on_cpu: on_cpu.is_some_and(|c| c.is_valid(i) && c.value(i)),
            });
            device.sites.push(Vec::new());
            device.owners.push(None);
        }
        Ok(())
    })?;

    let sites_path = dir.join(TABLE_FILES[0]);
    for_each_batch(dir, TABLE_FILES[0], &sites_schema(), |batch| {
        let names = Texts::of(batch, "process");
        let devices = column::<UInt32Array>(batch, "device");
        let indices = column::<UInt32Array>(batch, "checkpoint");
        let keys = Texts::of(batch, "stack_key");
        let blocks = column::<UInt64Array>(batch, "blocks");
        let live = column::<UInt64Array>(batch, "live_bytes");
        let requested = column::<UInt64Array>(batch, "requested_bytes");
        for i in 0..batch.num_rows() {
            let name = names.value(i);
            let key = (devices.value(i), indices.value(i));
            let stack_key = parse_key(&sites_path, keys.value(i))?;
            if !index.in_group(&sites_path, name, key, group)? {
                continue;
            }
            if !stacks.read().contains(stack_key) {
                // A site without frames: allocations with no stack.
                stacks
                    .write()
                    .insert(stack_key, None::<std::iter::Empty<&Frame>>, None);
            }
            let (p, at) = placed_at(&sites_path, name, key, &index_of, &placed)?;
            let device = processes[p].device_mut(key.0);
            device.sites[at].push(SiteRow {
                key: stack_key,
                totals: SiteTotals {
                    blocks: blocks.value(i),
                    bytes: requested.value(i),
                    allocated: live.value(i),
                },
            });
        }
        Ok(())
    })?;
    if dir.join(TABLE_FILES[3]).exists() {
        read_owners(dir, index, group, &mut processes, &index_of, &placed)?;
    }
    Ok(processes)
}

/// Where a row of table `path` for process `name` and (device,
/// checkpoint) `key` goes: the process's index and the checkpoint's place
/// on its device, from this pass's checkpoints (`index_of`, `placed`).
/// Missing only when the checkpoints table changed since the first pass.
fn placed_at(
    path: &Path,
    name: &str,
    key: (u32, u32),
    index_of: &FxHashMap<String, usize>,
    placed: &[FxHashMap<(u32, u32), usize>],
) -> Result<(usize, usize), TableError> {
    index_of
        .get(name)
        .and_then(|&p| Some((p, *placed[p].get(&key)?)))
        .ok_or_else(|| {
            file_error(
                path,
                format!("{} changed while it was read", TABLE_FILES[1]),
            )
        })
}

/// Reads `owners.parquet` into the rows' owners: a checkpoint with rows
/// there had its owners found.
fn read_owners(
    dir: &Path,
    index: &TableIndex,
    group: &std::ops::Range<u32>,
    processes: &mut [ProcessRows],
    index_of: &FxHashMap<String, usize>,
    placed: &[FxHashMap<(u32, u32), usize>],
) -> Result<(), TableError> {
    let path = dir.join(TABLE_FILES[3]);
    for_each_batch(dir, TABLE_FILES[3], &owners_schema(), |batch| {
        let names = Texts::of(batch, "process");
        let devices = column::<UInt32Array>(batch, "device");
        let indices = column::<UInt32Array>(batch, "checkpoint");
        let keys = Texts::of(batch, "stack_key");
        let owners = Texts::of(batch, "owner");
        let kinds = Texts::of(batch, "kind");
        let containers = Texts::of(batch, "container");
        let examples = Texts::of(batch, "example");
        let blocks = column::<UInt64Array>(batch, "blocks");
        let bytes = column::<UInt64Array>(batch, "bytes");
        for i in 0..batch.num_rows() {
            let name = names.value(i);
            let key = (devices.value(i), indices.value(i));
            let stack_key = parse_key(&path, keys.value(i))?;
            if !index.in_group(&path, name, key, group)? {
                continue;
            }
            let (p, at) = placed_at(&path, name, key, index_of, placed)?;
            let device = processes[p].device_mut(key.0);
            device.owners[at]
                .get_or_insert_with(Default::default)
                .entry(stack_key)
                .or_default()
                .push(HeldBy {
                    owner: owners.value(i).to_owned(),
                    kind: kinds.value(i).to_owned(),
                    container: option(containers.is_valid(i), containers.value(i).to_owned()),
                    example: examples.value(i).to_owned(),
                    blocks: blocks.value(i),
                    bytes: bytes.value(i),
                    blocks_per_step: None,
                });
        }
        Ok(())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{DeviceRows, empty_checkpoint};

    /// Process `rank`'s rows: `checkpoints` checkpoints on device 0, each
    /// holding `rank` MiB at site 1 and its step's KiB at site 2.
    fn process(rank: u64, checkpoints: u64) -> ProcessRows {
        let mut rows = ProcessRows::new(format!("rank{rank}"));
        rows.devices.push(DeviceRows {
            device: 0,
            checkpoints: (0..checkpoints)
                .map(|step| CheckpointRow {
                    step: Some(step),
                    source: format!("rank{rank}-step{step}.pickle"),
                    ..empty_checkpoint()
                })
                .collect(),
            sites: (0..checkpoints)
                .map(|step| {
                    [(1, rank << 20), (2, step << 10)]
                        .map(|(key, bytes)| SiteRow {
                            key: StackKey(key),
                            totals: SiteTotals {
                                blocks: 1,
                                bytes,
                                allocated: bytes,
                            },
                        })
                        .to_vec()
                })
                .collect(),
            owners: vec![None; checkpoints as usize],
        });
        rows
    }

    #[test]
    fn tables_read_a_few_ranks_a_pass_give_every_ranks_rows() {
        let dir = std::env::temp_dir().join(format!("snapdiff-tables-{}", std::process::id()));
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
        let mut written: Vec<ProcessRows> = (0..7).map(|r| process(r, 1 + r % 3)).collect();
        let mut tables = TableWriter::create(&dir, CulpritRules::default()).unwrap();
        for rows in &mut written {
            tables.write(rows, &stacks).unwrap();
        }
        tables.finish().unwrap();

        // 12 checkpoint rows, at most 3 a pass: ranks in groups of their
        // checkpoints (1 + 2, 3, 1 + 2, 3, 1), every row read once.
        let index = TableIndex::of(&dir).unwrap();
        assert_eq!(index.groups(3), [0..2, 2..3, 3..5, 5..6, 6..7]);
        let mut read = Vec::new();
        read_tables_per_pass(&dir, &StackStore::new(), 3, |rows| read.push(rows)).unwrap();
        let mut whole = Vec::new();
        read_tables(&dir, &StackStore::new(), |rows| whole.push(rows)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read, whole);
        assert_eq!(read, written);
    }
}
