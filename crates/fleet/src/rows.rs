//! The site tables of one process: its snapshots (or its one trace) read
//! into the judge's rows (see [`snapdiff_analyze::rows`]), their stacks
//! kept once for the whole fleet.

use snapdiff_analyze::held_by::SiteOwners;
use snapdiff_analyze::rows::{Devices, ProcessRows};
use snapdiff_analyze::{StackKeys, TraceError, TrendOptions};
use snapdiff_format::Snapshot;

use crate::stacks::StackStore;

impl StackStore {
    /// Adds `snap`, read from `source`, to `rows` as one checkpoint of
    /// each device it holds segments on, `owners` (what kept its sites'
    /// blocks alive, when known) beside them; the stacks of its live sites
    /// are kept here.
    pub fn add_snapshot(
        &self,
        rows: &mut ProcessRows,
        source: &str,
        snap: &Snapshot,
        owners: Option<&SiteOwners>,
    ) {
        let stacks = rows.add_snapshot(source, snap, owners, Devices::EachApart);
        self.add_from(snap, stacks.into_iter());
    }

    /// Adds the trace of `snap`, read from `source`, to `rows`, each busy
    /// device's cut into checkpoints as `trend` cuts a process's one file;
    /// the stacks of its sites are kept here.
    ///
    /// # Errors
    ///
    /// When no device's trace records an allocation, or one cannot be cut
    /// as `options` asks.
    pub fn add_trace(
        &self,
        rows: &mut ProcessRows,
        source: &str,
        snap: &Snapshot,
        options: &TrendOptions,
    ) -> Result<(), TraceError> {
        let stacks = rows.add_trace(source, snap, &StackKeys::new(snap), options)?;
        self.add_from(snap, stacks.into_iter());
        Ok(())
    }
}
