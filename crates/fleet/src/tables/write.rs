//! Writing the site tables, a process at a time.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Int64Builder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rustc_hash::{FxHashMap, FxHashSet};
use snapdiff_analyze::{Culprit, CulpritRules, StackKey, describe_site};

use super::{
    TABLE_FILES, TableError, checkpoints_schema, file_error, owners_schema, sites_schema,
    stacks_schema,
};
use snapdiff_runs::rank_of;

use crate::stacks::Stacks;
use snapdiff_analyze::rows::{DeviceRows, ProcessRows};

/// Rows per row group: large enough for fast scans, small enough that a
/// writer buffers tens of megabytes, not the whole table.
const ROWS_PER_GROUP: usize = 1 << 17;

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
