//! Why an analysis of a snapshot's trace cannot be made.

use snapdiff_format::DeviceName;
use thiserror::Error;

/// Why an analysis of a snapshot's trace cannot be made: the trace lacks
/// what it needs. Its message is one line, as the command prints it.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TraceError {
    /// No trace allocates anything: a trend needs the allocations.
    #[error(
        "the snapshot has no allocations in its trace; record a trace, or give several snapshots"
    )]
    NoAllocations,
    /// No trace allocates anything, so no point of one can be shown.
    #[error(
        "no trace allocates, so there is no point of a trace to show; leave out --at to show \
         the snapshot's live blocks"
    )]
    NoPointToShow,
    /// A way of cutting a trace was asked for that finds nothing in it.
    #[error("{}'s trace has no {what} to cut at", DeviceName(*device))]
    NothingToCutAt {
        /// The device's ordinal.
        device: u32,
        /// What the way cuts at: `step marks`, `annotations`, ...
        what: &'static str,
    },
    /// A step was asked for in a trace that shows none.
    #[error(
        "{}'s trace shows no steps (no step or snapshot markers, annotations or \
         repeating iterations)",
        DeviceName(*device)
    )]
    NoSteps {
        /// The device's ordinal.
        device: u32,
    },
    /// A step was asked for that the trace does not have.
    #[error("{}'s trace has no step {step} (its steps are {first} to {last})", DeviceName(*device))]
    NoSuchStep {
        /// The device's ordinal.
        device: u32,
        /// The step asked for.
        step: u64,
        /// The trace's first step.
        first: u64,
        /// The trace's last step.
        last: u64,
    },
}
