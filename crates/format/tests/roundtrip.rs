//! Property tests: any snapshot survives `.snap` and `.json` unchanged.

use proptest::prelude::*;
use snapdiff_format::{
    Action, Annotation, Block, BlockState, DeviceInfo, DeviceTrace, EventDetails, Frame,
    HistoryEntry, Meta, Parts, Pool, Reader, Segment, Snapshot, TraceEvent, Value, read_bytes,
    write_json, write_snap,
};

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i128>().prop_map(Value::Int),
        (-1e12f64..1e12).prop_map(Value::Float),
        "[a-z$]{0,6}".prop_map(Value::Str),
        proptest::collection::vec(any::<u8>(), 0..5).prop_map(Value::Bytes),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::List),
            proptest::collection::vec(("[a-z]{1,5}", inner), 0..4).prop_map(Value::Map),
        ]
    })
}

fn extra() -> impl Strategy<Value = Vec<(String, Value)>> {
    proptest::collection::vec(("[a-z_]{1,8}", value()), 0..2)
}

fn frame() -> impl Strategy<Value = Frame> {
    (
        "[a-z_:<>]{0,40}",
        "[a-z/.?]{0,40}",
        any::<u32>(),
        proptest::collection::vec(("fx_[a-z]{1,4}", "[a-z]{0,5}"), 0..2),
    )
        .prop_map(|(name, file, line, extra)| Frame {
            name: name.into(),
            file: file.into(),
            line,
            extra,
        })
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        Just(Action::Alloc),
        Just(Action::FreeRequested),
        Just(Action::FreeCompleted),
        Just(Action::SegmentAlloc),
        Just(Action::Snapshot),
        Just(Action::Oom),
        Just(Action::Step),
        "[a-z]{3,8}".prop_map(|n| Action::from_name(&n)),
    ]
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (
        proptest::collection::vec(frame(), 1..20),
        1usize..10,
        1usize..4,
    )
        .prop_flat_map(|(frames, nstacks, nstrings)| {
            let nframes = frames.len() as u32;
            let stacks =
                proptest::collection::vec(proptest::collection::vec(0..nframes, 0..6), nstacks);
            let stack = proptest::option::of(0..nstacks as u32);
            let string = proptest::option::of(0..nstrings as u32);
            let block = (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                prop_oneof![
                    Just(BlockState::ActiveAllocated),
                    Just(BlockState::ActivePendingFree),
                    Just(BlockState::Inactive)
                ],
                stack.clone(),
                proptest::option::of(any::<u64>()),
                proptest::collection::vec((any::<u64>(), any::<u64>(), stack.clone()), 0..2),
                extra(),
            )
                .prop_map(
                    |(address, size, requested_size, state, stack, alloc_seq, history, extra)| {
                        Block {
                            address,
                            size,
                            requested_size,
                            state,
                            stack,
                            alloc_seq,
                            history: history
                                .into_iter()
                                .map(|(address, real_size, stack)| HistoryEntry {
                                    address,
                                    real_size,
                                    stack,
                                    extra: vec![],
                                })
                                .collect(),
                            extra: extra.into(),
                        }
                    },
                );
            let segment = (
                0u32..3,
                any::<u64>(),
                any::<u64>(),
                any::<i64>(),
                any::<bool>(),
                (any::<i64>(), any::<i64>()),
                stack.clone(),
                proptest::collection::vec(block, 0..5),
                proptest::option::of(any::<u64>()),
            )
                .prop_map(
                    |(
                        device,
                        address,
                        total_size,
                        stream,
                        small,
                        pool_id,
                        stack,
                        blocks,
                        allocated,
                    )| Segment {
                        device,
                        address,
                        total_size,
                        stream,
                        pool: if small { Pool::Small } else { Pool::Large },
                        pool_id,
                        is_expandable: !small,
                        stack,
                        blocks,
                        allocated_size: allocated,
                        active_size: allocated,
                        requested_size: None,
                        extra: vec![],
                    },
                );
            let event = (
                action(),
                any::<u64>(),
                any::<u64>(),
                any::<i64>(),
                proptest::option::of(any::<i64>()),
                stack,
                proptest::option::of(any::<u64>()),
                string.clone(),
                string,
                proptest::option::of((any::<i64>(), any::<i64>())),
                proptest::option::of(any::<u64>()),
                extra(),
            )
                .prop_map(
                    |(
                        action,
                        address,
                        size,
                        stream,
                        time_us,
                        stack,
                        device_free,
                        cc,
                        um,
                        pool_id,
                        alloc_seq,
                        extra,
                    )| {
                        TraceEvent {
                            action,
                            address,
                            size,
                            stream,
                            time_us,
                            stack,
                            compile_context: cc,
                            user_metadata: um,
                            alloc_seq,
                            details: (device_free.is_some()
                                || pool_id.is_some()
                                || !extra.is_empty())
                            .then(|| {
                                Box::new(EventDetails {
                                    device_free,
                                    pool_id,
                                    extra,
                                })
                            }),
                        }
                    },
                );
            let trace =
                (0u32..4, proptest::collection::vec(event, 0..30)).prop_map(|(device, events)| {
                    DeviceTrace {
                        device,
                        events: events.into(),
                    }
                });
            let meta = (
                "[a-z-]{1,10}",
                proptest::option::of(any::<i64>()),
                proptest::option::of(any::<u32>()),
                proptest::option::of(any::<u64>()),
                extra(),
            )
                .prop_map(|(producer, created_us, pid, step, extra)| Meta {
                    producer,
                    source: None,
                    created_us,
                    pid,
                    host: Some("h".into()),
                    run_id: None,
                    label: None,
                    step,
                    devices: vec![DeviceInfo {
                        ordinal: 0,
                        name: "host".into(),
                        total_memory: Some(1 << 30),
                    }],
                    extra,
                });
            (
                Just(frames),
                stacks,
                proptest::collection::vec("[a-zA-Z/ ]{0,8}", nstrings),
                proptest::collection::vec(segment, 0..4),
                proptest::collection::vec(trace, 0..3),
                meta,
                value(),
                extra(),
                proptest::option::of(any::<i64>()),
            )
                .prop_map(
                    |(frames, stacks, strings, segments, traces, meta, settings, extra, t)| {
                        Snapshot {
                            meta,
                            frames,
                            stacks,
                            strings,
                            segments,
                            traces,
                            annotations: vec![Annotation {
                                device: 0,
                                time_us: t,
                                name: Some("a".into()),
                                stage: Some("START".into()),
                                extra: vec![],
                            }],
                            allocator_settings: settings,
                            extra,
                        }
                    },
                )
        })
}

/// A long, regular trace compresses hundreds of times; the reader's bound
/// on a body's expansion must not refuse what the writer wrote.
#[test]
fn a_regular_trace_that_compresses_hundreds_of_times_reads_back() {
    let event = |i: u64| TraceEvent {
        action: if i.is_multiple_of(2) {
            Action::Alloc
        } else {
            Action::FreeCompleted
        },
        address: 0x7f00_0000_0000,
        size: 4096,
        time_us: Some(i as i64),
        ..TraceEvent::default()
    };
    let snap = Snapshot {
        traces: vec![DeviceTrace {
            device: 0,
            events: (0..1_000_000).map(event).collect(),
        }],
        ..Snapshot::default()
    };
    let mut bytes = Vec::new();
    write_snap(&snap, &mut bytes).unwrap();
    // The header: the head's length and frame length, then the events'
    // length; the events' frame is the rest of the file.
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let events_frame_len = bytes.len() as u64 - 36 - field(20);
    assert!(
        field(28) > 128 * events_frame_len,
        "the events should compress over 128 times"
    );
    assert_eq!(read_bytes(&bytes).unwrap(), snap);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn snap_and_json_round_trip(snap in snapshot()) {
        let mut bytes = Vec::new();
        write_snap(&snap, &mut bytes).unwrap();
        let back = read_bytes(&bytes).unwrap();
        prop_assert_eq!(&back, &snap);

        let mut json = Vec::new();
        write_json(&back, &mut json).unwrap();
        prop_assert_eq!(read_bytes(&json).unwrap(), snap.clone());

        // Without events: everything else the same, each trace's device kept.
        let mut expected = snap;
        for trace in &mut expected.traces {
            trace.events = Default::default();
        }
        prop_assert_eq!(Reader::new().parts(Parts::WithoutEvents).read_bytes(&bytes).unwrap(), expected);
    }

    #[test]
    fn sorting_frames_keeps_every_stack(mut snap in snapshot()) {
        let before: Vec<Vec<Frame>> = snap.stacks.iter()
            .map(|s| s.iter().map(|&f| snap.frames[f as usize].clone()).collect()).collect();
        snap.sort_frames();
        let after: Vec<Vec<Frame>> = snap.stacks.iter()
            .map(|s| s.iter().map(|&f| snap.frames[f as usize].clone()).collect()).collect();
        prop_assert_eq!(before, after);
        prop_assert!(snap.frames.windows(2).all(|w| (&w[0].file, &w[0].name, w[0].line) <= (&w[1].file, &w[1].name, w[1].line)));
    }
}
