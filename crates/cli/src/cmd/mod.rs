//! One module per subcommand, each with one entry point, `run`.

mod baseline;
mod capture;
mod check;
mod compare;
mod convert;
mod demo;
mod export;
mod flamegraph;
mod fleet;
mod oom;
mod peak;
mod pprof;
mod report;
mod steps;
mod summary;
mod trend;
mod watch;

use crate::args::{Cli, Command};
use crate::exit::Exit;

/// Runs the parsed command line.
pub(crate) fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Capture(args) => capture::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Trend(args) => trend::run(args),
        Command::Baseline(args) => baseline::run(args),
        Command::Check(args) => check::run(args),
        Command::Fleet(args) => fleet::run(args),
        Command::Watch(args) => watch::run(args),
        Command::Export(args) => export::run(args),
        Command::Summary(args) => summary::run(args),
        Command::Peak(args) => peak::run(args),
        Command::Oom(args) => oom::run(args),
        Command::Steps(args) => steps::run(args),
        Command::Report(args) => report::run(args),
        Command::Flamegraph(args) => flamegraph::run(args),
        Command::Pprof(args) => pprof::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Completions(args) => {
            use clap::CommandFactory;
            let mut command = crate::args::Cli::command();
            clap_complete::generate(args.shell, &mut command, "snapdiff", &mut std::io::stdout());
            Ok(Exit::Clean)
        }
        Command::Man(_) => {
            use clap::CommandFactory;
            clap_mangen::Man::new(crate::args::Cli::command()).render(&mut std::io::stdout())?;
            Ok(Exit::Clean)
        }
        Command::Train(args) => match snapdiff_train::run(&args) {
            Ok(_) => Ok(Exit::Clean),
            Err(e) => Err(anyhow::anyhow!("train: {e}")),
        },
    }
}
