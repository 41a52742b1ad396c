//! Runs: which process wrote each snapshot file, and which run of it.
//!
//! Every command that reads more than one file asks the same two
//! questions before it judges anything, and answers them here, by one
//! rule:
//!
//! - [`process_of`]: the process (a rank) that wrote a file: as its name
//!   says (`rank3-step40.pickle`), else its manifest, else the process id
//!   it records, else its folder (`rank3/step40.pickle`, or the folder
//!   itself). Files of different processes are never one series.
//! - [`Run`]: which run of that process: the process id and machine where
//!   the file or its manifest says, else the folder that holds the
//!   process's files, split where its dumps pause far longer than their
//!   spacing ([`time_jumps`]). [`choose`] picks the runs of one process to judge:
//!   the latest, and every run not known to have ended before it began,
//!   each then judged apart under a name [`names_apart`] gives. Two runs
//!   are never one series.
//! - [`manifest`]: what capture's `manifest.jsonl` says of each dump
//!   (step, time, process, machine), read in one place.
//! - [`census`]: the files many ranks' commands read (`fleet`, `export`,
//!   `report --fleet`): snapshot files, folders searched, globs, lists of
//!   paths and folders of site tables, walked twice so that each process's
//!   files are handed on as soon as all are found.

#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod inputs;
pub mod manifest;
mod process;
mod run;

pub use crate::inputs::{
    Census, TABLE_FILES, Unreadable, census, is_table_folder, with_paths_from,
};
pub use crate::process::{
    by_process, group, process_named, process_of, process_said, rank_of, wanted,
};
pub use crate::run::{
    Choice, Run, Span, choose, folder_steps_are_one_run, names_apart, time_jumps,
};
