//! Reading tables whose rows are in any order: the processes a group at a
//! time, each group a pass over every table.

use std::ops::Range;
use std::path::Path;

use rustc_hash::{FxHashMap, FxHashSet};

use super::read::{Batches, Placing, ProcessBuilder, checkpoint_rows, owner_rows, site_rows};
use super::{TABLE_FILES, TableError, checkpoints_schema, file_error, owners_schema, sites_schema};
use crate::stacks::StackStore;
use snapdiff_analyze::rows::ProcessRows;

/// Checkpoint rows read in one pass over a folder's tables: the ranks of
/// larger folders are read a group at a time, so that what is held is one
/// group's rows (about 6 KB a rank), not the folder's.
pub(super) const CHECKPOINTS_PER_PASS: usize = 16_384;
/// The most passes over a folder's tables: each reads every row, so past
/// this the groups grow instead (a folder of 100,000 ranks of 10
/// checkpoints is read in 16 passes, not 62).
const MAX_PASSES: usize = 16;

/// Reads the processes of the tables in `dir`, `per_pass` checkpoint rows
/// a pass (or more where [`MAX_PASSES`] would not be enough), handing each
/// to `each`. The first pass checks every row: a folder that cannot be
/// read hands on none.
pub(super) fn read_in_groups(
    dir: &Path,
    stacks: &StackStore,
    per_pass: usize,
    mut each: impl FnMut(ProcessRows),
) -> Result<(), TableError> {
    let index = TableIndex::of(dir)?;
    let rows = index.checkpoints.iter().map(|&n| n as usize).sum::<usize>();
    for group in index.groups(per_pass.max(rows.div_ceil(MAX_PASSES))) {
        read_group(dir, stacks, &index, &group)?
            .into_iter()
            .for_each(&mut each);
    }
    Ok(())
}

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
        let mut index = TableIndex {
            numbers: FxHashMap::default(),
            checkpoints: Vec::new(),
            known: FxHashSet::default(),
        };
        let mut batches = Batches::open(dir, TABLE_FILES[1], checkpoints_schema())?;
        while let Some(batch) = batches.next() {
            let batch = batch?;
            let placing = Placing::of(&batch);
            for i in 0..batch.num_rows() {
                let name = placing.process(i);
                let next = index.numbers.len() as u32;
                let p = *index.numbers.entry(name.to_owned()).or_insert(next);
                if p == next {
                    index.checkpoints.push(0);
                }
                index.checkpoints[p as usize] += 1;
                let (device, checkpoint) = placing.at(i);
                if !index.known.insert((p, device, checkpoint)) {
                    return Err(file_error(
                        batches.path(),
                        format!("checkpoint {checkpoint} of {name} device {device} appears twice"),
                    ));
                }
            }
        }
        Ok(index)
    }

    /// The processes in groups of at most `per_pass` checkpoint rows (a
    /// process with more is a group of its own), as ranges of numbers.
    fn groups(&self, per_pass: usize) -> Vec<Range<u32>> {
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
    /// checkpoint) `at`, belongs to `group`; an error when the checkpoints
    /// table has no such checkpoint.
    fn in_group(
        &self,
        path: &Path,
        name: &str,
        at: (u32, u32),
        group: &Range<u32>,
    ) -> Result<bool, TableError> {
        match self.numbers.get(name) {
            Some(&p) if self.known.contains(&(p, at.0, at.1)) => Ok(group.contains(&p)),
            _ => Err(file_error(
                path,
                format!(
                    "a row of {name} device {} checkpoint {} has no row in {}",
                    at.0, at.1, TABLE_FILES[1]
                ),
            )),
        }
    }
}

/// The rows of the processes numbered in `group`. The first group's pass
/// checks every row of the tables against `index`; later ones skip the
/// rows of other groups.
fn read_group(
    dir: &Path,
    stacks: &StackStore,
    index: &TableIndex,
    group: &Range<u32>,
) -> Result<Vec<ProcessRows>, TableError> {
    // Checkpoints first: they say how many each device has.
    let mut processes: Vec<ProcessBuilder> = Vec::new();
    let mut index_of: FxHashMap<String, usize> = FxHashMap::default();
    for batch in Batches::open(dir, TABLE_FILES[1], checkpoints_schema())? {
        let batch = batch?;
        let (placing, row) = (Placing::of(&batch), checkpoint_rows(&batch));
        for i in 0..batch.num_rows() {
            let name = placing.process(i);
            if !index.numbers.get(name).is_some_and(|p| group.contains(p)) {
                continue;
            }
            let p = *index_of.entry(name.to_owned()).or_insert_with(|| {
                processes.push(ProcessBuilder::new(name));
                processes.len() - 1
            });
            processes[p].add_checkpoint(placing.at(i), row(i));
        }
    }

    // Then the rows placed at them.
    let changed = |path: &Path| {
        file_error(
            path,
            format!("{} changed while it was read", TABLE_FILES[1]),
        )
    };
    let mut sites = Batches::open(dir, TABLE_FILES[0], sites_schema())?;
    while let Some(batch) = sites.next() {
        let batch = batch?;
        let path = sites.path();
        let (placing, row) = (Placing::of(&batch), site_rows(&batch, path));
        for i in 0..batch.num_rows() {
            let (name, at) = (placing.process(i), placing.at(i));
            let site = row(i)?;
            if !index.in_group(path, name, at, group)? {
                continue;
            }
            let p = index_of.get(name).ok_or_else(|| changed(path))?;
            if !processes[*p].add_site(at, site) {
                return Err(changed(path));
            }
        }
    }
    if dir.join(TABLE_FILES[3]).exists() {
        let mut owners = Batches::open(dir, TABLE_FILES[3], owners_schema())?;
        while let Some(batch) = owners.next() {
            let batch = batch?;
            let path = owners.path();
            let (placing, row) = (Placing::of(&batch), owner_rows(&batch, path));
            for i in 0..batch.num_rows() {
                let (name, at) = (placing.process(i), placing.at(i));
                let (key, held) = row(i)?;
                if !index.in_group(path, name, at, group)? {
                    continue;
                }
                let p = index_of.get(name).ok_or_else(|| changed(path))?;
                if !processes[*p].add_owner(at, key, held) {
                    return Err(changed(path));
                }
            }
        }
    }
    Ok(processes.into_iter().map(|p| p.finish(stacks)).collect())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{read_all, seven_ranks, written_tables};
    use super::*;

    #[test]
    fn tables_read_a_few_ranks_a_pass_give_every_ranks_rows() {
        let (dir, written) = written_tables("groups", &seven_ranks());
        // 12 checkpoint rows, at most 3 a pass: ranks in groups of their
        // checkpoints (1 + 2, 3, 1 + 2, 3, 1), every row read once.
        let index = TableIndex::of(&dir).unwrap();
        assert_eq!(index.groups(3), [0..2, 2..3, 3..5, 5..6, 6..7]);
        let mut read = Vec::new();
        read_in_groups(&dir, &StackStore::new(), 3, |rows| read.push(rows)).unwrap();
        let whole = read_all(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read, whole);
        assert_eq!(read, written);
    }
}
