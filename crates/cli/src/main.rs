//! The `snapdiff` command: argument parsing, reading files, and dispatch.
//!
//! All analysis lives in `snapdiff-analyze` and all output in
//! `snapdiff-render`; this crate only turns flags into options, reads the
//! files, calls them, and picks the exit code (see `crates/cli/README.md`).

mod args;
mod cmd;
mod exit;
mod input;
mod job;
mod judging;
mod live;
mod output;
mod owners;
mod pictures;
mod reports;

use std::process::ExitCode;

use clap::Parser;

/// Reading a snapshot makes millions of small allocations (frames, events,
/// blocks) and frees them all at once; with mimalloc, reading the real
/// PyTorch fixtures takes up to a fifth less time than with glibc's
/// allocator (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    input::leave_memory_at_exit();
    // `capture` owns the job's signals from its first moment, before the
    // arguments are even parsed (see cmd::capture).
    if std::env::args_os().nth(1).is_some_and(|a| a == "capture") {
        job::catch_signals();
    }
    let cli = args::Cli::parse();
    output::choose_colors(cli.color);
    match cmd::run(cli) {
        Ok(code) => code.into(),
        Err(err) => {
            // A closed pipe (`snapdiff ... | head`) is not an error, as for other Unix tools.
            let broken_pipe = err.chain().any(|e| {
                let io_kind = e
                    .downcast_ref::<std::io::Error>()
                    .map(std::io::Error::kind)
                    .or_else(|| {
                        e.downcast_ref::<serde_json::Error>()
                            .and_then(|j| j.io_error_kind())
                    });
                io_kind == Some(std::io::ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                return ExitCode::SUCCESS;
            }
            eprintln!(
                "snapdiff: {}",
                snapdiff_format::visible::escaped(&one_line(&err))
            );
            exit::Exit::Error.into()
        }
    }
}

/// The error and its causes on one line, each said once: a cause whose text
/// the message already holds (the file readers' errors include their I/O
/// cause) is not repeated.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}
