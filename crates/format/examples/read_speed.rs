//! Times `read_bytes` in-process: for each file given, the best time of
//! repeated reads over about `SECONDS` seconds, each read including dropping
//! the snapshot (as CPython's time includes freeing what it built).
//!
//! `bench/pickle_read.py --fixtures` runs it in rounds, alternating with
//! CPython's `pickle.loads` of the same bytes, so that both see the same
//! machine; it prints one line per file: `<path> <best ms>`.
//!
//! `cargo run --release -p snapdiff-format --example read_speed -- FILE...`

use std::time::{Duration, Instant};

/// The allocator the `snapdiff` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SECONDS: f64 = 1.0;

fn main() {
    for path in std::env::args().skip(1) {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut best = Duration::MAX;
        let started = Instant::now();
        while started.elapsed().as_secs_f64() < SECONDS {
            let t = Instant::now();
            drop(snapdiff_format::read_bytes(&bytes).unwrap_or_else(|e| panic!("{path}: {e}")));
            best = best.min(t.elapsed());
        }
        println!("{path} {:.4}", best.as_secs_f64() * 1e3);
    }
}
