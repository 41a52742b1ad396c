//! A training loop on the recording allocator, with the host backend that
//! runs anywhere: allocate, mark steps, and dump snapshots to read with
//! `snapdiff`.
//!
//! ```text
//! cargo run -p snapdiff-runtime --example record_a_loop -- DIR
//! snapdiff trend DIR
//! ```
//!
//! Each step allocates activations and frees them, and keeps one buffer in
//! a history list: the leak `snapdiff trend` names by this file's line.

use snapdiff_runtime::{Allocator, DeviceBuffer, HostBackend, Stream};

fn step(a: &Allocator, history: &mut Vec<DeviceBuffer>) -> Result<(), Box<dyn std::error::Error>> {
    let activations: Vec<DeviceBuffer> = (0..4)
        .map(|_| a.alloc(1 << 20, Stream::DEFAULT))
        .collect::<Result<_, _>>()?;
    history.push(a.alloc(64 << 10, Stream::DEFAULT)?); // kept every step
    drop(activations);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: record_a_loop DIR")?;
    std::fs::create_dir_all(&dir)?;
    let a = Allocator::new(HostBackend::with_capacity(1 << 30));
    let mut history = Vec::new();
    for n in 1..=6 {
        a.mark_step(n);
        step(&a, &mut history)?;
        a.dump(format!("{dir}/step-{n}.snap"))?;
    }
    let stats = a.stats();
    println!(
        "{} blocks live, {} bytes allocated; snapshots in {dir}",
        stats.blocks, stats.allocated_bytes
    );
    Ok(())
}
