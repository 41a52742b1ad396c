//! What both ways of reading the tables share: each file's batches checked
//! against its schema, a batch's rows as the fleet's rows, and one
//! process's rows put together.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    Array, BooleanArray, DictionaryArray, Int32Array, Int64Array, RecordBatch, StringArray,
    UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use rustc_hash::{FxHashMap, FxHashSet};
use snapdiff_analyze::{HeldBy, SiteTotals, StackKey};
use snapdiff_format::Frame;

use super::{ADDED_COLUMNS, TABLE_FILES, TableError, file_error, stacks_schema};
use crate::stacks::{StackStore, Stacks};
use snapdiff_analyze::rows::{CheckpointRow, ProcessRows, SiteRow};

/// The record batches of one table file, each checked against its schema,
/// one at a time.
///
/// Memory stays bounded by a batch, whatever the file: batches are not
/// collected, and string columns are read as dictionaries, as Parquet
/// stores them. Read as plain strings, a column of one long value repeated
/// (a few bytes in the file) would be that value copied into every row:
/// 877 KiB of `sites.parquet` once took 3 GiB.
pub(super) struct Batches {
    path: PathBuf,
    schema: SchemaRef,
    reader: ParquetRecordBatchReader,
}

impl Batches {
    /// Opens table `name` in `dir`, to be checked against `schema`.
    pub(super) fn open(dir: &Path, name: &str, schema: SchemaRef) -> Result<Batches, TableError> {
        let path = dir.join(name);
        let file = snapdiff_format::open_regular(&path).map_err(|e| file_error(&path, e))?;
        let not_parquet =
            |e| file_error(&path, format!("not a Parquet file snapdiff can read: {e}"));
        let plain =
            ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(not_parquet)?;
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
        Ok(Batches {
            path,
            schema,
            reader,
        })
    }

    /// The file these batches are read from.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `batch` has the columns of the schema, of its types, and
    /// values where they cannot be empty.
    fn check(&self, batch: &RecordBatch) -> Result<(), TableError> {
        for field in self.schema.fields() {
            let column = match batch.column_by_name(field.name()) {
                Some(column) => column,
                None if ADDED_COLUMNS.contains(&field.name().as_str()) => continue,
                None => {
                    let missing = format!("has no column `{}`", field.name());
                    return Err(file_error(&self.path, missing));
                }
            };
            let expected = match field.data_type() {
                DataType::Utf8 => text_type(),
                other => other.clone(),
            };
            if column.data_type() != &expected {
                return Err(file_error(
                    &self.path,
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
                    &self.path,
                    format!("column `{}` has empty values", field.name()),
                ));
            }
        }
        Ok(())
    }
}

impl Iterator for Batches {
    type Item = Result<RecordBatch, TableError>;

    fn next(&mut self) -> Option<Self::Item> {
        let batch = match self.reader.next()? {
            Ok(batch) => batch,
            Err(e) => return Some(Err(file_error(&self.path, e))),
        };
        Some(self.check(&batch).map(|()| batch))
    }
}

/// How string columns are read: see [`Batches`].
fn text_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// A string column of a batch checked by [`Batches`].
pub(super) struct Texts<'b> {
    keys: &'b Int32Array,
    values: &'b StringArray,
}

impl<'b> Texts<'b> {
    pub(super) fn of(batch: &'b RecordBatch, name: &str) -> Texts<'b> {
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

    pub(super) fn value(&self, i: usize) -> &'b str {
        self.values.value(self.keys.value(i) as usize)
    }

    /// Row `i`'s entry in the dictionary: rows of one key have one value.
    pub(super) fn key(&self, i: usize) -> i32 {
        self.keys.value(i)
    }

    fn is_valid(&self, i: usize) -> bool {
        self.keys.is_valid(i)
    }
}

/// A column of a batch checked by [`Batches`].
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

/// Where a row of the sites, checkpoints or owners table belongs: its
/// process, and its device and checkpoint.
pub(super) struct Placing<'b> {
    names: Texts<'b>,
    devices: &'b UInt32Array,
    indices: &'b UInt32Array,
}

impl<'b> Placing<'b> {
    pub(super) fn of(batch: &'b RecordBatch) -> Placing<'b> {
        Placing {
            names: Texts::of(batch, "process"),
            devices: column(batch, "device"),
            indices: column(batch, "checkpoint"),
        }
    }

    pub(super) fn process(&self, i: usize) -> &'b str {
        self.names.value(i)
    }

    /// The row's (device, checkpoint).
    pub(super) fn at(&self, i: usize) -> (u32, u32) {
        (self.devices.value(i), self.indices.value(i))
    }
}

/// The rows of a batch of `checkpoints.parquet`.
pub(super) fn checkpoint_rows(batch: &RecordBatch) -> impl Fn(usize) -> CheckpointRow + '_ {
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
    move |i| CheckpointRow {
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
        ..CheckpointRow::default()
    }
}

/// The rows of a batch of `sites.parquet` (read from `path`).
pub(super) fn site_rows<'b>(
    batch: &'b RecordBatch,
    path: &'b Path,
) -> impl Fn(usize) -> Result<SiteRow, TableError> + 'b {
    let keys = Texts::of(batch, "stack_key");
    let blocks = column::<UInt64Array>(batch, "blocks");
    let live = column::<UInt64Array>(batch, "live_bytes");
    let requested = column::<UInt64Array>(batch, "requested_bytes");
    move |i| {
        Ok(SiteRow {
            key: parse_key(path, keys.value(i))?,
            totals: SiteTotals {
                blocks: blocks.value(i),
                bytes: requested.value(i),
                allocated: live.value(i),
            },
        })
    }
}

/// The rows of a batch of `owners.parquet` (read from `path`): a site's
/// stack key and one of what held its blocks.
pub(super) fn owner_rows<'b>(
    batch: &'b RecordBatch,
    path: &'b Path,
) -> impl Fn(usize) -> Result<(StackKey, HeldBy), TableError> + 'b {
    let keys = Texts::of(batch, "stack_key");
    let owners = Texts::of(batch, "owner");
    let kinds = Texts::of(batch, "kind");
    let containers = Texts::of(batch, "container");
    let examples = Texts::of(batch, "example");
    let blocks = column::<UInt64Array>(batch, "blocks");
    let bytes = column::<UInt64Array>(batch, "bytes");
    move |i| {
        let held = HeldBy {
            owner: owners.value(i).to_owned(),
            kind: kinds.value(i).to_owned(),
            container: option(containers.is_valid(i), containers.value(i).to_owned()),
            example: examples.value(i).to_owned(),
            blocks: blocks.value(i),
            bytes: bytes.value(i),
            blocks_per_step: None,
        };
        Ok((parse_key(path, keys.value(i))?, held))
    }
}

/// One process's rows as they are read: its checkpoints first, then the
/// rows of the other tables put at their checkpoint.
pub(super) struct ProcessBuilder {
    rows: ProcessRows,
    /// Each (device, checkpoint)'s place among its device's checkpoints.
    placed: FxHashMap<(u32, u32), usize>,
}

impl ProcessBuilder {
    pub(super) fn new(process: &str) -> ProcessBuilder {
        ProcessBuilder {
            rows: ProcessRows::new(process),
            placed: FxHashMap::default(),
        }
    }

    /// Adds checkpoint `at` (device, checkpoint); false, adding nothing,
    /// if it was already there.
    pub(super) fn add_checkpoint(&mut self, at: (u32, u32), row: CheckpointRow) -> bool {
        if self.placed.contains_key(&at) {
            return false;
        }
        let device = self.rows.device_mut(at.0);
        self.placed.insert(at, device.checkpoints.len());
        device.checkpoints.push(row);
        device.sites.push(Vec::new());
        device.owners.push(None);
        true
    }

    /// Adds a site to checkpoint `at`; false if there is no such checkpoint.
    pub(super) fn add_site(&mut self, at: (u32, u32), site: SiteRow) -> bool {
        let Some(&place) = self.placed.get(&at) else {
            return false;
        };
        self.rows.device_mut(at.0).sites[place].push(site);
        true
    }

    /// Adds what held blocks of site `key` at checkpoint `at`: a
    /// checkpoint with such rows had its owners found. False if there is no
    /// such checkpoint.
    pub(super) fn add_owner(&mut self, at: (u32, u32), key: StackKey, held: HeldBy) -> bool {
        let Some(&place) = self.placed.get(&at) else {
            return false;
        };
        self.rows.device_mut(at.0).owners[place]
            .get_or_insert_with(Default::default)
            .entry(key)
            .or_default()
            .push(held);
        true
    }

    /// The process's rows. A site whose stack `stacks.parquet` did not
    /// give is added to `stacks` without frames: allocations with no stack.
    pub(super) fn finish(self, stacks: &StackStore) -> ProcessRows {
        let sites = || {
            self.rows
                .devices
                .iter()
                .flat_map(|d| d.sites.iter().flatten())
        };
        let frameless: Vec<StackKey> = {
            let known = stacks.read();
            sites()
                .map(|s| s.key)
                .filter(|&k| !known.contains(k))
                .collect()
        };
        if !frameless.is_empty() {
            let mut stacks = stacks.write();
            for key in frameless {
                stacks.insert(key, None::<std::iter::Empty<&Frame>>, None);
            }
        }
        self.rows
    }
}

/// Reads `stacks.parquet` into `stacks`.
pub(super) fn read_stacks(dir: &Path, stacks: &mut Stacks) -> Result<(), TableError> {
    let stacks_path = dir.join(TABLE_FILES[2]);
    // Tables written apart and put together (one folder per task or
    // machine) repeat the stacks they share: each frame is taken once.
    let mut frames: FxHashMap<StackKey, Vec<(u32, Frame)>> = FxHashMap::default();
    let mut seen: FxHashSet<(StackKey, u32)> = FxHashSet::default();
    for batch in Batches::open(dir, TABLE_FILES[2], stacks_schema())? {
        let batch = &batch?;
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
    }
    for (key, mut frames) in frames {
        frames.sort_by_key(|(i, _)| *i);
        stacks.insert(key, Some(frames.iter().map(|(_, f)| f)), None);
    }
    Ok(())
}
