//! Reading every kind of snapshot file: fidelity against CPython on real and
//! generated PyTorch files, lossless round trips, and bad input.

use std::path::{Path, PathBuf};

use snapdiff_format::{
    DeviceTrace, ErrorKind, Snapshot, TraceEvent, read_bytes, read_path, write_json, write_snap,
    write_torch_pickle,
};

use crate::util::{
    fixture, pickle4, python_json, python_script, shared_torch_fixtures, snapdiff, tempdir,
};

/// The project's own PyTorch-format files (made by fixtures/make_torch_format.py),
/// those of its series' folders (`pinned-cache/`) too.
fn own_torch_files() -> Vec<PathBuf> {
    let folder = fixture("torch-format");
    let series = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir());
    let mut files: Vec<PathBuf> = std::iter::once(folder)
        .chain(series)
        .flat_map(|dir| std::fs::read_dir(dir).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle" || e == "pt"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 7,
        "fixtures/torch-format is incomplete: {files:?}"
    );
    files
}

fn all_torch_files() -> Vec<PathBuf> {
    let mut files = own_torch_files();
    files.extend(shared_torch_fixtures().unwrap_or_default());
    files
}

/// `summary --json` equals what CPython's pickle module computes from the same file.
fn check_totals_match_cpython(path: &Path) {
    let expected = python_json("torch_totals.py", &[path]);
    let got = snapdiff(["summary".as_ref(), "--json".as_ref(), path.as_os_str()])
        .expect_code(0)
        .json();
    for field in [
        "segments",
        "blocks",
        "reserved_bytes",
        "allocated_bytes",
        "active_bytes",
        "requested_bytes",
        "pinned_host",
        "trace_events",
        "actions",
    ] {
        assert_eq!(
            got[field],
            expected[field],
            "{}: field {field}",
            path.display()
        );
    }
    // Every block keeps its whole stack.
    let snap = read_path(path).unwrap();
    let frames: Vec<usize> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .map(|b| b.stack.map_or(0, |s| snap.stacks[s as usize].len()))
        .collect();
    let expected_frames: Vec<usize> =
        serde_json::from_value(expected["frames_per_block"].clone()).unwrap();
    assert_eq!(
        frames,
        expected_frames,
        "{}: frames per block",
        path.display()
    );
    // Every block and event has the frames, in order, that CPython reads.
    let blocks = snap.segments.iter().flat_map(|s| &s.blocks);
    let events = snap.traces.iter().flat_map(|t| &t.events);
    for (field, stacks) in [
        (
            "block_stacks",
            stacks_as_cpython(&snap, blocks.map(|b| b.stack)),
        ),
        (
            "event_stacks",
            stacks_as_cpython(&snap, events.map(|e| e.stack)),
        ),
    ] {
        assert!(
            stacks == expected[field],
            "{}: {field} differ from CPython's",
            path.display()
        );
    }
}

/// The frames of each stack in `stacks`, in the form `torch_totals.py`
/// prints: distinct frames as `[name, filename, line]`, distinct stacks as
/// frame indices, and each stack's index (all in first-seen order).
fn stacks_as_cpython(
    snap: &Snapshot,
    stacks: impl Iterator<Item = Option<u32>>,
) -> serde_json::Value {
    use std::collections::HashMap;
    let (mut frames, mut distinct, mut which) = (Vec::new(), Vec::new(), Vec::new());
    let (mut frame_ids, mut stack_ids) = (HashMap::new(), HashMap::new());
    for stack in stacks {
        let ids: Vec<usize> = snap
            .stack_frames(stack)
            .map(|f| {
                let key = (f.name.as_str(), f.file.as_str(), f.line);
                *frame_ids.entry(key).or_insert_with(|| {
                    frames.push(serde_json::json!([f.name, f.file, f.line]));
                    frames.len() - 1
                })
            })
            .collect();
        let next = distinct.len();
        let id = *stack_ids.entry(ids.clone()).or_insert(next);
        if id == next {
            distinct.push(ids);
        }
        which.push(id);
    }
    serde_json::json!({"frames": frames, "stacks": distinct, "which": which})
}

#[test]
fn real_pytorch_snapshots_match_cpython() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    for path in files {
        check_totals_match_cpython(&path);
    }
}

#[test]
fn generated_pickles_of_every_protocol_match_cpython() {
    for path in own_torch_files() {
        check_totals_match_cpython(&path);
    }
}

/// Writes, with CPython's pickler at `protocol`, a snapshot shaped like a
/// long recording: two devices' traces of 2001 and 1500 events (batches of
/// 1000, then a lone APPEND), whose frame lists are fresh (as PyTorch
/// writes them), shared between events, or of fresh frame dicts; blocks
/// with fresh frame lists; and the shared frame list again, under a key of
/// its own. Event `i` of device `d` is at address `d << 40 | i * 512`.
fn write_long_trace(path: &Path, protocol: u8) {
    let script = "import pickle, sys\n\
        frames = [{'name': f'f{i}', 'filename': f'm{i % 7}.py', 'line': i} for i in range(40)]\n\
        shared = frames[3:30]\n\
        def frames_of(i):\n\
        \x20   if i % 3 == 0: return shared\n\
        \x20   if i % 3 == 1: return frames[i % 11:(i % 11) + 5 + i % 17]\n\
        \x20   return [dict(f) for f in frames[:2 + i % 5]]\n\
        def event(d, i):\n\
        \x20   return {'action': ['alloc', 'free_requested', 'free_completed'][i % 3], 'addr': d << 40 | i * 512,\n\
        \x20           'size': 512, 'stream': 0, 'time_us': i, 'frames': frames_of(i)}\n\
        traces = [[event(d, i) for i in range(n)] for d, n in enumerate([2001, 1500])]\n\
        blocks = [{'address': 4096 * b, 'size': 4096, 'requested_size': 4000, 'state': 'active_allocated',\n\
        \x20          'frames': list(frames[b % 9:b % 9 + 12])} for b in range(300)]\n\
        segment = {'device': 0, 'address': 0, 'total_size': 4096 * 300, 'allocated_size': 4096 * 300,\n\
        \x20          'active_size': 4096 * 300, 'requested_size': 4000 * 300, 'stream': 0,\n\
        \x20          'segment_type': 'large', 'blocks': blocks}\n\
        snap = {'segments': [segment], 'device_traces': traces, 'seen_again': shared}\n\
        pickle.dump(snap, open(sys.argv[1], 'wb'), protocol=int(sys.argv[2]))\n";
    python_script(script, &[path.as_os_str(), protocol.to_string().as_ref()]);
}

#[test]
fn long_traces_written_by_cpython_read_as_cpython_reads_them() {
    let dir = tempdir();
    for protocol in [2, 4, 5] {
        let path = dir.path().join(format!("long-p{protocol}.pickle"));
        write_long_trace(&path, protocol);
        check_totals_match_cpython(&path);
        let snap = read_path(&path).unwrap();
        for (d, trace) in snap.traces.iter().enumerate() {
            let addresses: Vec<u64> = trace.events.iter().map(|e| e.address).collect();
            let expected: Vec<u64> = (0..[2001, 1500][d])
                .map(|i| ((d as u64) << 40) | (i * 512))
                .collect();
            assert_eq!(addresses, expected, "protocol {protocol}, device {d}");
        }
        // The frame list seen again is kept, as frame dicts, under its key.
        let again = snap.extra.iter().find(|(k, _)| k == "seen_again");
        let again = format!("{again:?}");
        let names: Vec<String> = (3..30).map(|i| format!("\"f{i}\"")).collect();
        assert!(
            names.iter().all(|name| again.contains(name.as_str())),
            "protocol {protocol}: {again}"
        );
    }
}

#[test]
fn protocols_2_4_5_and_torch_save_read_to_the_same_model() {
    let read = |name: &str| {
        let mut s = read_path(fixture("torch-format").join(name)).unwrap();
        s.meta.source = None;
        s
    };
    let p4 = read("snapshot-p4.pickle");
    assert_eq!(read("snapshot-p2.pickle"), p4);
    assert_eq!(read("snapshot-p5.pickle"), p4);
    assert_eq!(read("snapshot.pt"), p4);
}

fn snap_bytes(s: &Snapshot) -> Vec<u8> {
    let mut out = Vec::new();
    write_snap(s, &mut out).unwrap();
    out
}

fn json_bytes(s: &Snapshot) -> Vec<u8> {
    let mut out = Vec::new();
    write_json(s, &mut out).unwrap();
    out
}

#[test]
fn pickle_to_snap_to_json_loses_nothing() {
    for path in all_torch_files() {
        let original = read_path(&path).unwrap();
        let via_snap = read_bytes(&snap_bytes(&original)).unwrap();
        assert_eq!(
            via_snap,
            original,
            "{}: pickle -> .snap -> read",
            path.display()
        );
        let via_json = read_bytes(&json_bytes(&via_snap)).unwrap();
        assert_eq!(
            via_json,
            original,
            "{}: .snap -> .json -> read",
            path.display()
        );
        // Without events (as `fleet` and `compare` read), the head alone:
        // everything else the same.
        assert_eq!(
            without_events(&snap_bytes(&original)),
            with_events_dropped(original),
            "{}: pickle -> .snap -> read without events",
            path.display()
        );
    }
}

fn without_events(file: &[u8]) -> Snapshot {
    snapdiff_format::Reader::new()
        .parts(snapdiff_format::Parts::WithoutEvents)
        .read_bytes(file)
        .unwrap()
}

/// `snap` with each trace kept, empty.
fn with_events_dropped(mut snap: Snapshot) -> Snapshot {
    for trace in &mut snap.traces {
        trace.events = snapdiff_format::Events::new();
    }
    snap
}

#[test]
fn pytorch_pickles_written_back_read_the_same() {
    for path in all_torch_files() {
        let original = read_path(&path).unwrap();
        let mut bytes = Vec::new();
        write_torch_pickle(&original, &mut bytes).unwrap();
        let mut again = read_bytes(&bytes).unwrap();
        // Where the file came from is the one thing that differs.
        again.meta = original.meta.clone();
        assert_eq!(
            again,
            original,
            "{}: pickle -> model -> pickle -> read",
            path.display()
        );
    }
}

#[test]
fn snap_files_are_at_most_a_quarter_of_the_pickle() {
    for path in all_torch_files() {
        let pickle_len = std::fs::metadata(&path).unwrap().len() as usize;
        if pickle_len < 16 << 10 {
            continue; // the 20-byte header and zstd framing dominate tiny files
        }
        // Through `snapdiff convert`, as users make them.
        let dir = tempdir();
        let out = dir.path().join("out.snap");
        snapdiff(["convert".as_ref(), path.as_os_str(), out.as_os_str()]).expect_code(0);
        let snap_len = std::fs::metadata(&out).unwrap().len() as usize;
        assert!(
            snap_len * 4 <= pickle_len,
            "{}: .snap {snap_len} bytes, pickle {pickle_len}",
            path.display()
        );
    }
}

#[test]
fn everything_pytorch_records_has_a_place() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let by_name = |n: &str| read_path(files.iter().find(|p| p.ends_with(n)).unwrap()).unwrap();

    let training = by_name("cs336-medium-128-training.pickle");
    let settings = &training.allocator_settings;
    assert_eq!(
        settings.get("max_split_size").and_then(|v| v.as_int()),
        Some(-1)
    );
    assert_eq!(training.annotations.len(), 2);
    assert_eq!(
        training.annotations[0].name.as_deref(),
        Some("Optimizer.step#AdamW.step")
    );
    assert_eq!(training.annotations[0].stage.as_deref(), Some("START"));
    let ev = training.traces[0].events.get(0).unwrap();
    assert_eq!(ev.compile_context.map(|s| training.string(s)), Some("N/A"));
    assert_eq!(ev.user_metadata.map(|s| training.string(s)), Some(""));
    assert!(ev.time_us.is_some());
    // Shared frame lists become shared stacks: far fewer stacks than events.
    assert!(
        training.stacks.len() * 4 < training.trace_len(),
        "{} stacks",
        training.stacks.len()
    );

    let viewer = by_name("snapviewer-memory.pickle");
    assert!(viewer.segments.iter().all(|s| s.is_expandable));
    assert!(viewer.traces[0].events.iter().any(|e| {
        e.compile_context
            .is_some_and(|c| viewer.string(c) == "context2")
    }));
    // This anonymized sample states segment sums that its blocks do not add up to; both are kept.
    assert_eq!(viewer.segments[0].allocated_size, Some(17042336));
    assert_eq!(viewer.segments[0].pool_id, (0, 0));

    let cnn = by_name("eor-nn-counterfactuals.pickle");
    let snapshots = cnn.traces[0]
        .events
        .iter()
        .filter(|e| e.action.name() == "snapshot")
        .count();
    assert_eq!(snapshots, 9);
}

#[test]
fn generated_fixtures_keep_legacy_and_optional_fields() {
    let legacy = read_path(fixture("torch-format/legacy-history.pickle")).unwrap();
    let blocks = &legacy.segments[0].blocks;
    assert_eq!(blocks[0].history.len(), 1);
    assert_eq!(blocks[0].history[0].real_size, 1_000_000);
    assert_eq!(
        blocks[0].stack, blocks[0].history[0].stack,
        "the block's stack comes from its history"
    );
    assert_eq!(
        blocks[1].address,
        blocks[0].address + blocks[0].size,
        "missing addresses are computed"
    );
    assert_eq!(legacy.traces[0].events.get(0).unwrap().time_us, None);

    let snap = read_path(fixture("torch-format/snapshot-p4.pickle")).unwrap();
    let settings = &snap.allocator_settings;
    assert_eq!(
        settings.get("max_split_size").and_then(|v| v.as_int()),
        Some((1i128 << 64) - 1),
        "9-byte LONG1"
    );
    let oom = snap.traces[0]
        .events
        .iter()
        .find(|e| e.action.name() == "oom")
        .unwrap();
    assert_eq!(oom.device_free(), Some(1 << 20));

    let two = read_path(fixture("torch-format/snapshot-2dev-awaiting.pickle")).unwrap();
    assert_eq!(two.device_ordinals(), vec![0, 1]);
    assert_eq!(two.traces.len(), 2);
    assert!(
        two.segments
            .iter()
            .flat_map(|s| &s.blocks)
            .any(|b| b.state.name() == "active_pending_free")
    );
}

/// Reading the segments frees their dicts from the parse, but only those
/// nothing else in the file holds: a segment list and a segment dict that
/// other keys share still read there, whole, after the segments.
#[test]
fn segments_shared_with_other_keys_still_read_there() {
    let dir = tempdir();
    let path = dir.path().join("shared-segments.pickle");
    python_script(
        "import pickle, sys\n\
         seg = {'device': 0, 'address': 4096, 'total_size': 2 << 20, 'stream': 0,\n\
                'segment_type': 'small', 'blocks': [], 'note': 'kept'}\n\
         segs = [seg]\n\
         top = {'segments': segs, 'device_traces': [[]], 'again': segs, 'one': seg}\n\
         pickle.dump(top, open(sys.argv[1], 'wb'), protocol=4)",
        &[path.as_os_str()],
    );
    let snap = read_path(&path).unwrap();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].address, 4096);
    for key in ["again", "one"] {
        let value = snap.extra.iter().find(|(k, _)| k == key);
        let text = format!("{value:?}");
        assert!(
            text.contains("4096") && text.contains("kept"),
            "{key}: {text}"
        );
    }
}

/// Segments are made as the pickle runs, blocks and all; one found where
/// the schema cannot follow (host segments beside a dict that is not one)
/// is still kept whole, as a generic value, and the host allocator's
/// segments that can be followed are a device of their own.
#[test]
fn host_segments_read_or_are_kept_whole() {
    let dir = tempdir();
    let script = "import pickle, sys\n\
        def seg(a):\n\
        \x20   return {'device': 0, 'address': a, 'total_size': 2 << 20, 'stream': 0,\n\
        \x20           'segment_type': 'small', 'note': 'kept',\n\
        \x20           'blocks': [{'address': a, 'size': 2 << 20, 'requested_size': 100,\n\
        \x20                       'state': 'active_allocated', 'frames': []}]}\n\
        for name, host in (('odd', [seg(4096), {'weird': 1}]), ('plain', [seg(4096)])):\n\
        \x20   top = {'segments': [seg(1 << 30)], 'device_traces': [[]], 'host_segments': host}\n\
        \x20   pickle.dump(top, open(f'{sys.argv[1]}/{name}.pickle', 'wb'), protocol=4)\n";
    python_script(script, &[dir.path().as_os_str()]);
    let odd = read_path(dir.path().join("odd.pickle")).unwrap();
    assert_eq!(odd.segments.len(), 1);
    let (_, kept) = odd
        .extra
        .iter()
        .find(|(k, _)| k == "host_segments")
        .unwrap();
    let text = format!("{kept:?}");
    for part in ["4096", "kept", "active_allocated", "100", "weird"] {
        assert!(text.contains(part), "{part}: {text}");
    }
    let plain = read_path(dir.path().join("plain.pickle")).unwrap();
    let devices: Vec<u32> = plain.segments.iter().map(|s| s.device).collect();
    assert_eq!(devices, [0, snapdiff_format::PINNED_HOST_DEVICE]);
    assert_eq!(plain.segments[1].blocks[0].requested_size, 100);
}

/// A segment's blocks are held as a run while the pickle is read; a list
/// of thousands (written in batches of 1000) reads whole and in order, a
/// list given to two segments is refused, and a run where another list is
/// expected is named by its first item.
#[test]
fn long_and_shared_block_lists_read_as_written() {
    let dir = tempdir();
    let script = "import pickle, sys\n\
        def blk(a):\n\
        \x20   return {'address': a, 'size': 512, 'requested_size': 500,\n\
        \x20           'state': 'active_allocated', 'frames': []}\n\
        def seg(a, blocks):\n\
        \x20   return {'device': 0, 'address': a, 'total_size': 2 << 20, 'stream': 0,\n\
        \x20           'segment_type': 'small', 'blocks': blocks}\n\
        many = [blk(8192 + 512 * i) for i in range(2500)]\n\
        shared = [blk(1 << 30)]\n\
        for proto in (2, 4):\n\
        \x20   pickle.dump({'segments': [seg(4096, [blk(4096)]), seg(8192, many)],\n\
        \x20                'device_traces': [[]]}, open(f'{sys.argv[1]}/many-{proto}.pickle', 'wb'), protocol=proto)\n\
        \x20   pickle.dump({'segments': [seg(1 << 30, shared), seg(1 << 31, shared)],\n\
        \x20                'device_traces': [[]]}, open(f'{sys.argv[1]}/twice-{proto}.pickle', 'wb'), protocol=proto)\n\
        \x20   pickle.dump({'segments': [], 'device_traces': [[blk(4096), blk(8192)]]},\n\
        \x20               open(f'{sys.argv[1]}/in-trace-{proto}.pickle', 'wb'), protocol=proto)\n";
    python_script(script, &[dir.path().as_os_str()]);
    for proto in [2, 4] {
        let snap = read_path(dir.path().join(format!("many-{proto}.pickle"))).unwrap();
        let addresses: Vec<u64> = snap.segments[1].blocks.iter().map(|b| b.address).collect();
        let expected: Vec<u64> = (0..2500).map(|i| 8192 + 512 * i).collect();
        assert_eq!(addresses, expected, "protocol {proto}");
        assert_eq!(snap.segments[0].blocks.len(), 1);
        let err = read_path(dir.path().join(format!("twice-{proto}.pickle"))).unwrap_err();
        assert!(
            err.to_string()
                .contains("segments[1].blocks[0]: the same block dict appears twice"),
            "protocol {proto}: {err}"
        );
        let err = read_path(dir.path().join(format!("in-trace-{proto}.pickle"))).unwrap_err();
        assert!(
            err.to_string()
                .contains("device_traces[0][0]: expected a trace event dict, found a block dict"),
            "protocol {proto}: {err}"
        );
    }
}

/// Protocol 4 records (MEMOIZE, then keys and values that are memo gets
/// and numbers) are read straight from their bytes; protocol 2 writes
/// the same records with BINPUT, which goes opcode by opcode. Both read to
/// the same snapshot, over the value kinds records hold: negative and
/// 8-byte integers, integers too wide for 8 bytes, None, booleans, and
/// strings new or seen before.
#[test]
fn records_read_the_same_by_either_path() {
    let dir = tempdir();
    let script = "import pickle, sys\n\
        frames = [{'name': 'step', 'filename': 'train.py', 'line': 7}]\n\
        def ev(i):\n\
        \x20   e = {'action': ['alloc', 'free_requested', 'free_completed'][i % 3],\n\
        \x20        'addr': [4096, 2**63 + 5, 139637976727552][i % 3], 'size': 512 * i,\n\
        \x20        'stream': [-1, 0, 7][i % 3], 'time_us': 1750000000000000 + i,\n\
        \x20        'frames': frames}\n\
        \x20   if i % 4 == 1: e['compile_context'] = 'ctx %d' % (i % 8)\n\
        \x20   if i % 5 == 2: e['is_expandable'] = bool(i % 2)\n\
        \x20   if i % 6 == 3: e['note'] = None\n\
        \x20   return e\n\
        blocks = [{'address': 4096 + 512 * i, 'size': 512, 'requested_size': 500 - i,\n\
        \x20          'state': ['active_allocated', 'inactive'][i % 2], 'frames': frames}\n\
        \x20         for i in range(50)]\n\
        top = {'segments': [{'device': 0, 'address': 4096, 'total_size': 2 << 20,\n\
        \x20                    'stream': 0, 'segment_type': 'small', 'blocks': blocks}],\n\
        \x20      'device_traces': [[ev(i) for i in range(60)]]}\n\
        for proto in (2, 4, 5):\n\
        \x20   pickle.dump(top, open(f'{sys.argv[1]}/p{proto}.pickle', 'wb'), protocol=proto)\n";
    python_script(script, &[dir.path().as_os_str()]);
    let read = |proto: u32| {
        let mut snap = read_path(dir.path().join(format!("p{proto}.pickle"))).unwrap();
        snap.meta.source = None;
        snap
    };
    let by_opcodes = read(2);
    assert_eq!(by_opcodes.traces[0].events.len(), 60);
    assert_eq!(by_opcodes.segments[0].blocks.len(), 50);
    assert_eq!(read(4), by_opcodes);
    assert_eq!(read(5), by_opcodes);
}

/// Files of format version 1 (frame texts in full, stacks as lists; written
/// by snapdiff before version 2) still read, to the same snapshot.
#[test]
fn snap_files_of_format_version_1_still_read() {
    let v1_file = fixture("snap-v1/snapshot-p4.snap");
    let bytes = std::fs::read(&v1_file).unwrap();
    assert_eq!(bytes[8..12], 1u32.to_le_bytes(), "a version 1 file");
    let mut original = read_path(fixture("torch-format/snapshot-p4.pickle")).unwrap();
    original.sort_frames(); // as convert writes them
    assert_eq!(read_path(&v1_file).unwrap(), original);
    assert_eq!(
        without_events(&bytes),
        with_events_dropped(original.clone())
    );
    // Written again, it is version 3, and reads the same.
    let v3 = snap_bytes(&original);
    assert_eq!(v3[8..12], 3u32.to_le_bytes());
    assert_eq!(read_bytes(&v3).unwrap(), original);
}

/// Files of format version 2 (one zstd frame holding the whole snapshot,
/// events in the middle) still read, whole and without their events.
#[test]
fn snap_files_of_format_version_2_still_read() {
    for name in ["newest-step6.pickle", "snapshot-2dev-awaiting.pickle"] {
        let snap = read_path(fixture(&format!("torch-format/{name}"))).unwrap();
        assert!(snap.trace_len() > 0, "{name} has a trace");
        let body = crate::util::snap_v2_body(&snap);
        let v2 =
            crate::util::snap_v2_file(body.len() as u64, &zstd::bulk::compress(&body, 3).unwrap());
        assert_eq!(read_bytes(&v2).unwrap(), snap, "{name}");
        assert_eq!(without_events(&v2), with_events_dropped(snap), "{name}");
    }
}

#[test]
fn convert_writes_snap_and_json_and_refuses_to_overwrite() {
    let dir = tempdir();
    let input = fixture("torch-format/snapshot-p4.pickle");
    let snap_out = dir.path().join("a.snap");
    let json_out = dir.path().join("a.json");
    snapdiff(["convert".as_ref(), input.as_os_str(), snap_out.as_os_str()]).expect_code(0);
    snapdiff([
        "convert".as_ref(),
        snap_out.as_os_str(),
        json_out.as_os_str(),
    ])
    .expect_code(0);
    let mut original = read_path(&input).unwrap();
    original.sort_frames(); // as convert writes them
    assert_eq!(read_path(&snap_out).unwrap(), original);
    assert_eq!(read_path(&json_out).unwrap(), original);

    // An existing file is not replaced without --force.
    std::fs::write(&json_out, "keep me").unwrap();
    let run = snapdiff(["convert".as_ref(), input.as_os_str(), json_out.as_os_str()]);
    run.expect_code(2);
    assert!(run.stderr().contains("already exists"), "{}", run.stderr());
    assert_eq!(std::fs::read_to_string(&json_out).unwrap(), "keep me");
    snapdiff([
        "convert".as_ref(),
        "--force".as_ref(),
        input.as_os_str(),
        json_out.as_os_str(),
    ])
    .expect_code(0);
    original.meta.label = None;
    assert_eq!(read_path(&json_out).unwrap(), original);

    let bad_ext = dir.path().join("a.txt");
    let run = snapdiff(["convert".as_ref(), input.as_os_str(), bad_ext.as_os_str()]);
    run.expect_code(2);
    assert!(
        run.stderr().contains("name it .snap, .json or .pickle"),
        "{}",
        run.stderr()
    );
}

/// Writes `bytes` to a file, runs `snapdiff summary` on it, and checks for
/// exit code 2 and one line of error naming the file and containing
/// `expect`; then the same of `baseline` of it (writing no baseline) and of
/// `check` of it against a baseline beside it.
fn check_bad_input(dir: &Path, name: &str, bytes: &[u8], expect: &str) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let written = dir.join(format!("{name}.baseline.json"));
    let against = dir.join("good.baseline.json");
    if !against.exists() {
        let good = fixture("torch-format/snapshot-p4.pickle");
        snapdiff([
            "baseline".as_ref(),
            good.as_os_str(),
            "-o".as_ref(),
            against.as_os_str(),
        ])
        .expect_code(0);
    }
    let runs = [
        vec!["summary".as_ref(), path.as_os_str()],
        vec![
            "baseline".as_ref(),
            path.as_os_str(),
            "-o".as_ref(),
            written.as_os_str(),
        ],
        vec!["check".as_ref(), against.as_os_str(), path.as_os_str()],
    ];
    for args in runs {
        let command = args[0].to_string_lossy().into_owned();
        let run = snapdiff(args);
        run.expect_code(2);
        let err = run.stderr();
        assert_eq!(
            err.lines().count(),
            1,
            "{command} {name}: not one line: {err}"
        );
        assert!(
            err.starts_with(&format!("snapdiff: {}: ", path.display())),
            "{command} {name}: {err}"
        );
        assert!(
            err.contains(expect),
            "{command} {name}: expected {expect:?} in {err}"
        );
        assert!(!err.contains("panicked"), "{command} {name}: {err}");
    }
    assert!(!written.exists(), "{name}: a baseline was written");
}

#[test]
fn bad_input_gets_one_clear_line_and_exit_code_2() {
    let dir = tempdir();
    let d = dir.path();
    let good = std::fs::read(fixture("torch-format/snapshot-p4.pickle")).unwrap();

    check_bad_input(d, "empty.pickle", b"", "empty file");
    check_bad_input(
        d,
        "truncated.pickle",
        &good[..good.len() / 2],
        "truncated at byte",
    );
    let mut random = vec![0u8; 4096];
    let mut x: u32 = 12345;
    for b in &mut random {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        *b = (x >> 16) as u8;
    }
    check_bad_input(d, "random.bin", &random, "not a snapshot");
    // A dict with total_size as a string.
    check_bad_input(
        d,
        "wrong-type.pickle",
        &pickle4(b"}(\x8c\x08segments](}(\x8c\x07addressK\x00\x8c\x0atotal_size\x8c\x03big\x8c\x06blocks]ueu."),
        "segments[0].total_size: expected an integer, found a string",
    );
    check_bad_input(
        d,
        "int.pickle",
        &pickle4(b"K\x07."),
        "holds an integer, not a memory snapshot",
    );
    check_bad_input(
        d,
        "other-dict.pickle",
        &pickle4(b"}(\x8c\x01aK\x01u."),
        "a dict without 'segments'",
    );
    check_bad_input(
        d,
        "absurd-length.pickle",
        &pickle4(b"X\xff\xff\xff\xff"),
        "truncated at byte 7 while reading BINUNICODE",
    );
    check_bad_input(
        d,
        "absurd-length8.pickle",
        &pickle4(b"\x8d\xff\xff\xff\xff\xff\xff\xff\xff"),
        "truncated",
    );
    check_bad_input(
        d,
        "memo.pickle",
        &pickle4(b"j\x00\x00\x00\x10."),
        "memo slot 268435456",
    );

    // Thousands of nested lists inside a snapshot: refused, no stack overflow.
    let mut deep = b"}(\x8c\x08segments]\x8c\x12allocator_settings".to_vec();
    deep.extend(std::iter::repeat_n(b'(', 3000));
    deep.extend(std::iter::repeat_n(b'l', 3000));
    deep.extend(b"u.");
    check_bad_input(
        d,
        "deep.pickle",
        &pickle4(&deep),
        "nested deeper than 64 levels",
    );
    // Millions of marks and nothing else.
    let mut marks = vec![b'('; 5_000_000];
    marks.push(b'.');
    check_bad_input(
        d,
        "marks.pickle",
        &pickle4(&marks),
        "pickle stack over 1048576 values or 4096 marks deep at byte 4099",
    );

    // A trace event naming a stack or a string its file lacks: refused,
    // naming the event, in a `.snap` and in JSON.
    let real = read_bytes(&good).unwrap();
    let (stacks, strings) = (real.stacks.len() as u32, real.strings.len() as u32);
    for (what, event, expect) in [
        (
            "stack",
            TraceEvent {
                stack: Some(stacks + 4),
                ..TraceEvent::default()
            },
            format!(
                "refers to stack {}, but there are {stacks} stacks",
                stacks + 4
            ),
        ),
        (
            "string",
            TraceEvent {
                user_metadata: Some(strings),
                ..TraceEvent::default()
            },
            format!("refers to string {strings}, but there are {strings} strings"),
        ),
    ] {
        let mut bad = real.clone();
        let plain = TraceEvent {
            address: 4096,
            size: 512,
            ..TraceEvent::default()
        };
        bad.traces = vec![DeviceTrace {
            device: 0,
            events: [plain.clone(), plain, event].into_iter().collect(),
        }];
        let expect = format!("device 0 trace event 2 {expect}");
        let mut json = Vec::new();
        write_json(&bad, &mut json).unwrap();
        check_bad_input(d, &format!("bad-{what}.json"), &json, &expect);
        let mut snap = Vec::new();
        write_snap(&bad, &mut snap).unwrap();
        check_bad_input(d, &format!("bad-{what}.snap"), &snap, &expect);
    }

    // Code and tensors are refused, saying what the file is.
    check_bad_input(
        d,
        "global.pickle",
        &pickle4(b"\x8c\x0ctorch._utils\x8c\x12_rebuild_tensor_v2\x93)R."),
        "torch._utils._rebuild_tensor_v2",
    );
    check_bad_input(
        d,
        "global2.pickle",
        b"\x80\x02cos\nsystem\nq\x00.",
        "Python object \"os.system\" (GLOBAL at byte 2)",
    );
    check_bad_input(d, "reduce.pickle", &pickle4(b")R."), "REDUCE at byte 3");
    check_bad_input(d, "persid.pickle", &pickle4(b"K\x01Q."), "tensor storage");
    check_bad_input(
        d,
        "newer-protocol.pickle",
        b"\x80\x07N.",
        "pickle protocol 7",
    );

    // .snap headers and bodies.
    let mut snap = Vec::new();
    write_snap(
        &read_path(fixture("torch-format/snapshot-p4.pickle")).unwrap(),
        &mut snap,
    )
    .unwrap();
    check_bad_input(d, "short.snap", &snap[..12], "truncated .snap header");
    let mut newer = snap.clone();
    newer[8..12].copy_from_slice(&99u32.to_le_bytes());
    check_bad_input(
        d,
        "newer.snap",
        &newer,
        "format version 99 was written by a newer snapdiff",
    );
    let mut huge = snap.clone();
    huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    check_bad_input(d, "huge.snap", &huge, "cannot expand");
    check_bad_input(d, "cut.snap", &snap[..snap.len() - 10], ".snap events");
    check_bad_input(d, "cut-header.snap", &snap[..30], "truncated .snap header");
    check_bad_input(d, "cut-head.snap", &snap[..40], "its head frame of");
    // A whole frame that does not record its size, holding less than the
    // header declares: found as the events are decoded.
    let head_end = 36 + u64::from_le_bytes(snap[20..28].try_into().unwrap()) as usize;
    let events = zstd::bulk::decompress(&snap[head_end..], 1 << 30).unwrap();
    let mut short = snap[..head_end].to_vec();
    short[28..36].copy_from_slice(&(events.len() as u64 + 100).to_le_bytes());
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    encoder.include_contentsize(false).unwrap();
    std::io::Write::write_all(&mut encoder, &events).unwrap();
    short.extend(encoder.finish().unwrap());
    check_bad_input(
        d,
        "short-events.snap",
        &short,
        &format!(
            "truncated .snap events: {} of {} bytes",
            events.len(),
            events.len() + 100
        ),
    );
    let mut garbage = snap[..36].to_vec();
    garbage[20..28].copy_from_slice(&(random.len() as u64).to_le_bytes());
    garbage.extend_from_slice(&random);
    check_bad_input(d, "garbage.snap", &garbage, "corrupt .snap head");
    // Another snapshot's events under this one's head.
    let mut other = Vec::new();
    write_snap(
        &read_path(fixture("torch-format/newest-step6.pickle")).unwrap(),
        &mut other,
    )
    .unwrap();
    let other_head_end = 36 + u64::from_le_bytes(other[20..28].try_into().unwrap()) as usize;
    let mut swapped = snap[..head_end].to_vec();
    swapped[28..36].copy_from_slice(&other[28..36]);
    swapped.extend_from_slice(&other[other_head_end..]);
    check_bad_input(
        d,
        "swapped-events.snap",
        &swapped,
        "where its head declares",
    );

    // JSON.
    check_bad_input(
        d,
        "newer.json",
        br#"{"snapdiff_format": 7, "snapshot": {}}"#,
        "format version 7",
    );
    check_bad_input(
        d,
        "broken.json",
        b"{\"snapdiff_format\": 1, ",
        "invalid snapdiff JSON",
    );
    let deep_json = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    check_bad_input(
        d,
        "deep.json",
        format!(" {{\"x\": {deep_json}}}").as_bytes(),
        "invalid snapdiff JSON",
    );

    // Zips.
    check_bad_input(d, "notorch.zip", b"PK\x03\x04garbage", "broken zip file");

    // A missing file.
    let run = snapdiff(["summary", "/nonexistent/x.pickle"]);
    run.expect_code(2);
    assert_eq!(
        run.stderr(),
        "snapdiff: /nonexistent/x.pickle: cannot read: No such file or directory (os error 2)\n",
        "the cause once"
    );
}

#[test]
fn every_prefix_of_a_pickle_is_an_error_not_a_panic() {
    let good = std::fs::read(fixture("torch-format/legacy-history.pickle")).unwrap();
    for cut in 0..good.len() {
        let err = read_bytes(&good[..cut]).expect_err("a truncated pickle must not read");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::Truncated | ErrorKind::UnknownFormat | ErrorKind::Malformed
            ),
            "cut at {cut}: {err}"
        );
    }
    // Flipping any single byte never panics either.
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x5a;
        let _ = read_bytes(&bad);
    }
}

/// Every real fixture compressed by CPython (gzip, xz, bzip2) and by zstd
/// reads, by its bytes whatever its name, to the same report as the file.
#[test]
fn compressed_snapshots_read_as_the_file_inside() {
    let Some(files) = crate::util::shared_torch_fixtures() else {
        return crate::util::skip("compressed", "../shared/fixtures/torch is not here");
    };
    let dir = tempdir();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let plain = snapdiff(["summary".as_ref(), "--json".as_ref(), file.as_os_str()])
            .expect_code(0)
            .stdout();
        let gz = dir.path().join(format!("{name}.gz"));
        let xz = dir.path().join(format!("{name}.xz"));
        // A name that says nothing of the compression: the bytes do.
        let bz2 = dir.path().join(format!("{name}-bzip2"));
        crate::util::python_script(
            "import sys, gzip, lzma, bz2\n\
             data = open(sys.argv[1], 'rb').read()\n\
             open(sys.argv[2], 'wb').write(gzip.compress(data))\n\
             open(sys.argv[3], 'wb').write(lzma.compress(data))\n\
             open(sys.argv[4], 'wb').write(bz2.compress(data))",
            &[
                file.as_os_str(),
                gz.as_os_str(),
                xz.as_os_str(),
                bz2.as_os_str(),
            ],
        );
        let zst = dir.path().join(format!("{name}.zst"));
        std::fs::write(
            &zst,
            zstd::encode_all(&std::fs::read(&file).unwrap()[..], 3).unwrap(),
        )
        .unwrap();
        for compressed in [&gz, &xz, &bz2, &zst] {
            let report = snapdiff([
                "summary".as_ref(),
                "--json".as_ref(),
                compressed.as_os_str(),
            ])
            .expect_code(0)
            .stdout();
            assert_eq!(report, plain, "{}", compressed.display());
        }
    }
}

#[test]
fn compressed_files_that_are_cut_bombs_or_not_snapshots_are_refused_in_one_line() {
    let dir = tempdir();
    let case = |name: &str, script: &str, expected: &str| {
        let path = dir.path().join(name);
        crate::util::python_script(script, &[path.as_os_str()]);
        let run = snapdiff(["summary".as_ref(), path.as_os_str()]);
        let err = run.expect_code(2).stderr();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(name) && err.contains(expected),
            "{name}: {err}"
        );
    };
    case(
        "cut.gz",
        "import sys, gzip, os; open(sys.argv[1], 'wb').write(gzip.compress(b'\\x80\\x04' + os.urandom(100000))[:5000])",
        "not a whole gzip stream",
    );
    // A pickle's header, then 128 MiB of zeros: gzip shrinks it 1000 times.
    case(
        "bomb.gz",
        "import sys, gzip; open(sys.argv[1], 'wb').write(gzip.compress(b'\\x80\\x04' + bytes(128 << 20)))",
        "refused as a bomb",
    );
    case(
        "text.xz",
        "import sys, lzma; open(sys.argv[1], 'wb').write(lzma.compress(b'hello, world' * 10))",
        "xz content is not a snapshot",
    );
    case(
        "twice.bz2",
        "import sys, bz2, gzip; open(sys.argv[1], 'wb').write(bz2.compress(gzip.compress(b'\\x80\\x04.')))",
        "compressed again",
    );
}
