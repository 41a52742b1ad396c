//! A leak test, as you would write it in `tests/`: run a few steps of your
//! code under `LeakCheck`, which fails naming the line that kept memory.
//!
//! ```text
//! cargo run -p snapdiff --example leak_test            # passes
//! cargo run -p snapdiff --example leak_test -- leak    # fails, naming the line
//! ```
//!
//! In a real test the body of `main` is a `#[test]` function and the
//! failure is the test's panic message.

use snapdiff::testing::LeakCheck;
use snapdiff::{Allocator, DeviceBuffer, HostBackend, Stream};

/// One step of "training": activations come and go; with `leak`, one buffer
/// a step is kept in `history`.
fn train_step(a: &Allocator, history: &mut Vec<DeviceBuffer>, leak: bool) {
    let activations: Vec<DeviceBuffer> = (0..4)
        .map(|_| a.alloc(1 << 20, Stream::DEFAULT).unwrap())
        .collect();
    if leak {
        history.push(a.alloc(64 << 10, Stream::DEFAULT).unwrap());
    }
    drop(activations);
}

fn main() {
    let leak = std::env::args().nth(1).as_deref() == Some("leak");
    let a = Allocator::new(HostBackend::with_capacity(1 << 30));
    let mut history = Vec::new();
    // The first step may allocate what lives for the whole run.
    let check = LeakCheck::begin(&a).warmup(1);
    for _ in 0..5 {
        train_step(&a, &mut history, leak);
        check.step();
    }
    check.assert_no_leaks();
    println!("no leak over 5 steps");
}
