//! Reading tables whose rows are in process order, as `export` writes
//! them: one pass over the three tables side by side, holding one
//! process's rows at a time, whatever the number of processes.

use std::hash::BuildHasher;
use std::ops::Range;
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use rustc_hash::{FxBuildHasher, FxHashSet};

use super::read::{
    Batches, Placing, ProcessBuilder, Texts, checkpoint_rows, owner_rows, site_rows,
};
use super::{TABLE_FILES, TableError, checkpoints_schema, file_error, owners_schema, sites_schema};
use crate::stacks::StackStore;
use snapdiff_analyze::rows::ProcessRows;

/// Whether the tables in `dir` are in process order: each process's rows
/// together, the processes in the same order in every table, and every
/// row of the sites and owners tables at a checkpoint of its process.
/// Reads them through, handing on nothing; an error is a table that cannot
/// be read whatever its order.
pub(super) fn in_order(dir: &Path, stacks: &StackStore) -> Result<bool, TableError> {
    read_side_by_side(dir, stacks, None)
}

/// Reads the processes of tables found [`in_order`], handing each to
/// `each` as soon as its rows are read.
pub(super) fn read_in_order(
    dir: &Path,
    stacks: &StackStore,
    mut each: impl FnMut(ProcessRows),
) -> Result<(), TableError> {
    if read_side_by_side(dir, stacks, Some(&mut each))? {
        Ok(())
    } else {
        let path = dir.join(TABLE_FILES[1]);
        Err(file_error(&path, "the tables changed while they were read"))
    }
}

/// One pass over the tables side by side, a process at a time: false, at
/// the first row out of process order.
fn read_side_by_side(
    dir: &Path,
    stacks: &StackStore,
    mut each: Option<&mut dyn FnMut(ProcessRows)>,
) -> Result<bool, TableError> {
    let mut checkpoints = Cursor::open(dir, TABLE_FILES[1], checkpoints_schema())?;
    let mut sites = Cursor::open(dir, TABLE_FILES[0], sites_schema())?;
    let mut owners = Cursor::open_if_there(dir, TABLE_FILES[3], owners_schema())?;
    let (sites_path, owners_path) = (dir.join(TABLE_FILES[0]), dir.join(TABLE_FILES[3]));
    // The processes read so far, by the hash of their name: a name seen
    // again is out of order. Two names of one hash take the other way of
    // reading, which gives the same rows.
    let mut seen: FxHashSet<u64> = FxHashSet::default();
    while let Some(name) = checkpoints.next_process()? {
        if !seen.insert(FxBuildHasher.hash_one(&name)) {
            return Ok(false);
        }
        let mut process = ProcessBuilder::new(&name);
        let mut placed = true;
        checkpoints.take(&name, |batch, rows| {
            let (placing, row) = (Placing::of(batch), checkpoint_rows(batch));
            for i in rows {
                placed &= process.add_checkpoint(placing.at(i), row(i));
            }
            Ok(())
        })?;
        sites.take(&name, |batch, rows| {
            let (placing, row) = (Placing::of(batch), site_rows(batch, &sites_path));
            for i in rows {
                placed &= process.add_site(placing.at(i), row(i)?);
            }
            Ok(())
        })?;
        owners.take(&name, |batch, rows| {
            let (placing, row) = (Placing::of(batch), owner_rows(batch, &owners_path));
            for i in rows {
                let (key, held) = row(i)?;
                placed &= process.add_owner(placing.at(i), key, held);
            }
            Ok(())
        })?;
        if !placed {
            return Ok(false);
        }
        if let Some(each) = each.as_mut() {
            each(process.finish(stacks));
        }
    }
    // Rows left are of processes out of order, or of none in the
    // checkpoints table.
    Ok(sites.next_process()?.is_none() && owners.next_process()?.is_none())
}

/// One table's rows in file order, a batch at a time. A table that is not
/// there (`owners.parquet` of folders written before it was) has no rows.
struct Cursor {
    batches: Option<Batches>,
    batch: Option<RecordBatch>,
    /// The next row of `batch`.
    row: usize,
}

impl Cursor {
    fn open(dir: &Path, name: &str, schema: SchemaRef) -> Result<Cursor, TableError> {
        Ok(Cursor {
            batches: Some(Batches::open(dir, name, schema)?),
            batch: None,
            row: 0,
        })
    }

    /// [`Cursor::open`], or no rows where the table is not there.
    fn open_if_there(dir: &Path, name: &str, schema: SchemaRef) -> Result<Cursor, TableError> {
        match dir.join(name).exists() {
            true => Cursor::open(dir, name, schema),
            false => Ok(Cursor {
                batches: None,
                batch: None,
                row: 0,
            }),
        }
    }

    /// The batch holding the next row, read if need be, and that row;
    /// none at the end.
    fn current(&mut self) -> Result<Option<(RecordBatch, usize)>, TableError> {
        while self.batch.as_ref().is_none_or(|b| self.row >= b.num_rows()) {
            let next = self.batches.as_mut().and_then(Iterator::next);
            self.batch = next.transpose()?;
            self.row = 0;
            if self.batch.is_none() {
                return Ok(None);
            }
        }
        Ok(self.batch.clone().map(|batch| (batch, self.row)))
    }

    /// The process of the next row; none at the end.
    fn next_process(&mut self) -> Result<Option<String>, TableError> {
        Ok(self
            .current()?
            .map(|(batch, row)| Texts::of(&batch, "process").value(row).to_owned()))
    }

    /// Hands `each` the rows from here on while they are of process
    /// `name`, a batch's share at a time.
    fn take(
        &mut self,
        name: &str,
        mut each: impl FnMut(&RecordBatch, Range<usize>) -> Result<(), TableError>,
    ) -> Result<(), TableError> {
        while let Some((batch, start)) = self.current()? {
            let names = Texts::of(&batch, "process");
            // Names are compared once a dictionary entry: a run of rows of
            // one long name costs a comparison of keys a row.
            let mut named = None;
            let end = (start..batch.num_rows())
                .find(|&i| {
                    let key = names.key(i);
                    if named == Some(key) || names.value(i) == name {
                        named = Some(key);
                        return false;
                    }
                    true
                })
                .unwrap_or(batch.num_rows());
            if end == start {
                break;
            }
            self.row = end;
            each(&batch, start..end)?;
        }
        Ok(())
    }
}
