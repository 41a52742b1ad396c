//! The recording caching allocator, used as a program would use it.

use std::time::{Duration, Instant};

use snapdiff_analyze::{CompareOptions, TrendOptions, compare, trend_snapshots};
use snapdiff_format::{Action, BlockState, Snapshot};
use snapdiff_runtime::{
    AllocError, Allocator, AllocatorConfig, Backend, CudaBackend, DeviceBuffer, HostBackend,
    StackCapture, Stream,
};

fn quiet() -> AllocatorConfig {
    AllocatorConfig {
        record_stacks: false,
        ..Default::default()
    }
}

/// Checks what must hold of any snapshot the allocator writes: blocks tile
/// their segments exactly, segments do not overlap, and the totals agree
/// with the allocator's statistics of the same moment (when given).
fn check_layout(snap: &Snapshot) {
    let mut segments: Vec<_> = snap.segments.iter().collect();
    segments.sort_by_key(|s| s.address);
    for pair in segments.windows(2) {
        assert!(
            pair[0].address + pair[0].total_size <= pair[1].address,
            "segments overlap"
        );
    }
    for seg in &segments {
        let mut next = seg.address;
        for b in &seg.blocks {
            assert_eq!(b.address, next, "blocks must tile their segment");
            assert!(
                b.size > 0 && b.size % 512 == 0,
                "sizes are multiples of 512"
            );
            next += b.size;
        }
        assert_eq!(
            next,
            seg.address + seg.total_size,
            "blocks must cover their segment"
        );
        // Neighbouring free blocks are always merged.
        for pair in seg.blocks.windows(2) {
            assert!(
                pair[0].state.is_active() || pair[1].state.is_active(),
                "two free blocks side by side were not merged"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Stacks that point at code.

/// The line of this file that holds `marker` (a comment at the end of a
/// line), so that tests name lines without depending on formatting.
fn line_of(marker: &str) -> u32 {
    let source = include_str!("allocator.rs");
    let index = source
        .lines()
        .position(|l| l.trim_end().ends_with(marker))
        .expect("marker");
    index as u32 + 1
}

#[inline(never)]
fn allocate_here(a: &Allocator) -> DeviceBuffer {
    a.alloc(1000, Stream::DEFAULT).unwrap() // ALLOCATES HERE
}

/// The stack recorded for the block `allocate_here` allocates, captured with `capture`.
fn stack_of_allocate_here(capture: StackCapture) -> Vec<snapdiff_format::Frame> {
    let config = AllocatorConfig {
        stack_capture: capture,
        ..Default::default()
    };
    let a = Allocator::with_config(HostBackend::with_capacity(1 << 30), config);
    let _buf = allocate_here(&a);
    let snap = a.snapshot();
    let block = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.state.is_active())
        .unwrap();
    snap.stack_frames(block.stack).cloned().collect()
}

#[test]
fn a_block_carries_the_stack_that_allocated_it() {
    for capture in [
        StackCapture::Cfi,
        StackCapture::FramePointers,
        StackCapture::Unwind,
    ] {
        let frames = stack_of_allocate_here(capture);
        let innermost = frames
            .first()
            .unwrap_or_else(|| panic!("{capture:?}: no frames"));
        assert!(
            innermost.name.ends_with("allocate_here"),
            "{capture:?}: innermost frame is {innermost:?}"
        );
        assert!(
            innermost.file.ends_with("tests/allocator.rs"),
            "{capture:?}: {innermost:?}"
        );
        assert_eq!(
            innermost.line,
            line_of("// ALLOCATES HERE"),
            "{capture:?}: the line of the alloc call"
        );
        assert!(
            frames
                .iter()
                .any(|f| f.name.ends_with("stack_of_allocate_here")),
            "{capture:?}: the caller is there too"
        );
        assert!(
            !frames.iter().any(|f| f.name.contains("snapdiff_runtime::")),
            "{capture:?}: runtime frames dropped"
        );
    }
}

#[test]
fn every_capture_method_sees_the_same_stack() {
    let names = |capture| -> Vec<String> {
        stack_of_allocate_here(capture)
            .iter()
            .map(|f| f.name.to_string())
            .collect()
    };
    // The whole stack, up to the thread's start: frame pointers stop at
    // `start_thread`, the tables go on to `clone3` (whose own frame has no
    // frame pointer), and the system unwinder to the null address past it.
    let fp = names(StackCapture::FramePointers);
    let cfi = names(StackCapture::Cfi);
    let unwound = names(StackCapture::Unwind);
    assert!(fp.len() > 10, "{fp:?}");
    assert_eq!(cfi[..fp.len()], fp);
    assert_eq!(unwound[..cfi.len()], cfi);
}

/// One training step: activations come and go, one buffer is kept forever.
#[inline(never)]
fn leaky_step(a: &Allocator, kept: &mut Vec<DeviceBuffer>) {
    let activations: Vec<DeviceBuffer> = (0..8)
        .map(|_| a.alloc(256 << 10, Stream::DEFAULT).unwrap())
        .collect();
    kept.push(a.alloc(64 << 10, Stream::DEFAULT).unwrap()); // LEAKS HERE
    drop(activations);
}

#[test]
fn a_leak_made_on_purpose_is_found_at_its_line() {
    let a = Allocator::with_config(
        HostBackend::with_capacity(1 << 30),
        AllocatorConfig::default(),
    );
    let mut kept = Vec::new();
    let mut snaps = Vec::new();
    for step in 1..=8 {
        a.mark_step(step);
        leaky_step(&a, &mut kept);
        snaps.push(a.snapshot());
    }
    let trend = trend_snapshots(&snaps, &TrendOptions::default());
    assert_eq!(trend.suspects.len(), 1, "{trend:#?}");
    let culprit = &trend.suspects[0].site.culprit;
    assert!(culprit.name.ends_with("leaky_step"), "{culprit:?}");
    assert!(culprit.file.ends_with("tests/allocator.rs"), "{culprit:?}");
    assert_eq!(culprit.line, line_of("// LEAKS HERE"));
    assert_eq!(
        trend.suspects[0].growth_bytes,
        6 * (64 << 10),
        "after the first step: six more blocks"
    );

    // The same from two snapshots of the same run: matched by allocation sequence.
    let cmp = compare(&snaps[0], &snaps[7], &CompareOptions::default());
    assert_eq!(cmp.matching, snapdiff_analyze::Matching::AllocationSequence);
    assert_eq!(cmp.groups.len(), 1, "{cmp:#?}");
    assert_eq!(cmp.groups[0].site.culprit.line, line_of("// LEAKS HERE"));
    assert_eq!(cmp.groups[0].delta_bytes, 7 * (64 << 10));
    assert_eq!(
        cmp.groups[0].blocks_kept, 1,
        "the first step's block is the same block"
    );

    // The trace of one snapshot, cut at the step marks, says the same.
    let trend = snapdiff_analyze::trend_trace(&snaps[7], &TrendOptions::default()).unwrap();
    assert_eq!(
        trend.checkpoint_source,
        snapdiff_analyze::trend::CheckpointSource::StepMarks
    );
    assert_eq!(
        trend.checkpoints, 9,
        "at each of the 8 step marks, and the end"
    );
    assert_eq!(trend.suspects.len(), 1, "{trend:#?}");
    assert_eq!(
        trend.suspects[0].site.culprit.line,
        line_of("// LEAKS HERE")
    );
}

// ---------------------------------------------------------------------------
// Correct under pressure.

mod random {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    pub(super) enum Op {
        Alloc { size: usize, stream: u64 },
        Free(usize),
        EmptyCache,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (1usize..=8192, 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
            2 => ((1usize << 20)..(13 << 20), 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
            5 => any::<usize>().prop_map(Op::Free),
            1 => Just(Op::EmptyCache),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn random_allocations_keep_the_books_straight(ops in proptest::collection::vec(op(), 1..100)) {
            let capacity = 160 << 20;
            let a = Allocator::with_config(HostBackend::with_capacity(capacity), AllocatorConfig { trace_entries: 0, ..quiet() });
            let mut live: Vec<DeviceBuffer> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { size, stream } => match a.alloc(size, Stream(stream)) {
                        Ok(mut buf) => {
                            // The bytes are real: write them, read them back (the
                            // first 64 KiB, to keep the test quick).
                            let bytes = buf.as_host_slice_mut().unwrap();
                            let n = bytes.len().min(64 << 10);
                            bytes[..n].fill(stream as u8 + 1);
                            live.push(buf);
                        }
                        Err(AllocError::OutOfMemory { .. }) => {}
                        Err(e) => panic!("{e}"),
                    },
                    Op::Free(i) if !live.is_empty() => {
                        let i = i % live.len();
                        live.swap_remove(i);
                    }
                    Op::Free(_) => {}
                    Op::EmptyCache => a.empty_cache(),
                }
                let stats = a.stats();
                let snap = a.snapshot();
                check_layout(&snap);
                let totals = snap.totals();
                prop_assert_eq!(totals.allocated_bytes, stats.allocated_bytes);
                prop_assert_eq!(totals.reserved_bytes, stats.reserved_bytes);
                prop_assert_eq!(totals.requested_bytes, stats.requested_bytes);
                prop_assert_eq!(totals.segments, stats.segments);
                let active: Vec<_> = snap.segments.iter().flat_map(|s| s.blocks.iter().map(move |b| (s, b)))
                    .filter(|(_, b)| b.state == BlockState::ActiveAllocated).collect();
                prop_assert_eq!(active.len(), live.len());
                for buf in &live {
                    let (seg, block) = active.iter().find(|(_, b)| b.address == buf.device_ptr()).expect("a block per buffer");
                    prop_assert_eq!(block.requested_size as usize, buf.len());
                    prop_assert_eq!(seg.stream as u64, buf.stream().0, "blocks stay on their stream");
                    let fill = buf.stream().0 as u8 + 1;
                    let bytes = buf.as_host_slice().unwrap();
                    prop_assert!(bytes[..bytes.len().min(64 << 10)].iter().all(|&x| x == fill), "nobody else wrote here");
                }
            }
            drop(live);
            a.empty_cache();
            let stats = a.stats();
            prop_assert_eq!((stats.allocated_bytes, stats.reserved_bytes, stats.segments), (0, 0, 0));
        }
    }
}

#[test]
fn many_threads_allocate_while_snapshots_are_taken() {
    let a = Allocator::with_config(
        HostBackend::with_capacity(1 << 30),
        AllocatorConfig::default(),
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let a = a.clone();
                s.spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                    let mut live = Vec::new();
                    for _ in 0..3000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if !x.is_multiple_of(3) || live.is_empty() {
                            let size = if x.is_multiple_of(50) {
                                (x % (4 << 20)) as usize + 1
                            } else {
                                (x % 20000) as usize + 1
                            };
                            live.push(a.alloc(size, Stream(t % 2)).unwrap());
                        } else {
                            let i = (x as usize / 3) % live.len();
                            live.swap_remove(i);
                        }
                    }
                })
            })
            .collect();
        let mut snapshots = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let snap = a.snapshot();
            check_layout(&snap);
            snapshots += 1;
            if workers.iter().all(|w| w.is_finished()) {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        assert!(snapshots > 0);
    });
    let stats = a.stats();
    assert_eq!(stats.allocated_bytes, 0, "every buffer was dropped");
    a.empty_cache();
    assert_eq!(a.stats().reserved_bytes, 0);
}

#[test]
fn out_of_memory_is_an_error_and_the_allocator_recovers() {
    let a = Allocator::with_config(
        HostBackend::with_capacity(64 << 20),
        AllocatorConfig::default(),
    );
    let mut held = Vec::new();
    let err = loop {
        match a.alloc(12 << 20, Stream::DEFAULT) {
            Ok(buf) => held.push(buf),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, AllocError::OutOfMemory { requested, .. } if requested == 12 << 20),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("out of memory on device 0: tried to allocate 12582912 bytes"),
        "{err}"
    );
    assert_eq!(held.len(), 5, "five 12 MiB segments fit in 64 MiB");
    let stats = a.stats();
    assert_eq!((stats.ooms, stats.alloc_retries), (1, 1));
    let snap = a.snapshot();
    let oom = snap.traces[0]
        .events
        .iter()
        .find(|e| e.action == Action::Oom)
        .expect("an oom event");
    assert_eq!(oom.size, 12 << 20);
    assert_eq!(oom.device_free(), Some(4 << 20));

    held.pop();
    let again = a.alloc(12 << 20, Stream::DEFAULT);
    assert!(again.is_ok(), "a freed block is reused");

    // Cached segments are released to make room, for other streams too:
    // the 1 MiB blocks of stream 1 need 20 MiB, the 12 MiB segments of
    // stream 0 are cached, so one retry releases them...
    drop(again);
    held.clear();
    let small: Vec<_> = (0..20)
        .map(|_| a.alloc(1 << 20, Stream(1)).unwrap())
        .collect();
    assert_eq!(a.stats().alloc_retries, 2);
    drop(small);
    assert!(a.stats().reserved_bytes > 0, "the small blocks stay cached");
    // ... and 60 MiB on stream 0 needs the small segments of stream 1 released.
    let big = a
        .alloc(60 << 20, Stream::DEFAULT)
        .expect("the cache is released and the allocation retried");
    assert_eq!(big.len(), 60 << 20);
    assert_eq!(a.stats().alloc_retries, 3);
}

#[test]
fn every_byte_comes_back() {
    let backend_capacity = 256 << 20;
    let a = Allocator::with_config(HostBackend::with_capacity(backend_capacity), quiet());
    let bufs: Vec<_> = [100, 5000, 1 << 20, (1 << 20) + 1, 11 << 20, 300]
        .iter()
        .map(|&n| a.alloc(n, Stream::DEFAULT).unwrap())
        .collect();
    // The four small requests share one 2 MiB segment; 1 MiB + 1 takes a
    // 20 MiB segment, and 11 MiB fits in the rest of it (best fit).
    assert_eq!(a.stats().segments, 2);
    assert_eq!(a.stats().reserved_bytes, (2 + 20) << 20);
    drop(bufs);
    a.empty_cache();
    let stats = a.stats();
    assert_eq!(
        (
            stats.reserved_bytes,
            stats.allocated_bytes,
            stats.requested_bytes
        ),
        (0, 0, 0)
    );
}

// ---------------------------------------------------------------------------
// The trace.

#[test]
fn the_trace_records_pytorch_actions_in_a_bounded_ring() {
    let a = Allocator::with_config(HostBackend::with_capacity(1 << 30), quiet());
    a.mark_step(1);
    let buf = a.alloc(1000, Stream::DEFAULT).unwrap();
    let seq = a.snapshot().segments[0].blocks[0].alloc_seq;
    drop(buf);
    let snap = a.snapshot();
    let actions: Vec<String> = snap.traces[0]
        .events
        .actions()
        .map(|a| a.name().to_owned())
        .collect();
    assert_eq!(
        actions,
        [
            "step",
            "segment_alloc",
            "alloc",
            "snapshot",
            "free_requested",
            "free_completed"
        ]
    );
    let events: Vec<_> = snap.traces[0].events.iter().collect();
    assert_eq!(
        (events[0].size, events[1].size, events[2].size),
        (1, 2 << 20, 1000)
    );
    assert_eq!(events[2].alloc_seq, seq);
    assert_eq!(events[5].alloc_seq, seq);
    assert!(events.windows(2).all(|w| w[0].time_us <= w[1].time_us));

    let small = Allocator::with_config(
        HostBackend::with_capacity(1 << 30),
        AllocatorConfig {
            trace_entries: 10,
            ..quiet()
        },
    );
    for _ in 0..100 {
        drop(small.alloc(100, Stream::DEFAULT).unwrap());
    }
    let events = &small.snapshot().traces[0].events;
    assert!(
        events.len() <= 20,
        "at most 10 recorded events (a free is two actions): {}",
        events.len()
    );
    assert_eq!(
        events.last().unwrap().action,
        Action::FreeCompleted,
        "the newest are kept"
    );
}

// ---------------------------------------------------------------------------
// Dumps.

fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn wait_for(dir: &std::path::Path, pattern: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if files_in(dir)
            .iter()
            .any(|f| f.contains(pattern) && f.ends_with(".snap"))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn dumps_every_n_steps_and_on_oom() {
    let dir = tempfile::tempdir().unwrap();
    let config = AllocatorConfig {
        dump_dir: Some(dir.path().to_owned()),
        dump_every_steps: Some(2),
        dump_on_signal: false,
        ..Default::default()
    };
    let a = Allocator::with_config(HostBackend::with_capacity(32 << 20), config);
    let mut kept = Vec::new();
    for step in 1..=6 {
        a.mark_step(step);
        kept.push(a.alloc(4096, Stream::DEFAULT).unwrap());
    }
    let names = files_in(dir.path());
    let steps: Vec<&String> = names.iter().filter(|n| n.contains("-step-")).collect();
    assert_eq!(steps.len(), 3, "{names:?}");
    for (name, step) in steps.iter().zip([2u64, 4, 6]) {
        let snap = snapdiff_format::read_path(dir.path().join(name)).unwrap();
        assert_eq!(snap.meta.step, Some(step), "{name}");
        assert_eq!(snap.meta.producer, "snapdiff-runtime");
        assert!(name.contains(&format!("step-{step:06}")), "{name}");
    }

    assert!(a.alloc(64 << 20, Stream::DEFAULT).is_err());
    assert!(
        files_in(dir.path())
            .iter()
            .any(|n| n.ends_with("-oom.snap")),
        "dumped before the error returned"
    );

    // Dropping the allocator writes nothing: there is nothing left to see.
    // (Dumps at process exit are tested with snapdiff-train under capture.)
    drop(kept);
    let before = files_in(dir.path()).len();
    drop(a);
    assert_eq!(files_in(dir.path()).len(), before);
}

#[test]
fn a_failing_dump_is_reported_and_allocation_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    let config = AllocatorConfig {
        dump_dir: Some(gone.clone()),
        dump_every_steps: Some(1),
        dump_on_exit: false,
        dump_on_signal: false,
        ..quiet()
    };
    let a = Allocator::with_config(HostBackend::with_capacity(1 << 30), config);
    a.mark_step(1); // the folder does not exist: reported on stderr
    let buf = a.alloc(100, Stream::DEFAULT).expect("allocation goes on");
    drop(buf);
    let err = a.dump(gone.join("x.snap")).unwrap_err();
    assert!(err.to_string().contains("gone"), "{err}");
}

#[test]
fn dumps_on_sigusr1_and_every_interval() {
    let dir = tempfile::tempdir().unwrap();
    let config = AllocatorConfig {
        dump_dir: Some(dir.path().to_owned()),
        dump_interval: Some(Duration::from_millis(100)),
        dump_on_exit: false,
        ..quiet()
    };
    let a = Allocator::with_config(HostBackend::with_capacity(1 << 30), config);
    let _buf = a.alloc(100, Stream::DEFAULT).unwrap();
    assert!(
        wait_for(dir.path(), "-interval"),
        "{:?}",
        files_in(dir.path())
    );
    // SAFETY: raising a signal whose handler the allocator installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    assert!(
        wait_for(dir.path(), "-signal"),
        "{:?}",
        files_in(dir.path())
    );
}

// ---------------------------------------------------------------------------
// CUDA.

#[test]
fn cuda_without_a_driver_is_an_error_not_a_panic() {
    match CudaBackend::new(0) {
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains("no CUDA driver found") || message.starts_with("CUDA device 0"),
                "{message}"
            );
            if std::env::var_os("SNAPDIFF_EXPECT_NO_CUDA").is_some() {
                assert!(message.contains("use the host backend"), "{message}");
            }
        }
        Ok(gpu) => assert!(
            std::env::var_os("SNAPDIFF_EXPECT_NO_CUDA").is_none(),
            "found a GPU: {gpu:?}"
        ),
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver"]
fn allocates_on_a_gpu() {
    let gpu = CudaBackend::new(0).expect("a CUDA GPU");
    let info = gpu.memory_info();
    assert!(info.total > 0 && info.free <= info.total);
    let a = Allocator::new(gpu);
    let bufs: Vec<_> = (0..4)
        .map(|_| a.alloc(3 << 20, Stream::DEFAULT).unwrap())
        .collect();
    assert!(
        bufs[0].as_host_slice().is_none(),
        "GPU memory is not host memory"
    );
    let snap = a.snapshot();
    check_layout(&snap);
    assert_eq!(snap.totals().allocated_bytes, 4 * (3 << 20));
    assert_ne!(snap.meta.devices[0].name, "host");
    drop(bufs);
    a.empty_cache();
    assert_eq!(a.stats().reserved_bytes, 0);
}
