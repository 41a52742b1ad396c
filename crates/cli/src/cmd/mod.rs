//! One module per subcommand, each with one entry point, `run`.

mod compare;
mod convert;
mod summary;
mod trend;

use crate::args::{Cli, Command};
use crate::exit::Exit;

/// Runs the parsed command line.
pub(crate) fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Compare(args) => compare::run(args),
        Command::Trend(args) => trend::run(args),
        Command::Summary(args) => summary::run(args),
        Command::Convert(args) => convert::run(args),
    }
}
