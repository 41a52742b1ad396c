//! `snapdiff-train`: the training job, as a program.

use std::process::ExitCode;

use clap::Parser;

/// Train a small MLP on synthetic data with snapdiff-runtime, optionally
/// reproducing a memory leak.
#[derive(Parser)]
#[command(name = "snapdiff-train", version)]
struct Cli {
    #[command(flatten)]
    args: snapdiff_train::TrainArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match snapdiff_train::run(&cli.args) {
        Ok(report) => {
            if let (Some(first), Some(last)) = (report.losses.first(), report.losses.last()) {
                println!(
                    "loss {first:.4} -> {last:.4} over {} steps",
                    report.losses.len()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("snapdiff-train: {e}");
            ExitCode::from(2)
        }
    }
}
