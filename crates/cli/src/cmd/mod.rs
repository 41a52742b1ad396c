//! One module per subcommand, each with one entry point, `run`.

mod convert;
mod summary;

use crate::args::{Cli, Command};
use crate::exit::Exit;

/// Runs the parsed command line.
pub(crate) fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Summary(args) => summary::run(args),
        Command::Convert(args) => convert::run(args),
    }
}
