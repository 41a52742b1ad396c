//! The pieces of every text report, one concern a file: tables with
//! snapdiff's look ([`table`](fn@table)), cells naming a site, colour, numbers
//! for people, and the writer that keeps a file's control characters off
//! the terminal ([`TerminalText`]).

mod color;
mod human;
mod site;
mod table;
mod terminal;

pub use color::{delta_colored, grew, shrank};
pub use human::{count, delta, duration, size, sparkline};
pub use site::{paths_base, paths_note, site_cell, site_cell_before, where_stacks_differ};
pub use table::{add_rows, align_right, table, write_table};
pub use terminal::TerminalText;
