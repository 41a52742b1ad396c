//! A user's program: a training loop that keeps one buffer a step, checked
//! with `LeakCheck`. Built without frame pointers, so the runtime must take
//! its stacks from the call-frame tables. Prints the leak report and the
//! stack of one kept block, one frame a line (`function file:line`), after
//! the method the runtime captures stacks with.

use snapdiff::testing::LeakCheck;
use snapdiff::{Allocator, AllocatorConfig, DeviceBuffer, HostBackend, Stream};

#[inline(never)]
fn train_step(a: &Allocator, kept: &mut Vec<DeviceBuffer>) {
    let activations = a.alloc(4 << 20, Stream::DEFAULT).unwrap();
    kept.push(a.alloc(64 << 10, Stream::DEFAULT).unwrap()); // KEEPS A BUFFER
    drop(activations);
}

fn main() {
    let a = Allocator::new(HostBackend::with_capacity(1 << 30));
    let capture = AllocatorConfig::default().stack_capture;
    println!("stacks by {:?}", capture.in_effect());
    let mut kept = Vec::new();
    let check = LeakCheck::begin(&a).warmup(1);
    for _ in 0..5 {
        train_step(&a, &mut kept);
        check.step();
    }
    let report = check.finish();
    let group = &report.groups()[0];
    println!("leaked {} in {} blocks", group.delta_bytes(), group.blocks());
    let culprit = group.culprit();
    println!("culprit {} {}:{}", culprit.name, culprit.file, culprit.line);
    let snapshot = a.snapshot();
    let block = snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.state.is_active() && b.size == 64 << 10)
        .expect("a kept block");
    for frame in snapshot.stack_frames(block.stack) {
        println!("frame {} {}:{}", frame.name, frame.file, frame.line);
    }
}
