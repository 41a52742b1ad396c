//! Times a dump's stack keys, then its verdict as `check` and `trend` work
//! it out, in-process: finding its steps by every way in turn (the
//! default), then with each way of cutting given, so that what finding the
//! steps costs shows.
//!
//! ```text
//! cargo run --release -p snapdiff-analyze --example verdict_speed -- FILE
//! ```
//!
//! Prints the mean of each over about a second of repeats, in ms. A way
//! that finds nothing in the trace ends its verdict there, so its time is
//! its search's.

use std::time::{Duration, Instant};

use snapdiff_analyze::trend::CheckpointSource;
use snapdiff_analyze::{NamedSnapshot, StackKeys, TrendOptions, judge_keyed_dumps};

/// The allocator the `snapdiff` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The mean time of `f` over about a second of repeats.
fn mean(mut f: impl FnMut()) -> Duration {
    let started = Instant::now();
    let mut runs = 0;
    while started.elapsed().as_secs_f64() < 1.0 {
        f();
        runs += 1;
    }
    started.elapsed() / runs
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: verdict_speed FILE")?;
    let snap = snapdiff_format::read_path(&path)?;
    let dumps = [NamedSnapshot {
        name: &path,
        snapshot: &snap,
    }];
    let keyed = mean(|| drop(std::hint::black_box(StackKeys::new(&snap))));
    println!("stack keys: {:.3} ms", keyed.as_secs_f64() * 1e3);
    let keys = [StackKeys::new(&snap)];
    let ways = [
        None,
        Some(CheckpointSource::EvenlySpaced),
        Some(CheckpointSource::StepMarks),
        Some(CheckpointSource::SnapshotMarkers),
        Some(CheckpointSource::Annotations),
        Some(CheckpointSource::Iterations),
        Some(CheckpointSource::Calls),
        Some(CheckpointSource::Troughs),
    ];
    for cut in ways {
        if std::env::var("ONLY").is_ok_and(|o| o != format!("{cut:?}")) {
            continue;
        }
        let mut options = TrendOptions::default();
        options.cut = cut;
        let took = mean(|| {
            drop(std::hint::black_box(
                judge_keyed_dumps(&dumps, &keys, |_| None, &options).ok(),
            ))
        });
        let way = cut.map_or("found (the default)".to_owned(), |c| format!("{c:?}"));
        println!("cut {way}: {:.3} ms", took.as_secs_f64() * 1e3);
    }
    Ok(())
}
