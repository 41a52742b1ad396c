//! Reading snapshots from memory: PyTorch pickles and the same snapshots as `.snap`.
//!
//! `cargo bench -p snapdiff-format --bench read` (needs `../shared/fixtures/torch`).
//! For the comparison with CPython, `bench/pickle_read.py --in-process` times
//! both sides in alternating rounds (see docs/performance.md).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::path::Path;

/// The allocator the `snapdiff` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn read(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/torch");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    files.sort();
    let mut group = c.benchmark_group("read");
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let pickle = std::fs::read(&path).unwrap();
        let snap = snapdiff_format::read_bytes(&pickle).unwrap();
        let mut snap_bytes = Vec::new();
        snapdiff_format::write_snap(&snap, &mut snap_bytes).unwrap();
        group.throughput(Throughput::Bytes(pickle.len() as u64));
        group.bench_function(format!("pickle/{name}"), |b| {
            b.iter(|| snapdiff_format::read_bytes(&pickle).unwrap())
        });
        group.bench_function(format!("snap/{name}"), |b| {
            b.iter(|| snapdiff_format::read_bytes(&snap_bytes).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, read);
criterion_main!(benches);
