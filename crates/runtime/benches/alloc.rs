//! Allocate + free through the cached path, with and without stacks.
//!
//! `cargo bench -p snapdiff-runtime --bench alloc`. Frame-pointer figures need
//! frame pointers in the build (`.cargo/config.toml` forces them for this
//! workspace); without them the runtime unwinds instead.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use snapdiff_runtime::{Allocator, AllocatorConfig, HostBackend, StackCapture, Stream};

/// Calls `f` at the bottom of `depth` nested frames.
#[inline(never)]
fn nested(depth: usize, f: &mut dyn FnMut()) {
    if depth == 0 {
        f()
    } else {
        nested(depth - 1, f);
        black_box(depth);
    }
}

/// [`nested`] under another name: the same depth through other return
/// addresses.
#[inline(never)]
fn nested_elsewhere(depth: usize, f: &mut dyn FnMut()) {
    if depth == 0 {
        f()
    } else {
        nested_elsewhere(depth - 1, f);
        black_box(depth);
    }
}

fn alloc_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free");
    let configs = [
        (
            "stacks off, trace off",
            AllocatorConfig {
                record_stacks: false,
                trace_entries: 0,
                ..Default::default()
            },
        ),
        (
            "stacks off, trace on",
            AllocatorConfig {
                record_stacks: false,
                ..Default::default()
            },
        ),
        (
            "30 frames, call-frame tables",
            AllocatorConfig {
                stack_capture: StackCapture::Cfi,
                ..Default::default()
            },
        ),
        (
            "30 frames, frame pointers",
            AllocatorConfig {
                stack_capture: StackCapture::FramePointers,
                ..Default::default()
            },
        ),
        (
            "30 frames, unwind",
            AllocatorConfig {
                stack_capture: StackCapture::Unwind,
                ..Default::default()
            },
        ),
    ];
    for (name, config) in configs {
        let a = Allocator::with_config(HostBackend::with_capacity(1 << 30), config);
        // Warm the cache: the block below is served from a cached segment.
        drop(a.alloc(4096, Stream::DEFAULT).unwrap());
        group.bench_function(name, |b| {
            nested(25, &mut || {
                b.iter(|| {
                    drop(black_box(
                        a.alloc(black_box(4096), Stream::DEFAULT).unwrap(),
                    ))
                });
            })
        });
    }
    // Allocations from two places in turn, each 12 frames below a shared
    // caller through functions of its own: each stack is unwound up to
    // where the two paths part.
    let a = Allocator::with_config(
        HostBackend::with_capacity(1 << 30),
        AllocatorConfig {
            stack_capture: StackCapture::Cfi,
            ..Default::default()
        },
    );
    drop(a.alloc(4096, Stream::DEFAULT).unwrap());
    let mut alloc = || {
        drop(black_box(
            a.alloc(black_box(4096), Stream::DEFAULT).unwrap(),
        ))
    };
    let mut turn = false;
    group.bench_function("30 frames, call-frame tables, two places in turn", |b| {
        nested(13, &mut || {
            b.iter(|| {
                turn = !turn;
                if turn {
                    nested(12, &mut alloc)
                } else {
                    nested_elsewhere(12, &mut alloc)
                }
            })
        })
    });
    group.finish();
}

/// Building a snapshot of 100,000 live blocks from 100 call sites, after the
/// first snapshot has symbolized their stacks.
fn snapshot_100k(c: &mut Criterion) {
    let a = Allocator::with_config(
        HostBackend::with_capacity(8 << 30),
        AllocatorConfig::default(),
    );
    let mut live = Vec::with_capacity(100_000);
    for i in 0..100_000 {
        nested(i % 100, &mut || {
            live.push(a.alloc(4096, Stream::DEFAULT).unwrap())
        });
    }
    black_box(a.snapshot());
    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    group.bench_function("100k live blocks", |b| b.iter(|| black_box(a.snapshot())));
    group.finish();
}

/// Dumping 1,000,000 live blocks from 1,000 call sites to a `.snap` file,
/// after the first dump has symbolized their stacks.
fn dump_1m(c: &mut Criterion) {
    let a = Allocator::with_config(
        HostBackend::with_capacity(8 << 30),
        AllocatorConfig::default(),
    );
    let mut live = Vec::with_capacity(1_000_000);
    for i in 0..1_000_000 {
        nested(i % 1000 / 40, &mut || {
            nested(i % 40, &mut || {
                live.push(a.alloc(512, Stream::DEFAULT).unwrap())
            })
        });
    }
    let dir = std::env::temp_dir().join(format!("snapdiff-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dump.snap");
    a.dump(&path).unwrap();
    let mut group = c.benchmark_group("dump");
    group.sample_size(10);
    group.bench_function("1M live blocks, 1000 sites", |b| {
        b.iter(|| a.dump(&path).unwrap())
    });
    group.finish();
    std::fs::remove_dir_all(&dir).unwrap();
}

criterion_group!(benches, alloc_free, snapshot_100k, dump_1m);
criterion_main!(benches);
