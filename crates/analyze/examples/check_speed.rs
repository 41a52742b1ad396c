//! Times what `snapdiff check` does with one dump, in-process: reading it,
//! then its stack keys, its verdict and its peaks side by side (as `check`
//! works them out), then the check against a baseline of itself. The
//! process's own start is left out: `bench/limits.sh` times the whole
//! command beside it.
//!
//! ```text
//! cargo run --release -p snapdiff-analyze --example check_speed -- FILE
//! ```
//!
//! Prints the mean of each part over about a second of repeats, in ms.

use std::time::{Duration, Instant};

use snapdiff_analyze::baseline::{Baseline, Peaks, Tolerance, check};
use snapdiff_analyze::{NamedSnapshot, StackKeys, TrendOptions, judge_keyed_dumps};

/// The allocator the `snapdiff` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SECONDS: f64 = 1.0;

/// The mean time of `f` over about [`SECONDS`] of repeats.
fn mean(mut f: impl FnMut()) -> Duration {
    let started = Instant::now();
    let mut runs = 0;
    while started.elapsed().as_secs_f64() < SECONDS {
        f();
        runs += 1;
    }
    started.elapsed() / runs
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: check_speed FILE")?;
    let name = path.rsplit('/').next().unwrap_or(&path).to_owned();
    let options = TrendOptions::default();
    let snap = snapdiff_format::read_path(&path)?;
    let baseline_of = || {
        let dumps = [NamedSnapshot {
            name: &name,
            snapshot: &snap,
        }];
        let keys = [StackKeys::new(&snap)];
        let (judged, peaks) = rayon::join(
            || judge_keyed_dumps(&dumps, &keys, |_| None, &options).ok(),
            || Peaks::of_keyed([(&snap, &keys[0])], &options.rules),
        );
        Baseline::with_trend(peaks, judged.as_ref().map(|j| &j.trend))
    };
    let baseline = baseline_of();
    let read = mean(|| drop(std::hint::black_box(snapdiff_format::read_path(&path))));
    let analyse = mean(|| drop(std::hint::black_box(baseline_of())));
    let checked = mean(|| {
        drop(std::hint::black_box(check(
            &baseline,
            &baseline,
            Tolerance::default(),
        )))
    });
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{path}: read {:.2} ms, stack keys, verdict and peaks {:.2} ms, check {:.3} ms; {:.2} ms in all",
        ms(read),
        ms(analyse),
        ms(checked),
        ms(read + analyse + checked)
    );
    Ok(())
}
