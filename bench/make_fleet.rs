//! Writes a generated job of many ranks for `snapdiff fleet`'s benchmark:
//! `cargo run --release --example make_fleet -- SOURCE RANKS STEPS DIR`,
//! SOURCE a real PyTorch snapshot with a trace (see `tests/fleet_job.rs`
//! for what the ranks do). Prints what a right verdict says, as JSON.

#[allow(
    dead_code,
    reason = "the tests' replay module; the generator uses part of it"
)]
#[path = "../tests/pytorch_replay.rs"]
mod pytorch_replay;

#[path = "../tests/fleet_job.rs"]
mod fleet_job;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [source, ranks, steps, dir] = args.as_slice() else {
        eprintln!("usage: make_fleet SOURCE RANKS STEPS DIR");
        std::process::exit(2);
    };
    let (Ok(ranks), Ok(steps)) = (ranks.parse(), steps.parse()) else {
        eprintln!("make_fleet: RANKS and STEPS are numbers");
        std::process::exit(2);
    };
    let truth = fleet_job::make_fleet(source.as_ref(), ranks, steps, dir.as_ref());
    println!(
        "{}",
        serde_json::to_string_pretty(&truth).expect("a truth as JSON")
    );
}
