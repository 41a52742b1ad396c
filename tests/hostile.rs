//! Hostile and odd input, one test per class of attack or accident: each is
//! refused with one line and exit code 2 (or read, where it is legitimate),
//! quickly and within a small memory bound, and nothing a file holds reaches
//! the terminal raw. The random search over such inputs is `tests/fuzz.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::util::{Run, fixture, pickle4, python_script, tempdir};

/// Runs `snapdiff` with `args` and returns the run and the peak resident
/// memory of that process, in bytes.
///
/// The run goes through a small Python parent, which reads its child's peak
/// from `getrusage`: Linux carries the peak of the process that spawns a
/// command over into the command's own, so measured straight from this test
/// process (hundreds of MB, with the other tests' buffers) it would say
/// nothing about snapdiff.
fn snapdiff_with_peak(args: &[&std::ffi::OsStr]) -> (Run, u64) {
    const PARENT: &str = "import resource, subprocess, sys\n\
        code = subprocess.call(sys.argv[2:])\n\
        open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n\
        sys.exit(code if code >= 0 else 128 - code)\n";
    let peak_file = tempfile::NamedTempFile::new().unwrap();
    let output = Command::new("python3")
        .args(["-c", PARENT])
        .arg(peak_file.path())
        .arg(env!("CARGO_BIN_EXE_snapdiff"))
        .args(args)
        .output()
        .expect("run python3 and snapdiff");
    let peak_kib: u64 = std::fs::read_to_string(peak_file.path())
        .unwrap()
        .parse()
        .unwrap();
    let run = Run {
        args: args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        output,
    };
    (run, peak_kib * 1024)
}

/// Writes `bytes` to `dir/name`, runs `summary` on it, and checks that it is
/// refused with one line containing `expect`, within `max_memory` bytes.
fn refused_within(dir: &Path, name: &str, bytes: &[u8], expect: &str, max_memory: u64) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let (run, peak) = snapdiff_with_peak(&["summary".as_ref(), path.as_os_str()]);
    run.expect_code(2);
    let err = run.stderr();
    assert_eq!(err.lines().count(), 1, "{name}: {err}");
    assert!(err.contains(expect), "{name}: expected {expect:?} in {err}");
    assert!(
        peak <= max_memory,
        "{name}: {} MiB for a {} KiB file",
        peak >> 20,
        bytes.len() >> 10
    );
}

const MIB: u64 = 1 << 20;

/// The opcodes of a short string.
fn s(text: &str) -> Vec<u8> {
    [&[0x8c, text.len() as u8][..], text.as_bytes()].concat()
}

/// A trace event dict, memoized in slot `slot` (BINPUT right after its
/// EMPTY_DICT, as pickles write it).
fn event_dict(slot: u8) -> Vec<u8> {
    event_dict_with(slot, &[])
}

/// [`event_dict`] with the opcodes of more keys and values, `more`.
fn event_dict_with(slot: u8, more: &[u8]) -> Vec<u8> {
    [
        &[b'}', b'q', slot, b'('][..],
        &s("action"),
        &s("alloc"),
        &s("addr"),
        b"K\x01",
        &s("size"),
        b"M\x00\x02",
        &s("stream"),
        b"K\x00",
        more,
        b"u",
    ]
    .concat()
}

#[test]
fn sparse_memo_indices_cost_memory_by_the_slots_written() {
    // 20 KB of PUTs to slots k * 65536: the memo once grew to the largest.
    let mut body = Vec::new();
    for k in 1..=3000u32 {
        body.push(b'N');
        body.push(b'r');
        body.extend_from_slice(&(k * 65536).to_le_bytes());
        body.push(b'0');
    }
    // And a get of the last, which must still find it.
    body.extend_from_slice(b"j");
    body.extend_from_slice(&(3000u32 * 65536).to_le_bytes());
    body.push(b'.');
    let dir = tempdir();
    refused_within(
        dir.path(),
        "sparse-memo.pickle",
        &pickle4(&body),
        "holds None, not a memory snapshot",
        64 * MIB,
    );
}

#[test]
fn an_event_dict_in_two_device_traces_is_refused_not_a_panic() {
    // {'segments': [], 'device_traces': [[e], [e]]} with e shared, as
    // CPython's pickler writes one object referred to twice.
    let dir = tempdir();
    let path = dir.path().join("shared-event.pickle");
    let script = "import pickle, sys\n\
        e = {'action': 'alloc', 'addr': 1, 'size': 512, 'stream': 0, 'frames': []}\n\
        pickle.dump({'segments': [], 'device_traces': [[e], [e]]}, open(sys.argv[1], 'wb'), protocol=4)\n";
    python_script(script, &[&path]);
    let bytes = std::fs::read(&path).unwrap();
    refused_within(
        dir.path(),
        "shared-event.pickle",
        &bytes,
        "the same trace event dict appears twice",
        64 * MIB,
    );
}

#[test]
fn a_frame_list_changed_after_its_event_is_refused() {
    // {'segments': [], 'device_traces': [[e]], 'x': L} where e's frames L
    // gets another frame appended after e was complete. A pickler writes a
    // list whole before the dict holding it, so this is a made-up file;
    // the reader takes a record's frames when the record is complete.
    let frame = [
        &[b'}', b'q', 6, b'('][..],
        &s("name"),
        &s("f"),
        &s("filename"),
        &s("m.py"),
        &s("line"),
        b"K\x01u",
    ]
    .concat();
    let frames = [&s("frames")[..], &[b']', b'q', 5, b'('], &frame, b"e"].concat();
    let event = event_dict_with(4, &frames);
    let body = [
        b"}(".as_slice(),
        &s("segments"),
        b"]",
        &s("device_traces"),
        b"](](",
        &event,
        b"ee",
        &s("x"),
        b"h\x05h\x06a",
        b"u.",
    ]
    .concat();
    let dir = tempdir();
    refused_within(
        dir.path(),
        "changed-frames.pickle",
        &pickle4(&body),
        "changes a dict or list after it was complete",
        64 * MIB,
    );
}

#[test]
fn a_long_trace_is_held_in_less_memory_than_its_pickle_takes() {
    // 400 000 events as PyTorch writes them (a fresh list of shared frame
    // dicts each), 36 MB: the reader once kept two containers, two memo
    // handles and a list handle per event, and peaked at twice the file.
    let dir = tempdir();
    let path = dir.path().join("long-trace.pickle");
    let script = "import pickle, sys\n\
        frames = [{'name': f'layer{i}.forward', 'filename': f'/src/model/block{i % 9}.py', 'line': 10 + i} for i in range(60)]\n\
        trace = [{'action': ('alloc', 'free_requested', 'free_completed')[i % 3], 'addr': 0x7f0000000000 + (i // 3) * 512,\n\
        \x20         'size': 512 * (1 + i % 64), 'stream': 0, 'time_us': 1_700_000_000_000_000 + i,\n\
        \x20         'frames': frames[i % 30:i % 30 + 25]} for i in range(400_000)]\n\
        pickle.dump({'segments': [], 'device_traces': [trace]}, open(sys.argv[1], 'wb'), protocol=4)\n";
    python_script(script, &[&path]);
    let size = std::fs::metadata(&path).unwrap().len();
    let (run, peak) = snapdiff_with_peak(&["summary".as_ref(), path.as_os_str()]);
    run.expect_code(0);
    assert!(run.stdout().contains("400000"), "{}", run.stdout());
    assert!(
        peak <= size + size / 3,
        "{} MiB for a {} MiB trace",
        peak >> 20,
        size >> 20
    );
}

#[test]
fn runs_of_stack_opcodes_are_refused_early() {
    let dir = tempdir();
    // 20 MB of EMPTY_LIST took 1.54 GB before refusal (CPython: 1.3 GB).
    let mut lists = vec![b']'; 20 << 20];
    lists.push(b'.');
    refused_within(
        dir.path(),
        "empty-lists.pickle",
        &pickle4(&lists),
        "pickle stack over 1048576 values",
        200 * MIB,
    );
    // 40 MB of memo references to one event dict took 936 MB before refusal
    // (CPython: 483 MB); the second reference is refused as it is read.
    let mut refs = [
        b"}(".as_slice(),
        &s("segments"),
        b"]",
        &s("device_traces"),
        b"](](",
    ]
    .concat();
    refs.extend(event_dict(9));
    for _ in 0..20_000 {
        refs.extend(std::iter::repeat_n([b'h', 9], 999).flatten());
        refs.extend(b"e(");
    }
    refs.extend(b"eeu.");
    refused_within(
        dir.path(),
        "event-refs.pickle",
        &pickle4(&refs),
        "the same trace event dict appears twice (at byte",
        64 * MIB,
    );
}

#[test]
fn a_list_holding_itself_a_million_times_is_refused_in_bounded_address_space() {
    // CPython's own pickler writes a list that holds itself as a 2 MB file
    // of memo references. Its items were given their room at every level
    // the list nests to before any was charged to the reader's budget: 64
    // levels of 32 MB, which aborted the reader where address space is
    // limited (`ulimit -v`, strict overcommit), though little of it was
    // ever touched.
    let dir = tempdir();
    let path = dir.path().join("self-holding.pickle");
    let script = "import pickle, sys\n\
        held = []\n\
        held.extend([held] * 1_000_000)\n\
        pickle.dump({'segments': [], 'device_traces': [], 'notes': held}, open(sys.argv[1], 'wb'), protocol=4)\n";
    python_script(script, &[&path]);
    // The limit is set in a Python parent, between fork and exec.
    const LIMITED: &str = "import resource, subprocess, sys\n\
        limit = int(sys.argv[1])\n\
        setlimit = lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n\
        done = subprocess.run(sys.argv[2:], preexec_fn=setlimit, capture_output=True)\n\
        sys.stderr.buffer.write(done.stderr)\n\
        sys.exit(done.returncode if done.returncode >= 0 else 128 - done.returncode)\n";
    let output = Command::new("python3")
        .args(["-c", LIMITED])
        .arg((2u64 << 30).to_string())
        .arg(env!("CARGO_BIN_EXE_snapdiff"))
        .arg("summary")
        .arg(&path)
        .output()
        .expect("run python3 and snapdiff");
    let run = Run {
        args: vec!["summary".to_owned(), path.display().to_string()],
        output,
    };
    run.expect_code(2);
    let err = run.stderr();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("notes: the pickle expands to far more values than its size allows"),
        "{err}"
    );
}

#[test]
fn one_segment_given_many_times_is_refused_in_bounded_memory() {
    // CPython's own pickler writes 20,000 references to one segment dict
    // of 1,000 blocks in 69 KB; each was read into a segment of its own
    // (1.4 GB, 20 million blocks).
    let dir = tempdir();
    let script = "import pickle, sys\n\
        blocks = [{'address': i * 512, 'size': 512, 'requested_size': 512, 'state': 'active_allocated', 'frames': []} for i in range(1000)]\n\
        seg = {'device': 0, 'address': 0, 'total_size': 512000, 'stream': 0, 'segment_type': 'large', 'allocated_size': 512000, 'active_size': 512000, 'requested_size': 512000, 'blocks': blocks}\n\
        pickle.dump({'segments': [seg] * 20000, 'device_traces': []}, open(sys.argv[1], 'wb'), protocol=4)\n\
        pickle.dump({'segments': [], 'device_traces': [], 'host_segments': [seg] * 20000}, open(sys.argv[2], 'wb'), protocol=4)\n";
    let device = dir.path().join("device.pickle");
    let host = dir.path().join("host.pickle");
    python_script(script, &[&device, &host]);
    refused_within(
        dir.path(),
        "one-segment-many-times.pickle",
        &std::fs::read(&device).unwrap(),
        "segments[1]: the same segment dict appears twice",
        64 * MIB,
    );
    // The pinned host allocator's list, where this reader cannot follow
    // it, is kept as a generic value, whose budget refuses it.
    refused_within(
        dir.path(),
        "one-host-segment-many-times.pickle",
        &std::fs::read(&host).unwrap(),
        "host_segments[11]: the pickle expands to far more values than its size allows",
        64 * MIB,
    );
}

#[test]
fn one_long_string_copied_into_many_records_is_refused_in_bounded_memory() {
    // One 100 KB string, pickled once and referred to through the memo by
    // 5,000 annotations, or by 5,000 distinct frames (of blocks and of
    // trace events), was copied into each: 0.5 GB and 1 GB from files of
    // 110 KB and 330 KB.
    let dir = tempdir();
    let script = "import pickle, sys\n\
        text = 'x' * 100_000\n\
        notes = [{'device': 0, 'time_us': 1, 'stage': 'START', 'name': text}] * 5000\n\
        pickle.dump({'segments': [], 'device_traces': [], 'external_annotations': notes}, open(sys.argv[1], 'wb'), protocol=4)\n\
        frames = [{'filename': text, 'line': i, 'name': 'f'} for i in range(5000)]\n\
        blocks = [{'address': i * 512, 'size': 512, 'requested_size': 512, 'state': 'active_allocated', 'frames': frames[i:i + 1]} for i in range(5000)]\n\
        seg = {'device': 0, 'address': 0, 'total_size': 512 * 5000, 'stream': 0, 'segment_type': 'large', 'allocated_size': 0, 'active_size': 0, 'requested_size': 0, 'blocks': blocks}\n\
        pickle.dump({'segments': [seg], 'device_traces': []}, open(sys.argv[2], 'wb'), protocol=4)\n\
        events = [{'action': 'alloc', 'addr': i, 'size': 512, 'stream': 0, 'frames': frames[i:i + 1]} for i in range(5000)]\n\
        pickle.dump({'segments': [], 'device_traces': [events]}, open(sys.argv[3], 'wb'), protocol=4)\n";
    let files = ["annotations", "block-frames", "event-frames"].map(|name| dir.path().join(name));
    python_script(script, &files);
    let expect = [
        "external_annotations[50].name: the pickle expands to far more values than its size allows",
        "its frames' names and files come to far more than its size allows",
        "its frames' names and files come to far more than its size allows",
    ];
    for (file, expect) in files.iter().zip(expect) {
        let name = format!("{}.pickle", file.file_name().unwrap().to_string_lossy());
        refused_within(
            dir.path(),
            &name,
            &std::fs::read(file).unwrap(),
            expect,
            64 * MIB,
        );
    }
}

/// A zstd frame of `n` zero bytes, made without holding them in memory.
fn zeros_frame(n: usize) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..n / chunk.len() {
        std::io::Write::write_all(&mut enc, &chunk).unwrap();
    }
    enc.finish().unwrap()
}

/// A `.snap` file of format version 3: its header declaring `head_len` and
/// `events_len` bytes, then `head_frame` and `events_frame` (one zstd frame
/// each, in a file snapdiff wrote).
fn snap_v3_file(head_len: u64, head_frame: &[u8], events_len: u64, events_frame: &[u8]) -> Vec<u8> {
    let mut out = snapdiff_format::MAGIC.to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&head_len.to_le_bytes());
    out.extend_from_slice(&(head_frame.len() as u64).to_le_bytes());
    out.extend_from_slice(&events_len.to_le_bytes());
    out.extend_from_slice(head_frame);
    out.extend_from_slice(events_frame);
    out
}

/// The head's length and frame, and the events' length and frame, of a
/// `.snap` file of format version 3.
fn snap_v3_parts(file: &[u8]) -> (u64, &[u8], u64, &[u8]) {
    let field = |at: usize| u64::from_le_bytes(file[at..at + 8].try_into().unwrap());
    let head_end = 36 + field(20) as usize;
    (field(12), &file[36..head_end], field(28), &file[head_end..])
}

#[test]
fn snap_decompression_bombs_are_refused_before_they_expand() {
    let dir = tempdir();
    let d = dir.path();
    let snap = snapdiff_format::read_path(fixture("torch-format/snapshot-p4.pickle")).unwrap();
    let mut real = Vec::new();
    snapdiff_format::write_snap(&snap, &mut real).unwrap();
    let (head_len, head, events_len, events) = snap_v3_parts(&real);
    let body = crate::util::snap_v2_body(&snap);
    let (body_len, frame) = (body.len() as u64, zstd::bulk::compress(&body, 3).unwrap());
    let frame = &frame[..];
    let bomb = zeros_frame(1 << 30);
    let mut skippable = 0x184D_2A50u32.to_le_bytes().to_vec();
    skippable.extend_from_slice(&8u32.to_le_bytes());
    skippable.extend_from_slice(&[0; 8]);
    let v2 = crate::util::snap_v2_file;

    let cases: [(&str, Vec<u8>, &str); 12] = [
        // Format version 2: one frame.
        (
            "skippable-first.snap",
            v2(1 << 30, &[&skippable[..], &bomb].concat()),
            "cannot expand",
        ),
        (
            "skippable-then-real.snap",
            v2(body_len, &[&skippable[..], frame].concat()),
            "does not start with a zstd frame",
        ),
        (
            "bomb-after-real.snap",
            v2(body_len, &[frame, &bomb[..]].concat()),
            "bytes follow its zstd frame",
        ),
        (
            "skippable-after-real.snap",
            v2(body_len, &[frame, &skippable[..]].concat()),
            "bytes follow its zstd frame",
        ),
        (
            "wrong-declared-size.snap",
            v2(body_len * 4, frame),
            "the header says",
        ),
        // Version 3: the same, in the head and in the events.
        (
            "head-bomb.snap",
            snap_v3_file(1 << 30, &bomb, events_len, events),
            "cannot expand",
        ),
        (
            "skippable-then-head.snap",
            snap_v3_file(
                head_len,
                &[&skippable[..], head].concat(),
                events_len,
                events,
            ),
            "does not start with a zstd frame",
        ),
        (
            "bomb-after-head.snap",
            snap_v3_file(head_len, &[head, &bomb[..]].concat(), events_len, events),
            "corrupt .snap head",
        ),
        (
            "wrong-head-size.snap",
            snap_v3_file(head_len * 4, head, events_len, events),
            "the header says",
        ),
        (
            "events-bomb.snap",
            snap_v3_file(head_len, head, 1 << 30, &bomb),
            "cannot expand",
        ),
        (
            "bomb-after-events.snap",
            snap_v3_file(head_len, head, events_len, &[events, &bomb[..]].concat()),
            "bytes follow its zstd frame",
        ),
        (
            "wrong-events-size.snap",
            snap_v3_file(head_len, head, events_len * 4, events),
            "the header says",
        ),
    ];
    for (name, bytes, expect) in cases {
        refused_within(d, name, &bytes, expect, 64 * MIB);
    }
}

#[test]
fn a_small_snap_declaring_millions_of_events_is_refused_in_bounded_memory() {
    // Three million empty events: each column a run of zero bytes, which
    // zstd packs into a few kilobytes; read, they would take over 100 MB.
    let mut events = snapdiff_format::Events::new();
    for _ in 0..3_000_000 {
        events.push(snapdiff_format::TraceEvent::default());
    }
    let snap = snapdiff_format::Snapshot {
        traces: vec![snapdiff_format::DeviceTrace { device: 0, events }],
        ..Default::default()
    };
    let mut file = Vec::new();
    snapdiff_format::write_snap(&snap, &mut file).unwrap();
    drop(snap);
    assert!(file.len() < 64 << 10, "{} bytes", file.len());
    let dir = tempdir();
    // Refused from the head, before any event is read.
    refused_within(
        dir.path(),
        "empty-events.snap",
        &file,
        "its traces declare more than 1048576 events, the most a",
        peak_reading_a_small_file() + 4 * MIB,
    );
}

/// The memory `snapdiff summary` takes to read a small `.snap` file: what
/// the program takes before it reads anything much.
fn peak_reading_a_small_file() -> u64 {
    let (run, peak) = snapdiff_with_peak(&[
        "summary".as_ref(),
        fixture("snap-v1/snapshot-p4.snap").as_os_str(),
    ]);
    run.expect_code(0);
    peak
}

/// The reliability campaign's file: a `.snap` of format version 2, 241
/// KB, whose one trace holds 150 million empty events (its actions column
/// alone 150 MB of zero bytes, which zstd packs into nothing; the file's
/// size is a label of random text). It was read whole, 410 MiB, before the
/// event count refused it; each column is now read no further than the
/// events a file of its size may hold (64 a byte).
#[test]
fn the_campaigns_snap_of_150_million_empty_events_is_refused_in_bounded_memory() {
    let mut rng = fastrand::Rng::with_seed(150);
    let label: String = (0..240_000).map(|_| rng.alphanumeric()).collect();
    let one_event = snapdiff_format::Snapshot {
        meta: snapdiff_format::Meta {
            label: Some(label),
            ..Default::default()
        },
        traces: vec![snapdiff_format::DeviceTrace {
            device: 0,
            events: [snapdiff_format::TraceEvent::default()]
                .into_iter()
                .collect(),
        }],
        ..Default::default()
    };
    // The body, its actions column (bin 8 of length 1, holding 0) replaced
    // by a bin 32 of 150 million zero bytes.
    let body = crate::util::snap_v2_body(&one_event);
    let trace = rmp_serde::to_vec(&one_event.traces[0]).unwrap();
    let at = body
        .windows(trace.len())
        .position(|w| w == trace)
        .expect("the trace's bytes in the body");
    assert_eq!(
        &trace[..5],
        [0x9e, 0x00, 0xc4, 0x01, 0x00],
        "array, device, actions"
    );
    let count: u32 = 150_000_000;
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    let mut body_len = 0u64;
    let mut write = |bytes: &[u8]| {
        std::io::Write::write_all(&mut encoder, bytes).unwrap();
        body_len += bytes.len() as u64;
    };
    write(&body[..at + 2]);
    write(&[0xc6]);
    write(&count.to_be_bytes());
    let zeros = vec![0u8; 1 << 20];
    for chunk in 0..count.div_ceil(1 << 20) {
        let len = (count - chunk * (1 << 20)).min(1 << 20);
        write(&zeros[..len as usize]);
    }
    write(&body[at + 5..]);
    let file = crate::util::snap_v2_file(body_len, &encoder.finish().unwrap());
    assert!(file.len() < 256_000, "{} bytes", file.len());
    let dir = tempdir();
    refused_within(
        dir.path(),
        "150M-events-v2.snap",
        &file,
        "a trace column is longer than its events can make it",
        peak_reading_a_small_file() + 32 * MIB,
    );

    // Since format version 3 the head says how many events each trace
    // has: the same claim is refused before any event is read.
    let mut v3 = Vec::new();
    snapdiff_format::write_snap(&one_event, &mut v3).unwrap();
    let (_, head_frame, events_len, events_frame) = snap_v3_parts(&v3);
    let mut head = zstd::bulk::decompress(head_frame, 1 << 30).unwrap();
    let one = [0x92, 0x00, 0x01]; // the trace's head: [device 0, 1 event]
    let at = head.windows(3).rposition(|w| w == one).unwrap();
    let claim = [&[0x92, 0x00, 0xce][..], &count.to_be_bytes()].concat();
    head.splice(at..at + 3, claim);
    let head_frame = zstd::bulk::compress(&head, 3).unwrap();
    let file = snap_v3_file(head.len() as u64, &head_frame, events_len, events_frame);
    assert!(
        file.len() > 170_000 && file.len() < 256_000,
        "{} bytes",
        file.len()
    );
    refused_within(
        dir.path(),
        "150M-events-v3.snap",
        &file,
        "its traces declare more than 1048576 events",
        peak_reading_a_small_file() + 4 * MIB,
    );
}

/// A `.snap` file of format version 3 holding `snap`, its head's table
/// `table` (the bytes the writer made for it, found once) replaced by what
/// `replace` writes: the head compressed as it is written, never held.
fn snap_v3_with_table(
    snap: &snapdiff_format::Snapshot,
    table: &[u8],
    replace: impl FnOnce(&mut dyn FnMut(&[u8])),
) -> Vec<u8> {
    let mut real = Vec::new();
    snapdiff_format::write_snap(snap, &mut real).unwrap();
    let (head_len, head_frame, events_len, events_frame) = snap_v3_parts(&real);
    let head = zstd::bulk::decompress(head_frame, 1 << 30).unwrap();
    if !head.windows(table.len()).any(|w| w == table) {
        // The table is in the events frame.
        let events = zstd::bulk::decompress(events_frame, 1 << 30).unwrap();
        let (events_len, events_frame) = replaced(&events, table, replace);
        return snap_v3_file(head_len, head_frame, events_len, &events_frame);
    }
    let (head_len, head_frame) = replaced(&head, table, replace);
    snap_v3_file(head_len, &head_frame, events_len, events_frame)
}

/// `body` with `table` (found once) replaced by what `replace` writes,
/// compressed as it is written: its length and its zstd frame.
fn replaced(
    body: &[u8],
    table: &[u8],
    replace: impl FnOnce(&mut dyn FnMut(&[u8])),
) -> (u64, Vec<u8>) {
    let at = body.windows(table.len()).position(|w| w == table);
    let at = at.expect("the table's bytes in the frame");
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
    let mut len = 0u64;
    let mut write = |bytes: &[u8]| {
        std::io::Write::write_all(&mut encoder, bytes).unwrap();
        len += bytes.len() as u64;
    };
    write(&body[..at]);
    replace(&mut write);
    write(&body[at + table.len()..]);
    (len, encoder.finish().unwrap())
}

/// `n` copies of `bytes`, written a megabyte at a time.
fn repeat(write: &mut dyn FnMut(&[u8]), bytes: &[u8], n: usize) {
    let chunk = bytes.repeat((1 << 20) / bytes.len());
    let per_chunk = chunk.len() / bytes.len();
    for _ in 0..n / per_chunk {
        write(&chunk);
    }
    write(&bytes.repeat(n % per_chunk));
}

/// A varint as the `.snap` tables write them.
fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

/// A head's tables other than segments and events expand at most 13
/// times from their frame in real files: a head of 16 million empty
/// strings, empty stacks or empty values, or an events frame of as many
/// names of unknown actions beside a trace's columns, which zstd packs into
/// a kilobyte and which would take 400 MB and more read, is refused once it
/// is past what its frame allows, in a few MiB (2 to 5 measured).
#[test]
fn a_small_file_of_millions_of_empty_items_is_refused_in_bounded_memory() {
    use snapdiff_format::{Snapshot, Value};
    const N: u32 = 16_000_000;
    let dir = tempdir();
    let most = peak_reading_a_small_file() + 8 * MIB;
    let expect = "its tables other than segments and events take more than";

    let strings = Snapshot {
        strings: vec!["HOSTILE-MARKER".into()],
        ..Default::default()
    };
    let file = snap_v3_with_table(&strings, b"\x91\xaeHOSTILE-MARKER", |write| {
        write(&[&[0xdd][..], &N.to_be_bytes()].concat());
        repeat(write, &[0xa0], N as usize);
    });
    assert!(file.len() < 8 << 10, "{} bytes", file.len());
    refused_within(dir.path(), "empty-strings.snap", &file, expect, most);

    let stacks = Snapshot {
        stacks: vec![vec![7; 5]],
        ..Default::default()
    };
    let file = snap_v3_with_table(&stacks, &[0xc4, 7, 1, 5, 7, 7, 7, 7, 7], |write| {
        let count = varint(N.into());
        let len = count.len() as u32 + N;
        write(&[&[0xc6][..], &len.to_be_bytes(), &count].concat());
        repeat(write, &[0], N as usize);
    });
    assert!(file.len() < 8 << 10, "{} bytes", file.len());
    refused_within(dir.path(), "empty-stacks.snap", &file, expect, most);

    let values = Snapshot {
        extra: vec![("HOSTILE".into(), Value::List(Vec::new()))],
        ..Default::default()
    };
    let file = snap_v3_with_table(&values, b"\xa7HOSTILE\x90", |write| {
        write(b"\xa7HOSTILE\xdd");
        write(&N.to_be_bytes());
        repeat(write, &[0xc0], N as usize);
    });
    assert!(file.len() < 8 << 10, "{} bytes", file.len());
    refused_within(dir.path(), "empty-values.snap", &file, expect, most);

    // Beside a trace's columns, in the events frame: the names of its
    // unknown actions.
    let names = Snapshot {
        traces: vec![snapdiff_format::DeviceTrace {
            device: 0,
            events: [snapdiff_format::TraceEvent {
                action: snapdiff_format::Action::Other("HOSTILE-NAME".into()),
                ..Default::default()
            }]
            .into_iter()
            .collect(),
        }],
        ..Default::default()
    };
    let file = snap_v3_with_table(&names, b"\x91\xacHOSTILE-NAME", |write| {
        write(&[&[0xdd][..], &N.to_be_bytes()].concat());
        repeat(write, &[0xa0], N as usize);
    });
    assert!(file.len() < 8 << 10, "{} bytes", file.len());
    refused_within(dir.path(), "empty-names.snap", &file, expect, most);
}

/// A million blocks (and more) of one size from one line, as a leak of one
/// line's tensors leaves them, compress ten thousand times: such a file
/// reads, while a smaller frame declaring more blocks than it may hold is
/// refused before they are built.
#[test]
fn a_segment_table_holds_what_its_frame_allows() {
    use snapdiff_format::{Block, Segment, Snapshot};
    let leak = Snapshot {
        stacks: vec![Vec::new()],
        segments: (0..300u64)
            .map(|s| Segment {
                address: s << 21,
                total_size: 1 << 21,
                blocks: (0..4096u64)
                    .map(|b| Block {
                        address: (s << 21) + b * 512,
                        size: 512,
                        requested_size: 4,
                        stack: Some(0),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let mut file = Vec::new();
    snapdiff_format::write_snap(&leak, &mut file).unwrap();
    assert!(file.len() < 4 << 10, "{} bytes", file.len());
    let back = snapdiff_format::read_bytes(&file).unwrap();
    assert_eq!(back.segments.len(), 300);
    assert_eq!(
        back.segments[299].blocks[4095],
        leak.segments[299].blocks[4095]
    );
    drop((leak, back));

    // One segment of 1.2 million blocks of 5 bytes each, 6 MB that zstd
    // packs into about 500 bytes: a frame that small may hold a million.
    const N: u32 = 1_200_000;
    let one = Snapshot {
        segments: vec![Segment::default()],
        ..Default::default()
    };
    let mut table = Vec::new();
    snapdiff_format::write_snap(&one, &mut table).unwrap();
    let (_, head_frame, _, _) = snap_v3_parts(&table);
    let head = zstd::bulk::decompress(head_frame, 1 << 20).unwrap();
    // The table of one empty segment: count, its fields, no blocks, the
    // rare fields' document ([[], []], 3 bytes).
    let empty = [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 3, 0x92, 0x90, 0x90];
    let table = [&[0xc4, empty.len() as u8][..], &empty].concat();
    assert!(head.windows(table.len()).any(|w| w == table));
    let file = snap_v3_with_table(&one, &table, |write| {
        let count = varint(N.into());
        let len = empty.len() as u32 - 1 + count.len() as u32 + 5 * N;
        write(&[&[0xc6][..], &len.to_be_bytes(), &empty[..9], &count].concat());
        // Each block: its address where the last ended, size 1, 1 requested,
        // a sequence number 0.
        repeat(write, &[0, 1, 1, 8, 0], N as usize);
        write(&empty[10..]);
    });
    let head_frame_len = snap_v3_parts(&file).1.len() as u32;
    assert!(2048 * head_frame_len < N, "a {head_frame_len}-byte frame");
    let dir = tempdir();
    refused_within(
        dir.path(),
        "many-blocks.snap",
        &file,
        "segments and blocks, the most a",
        peak_reading_a_small_file() + 16 * MIB,
    );
}

#[test]
fn json_with_a_byte_order_mark_reads() {
    let dir = tempdir();
    let plain = dir.path().join("plain.json");
    crate::util::snapdiff([
        "convert".as_ref(),
        fixture("torch-format/snapshot-p4.pickle").as_os_str(),
        plain.as_os_str(),
    ])
    .expect_code(0);
    let with_bom = dir.path().join("bom.json");
    let text = std::fs::read(&plain).unwrap();
    std::fs::write(&with_bom, [b"\xEF\xBB\xBF".as_slice(), &text].concat()).unwrap();
    let a = crate::util::snapdiff(["summary".as_ref(), plain.as_os_str(), "--json".as_ref()]);
    let b = crate::util::snapdiff(["summary".as_ref(), with_bom.as_os_str(), "--json".as_ref()]);
    b.expect_code(0);
    assert_eq!(a.json()["totals"], b.json()["totals"]);
}

#[test]
fn a_zip_inside_data_pkl_is_named_as_such() {
    let dir = tempdir();
    let path = dir.path().join("nested.pt");
    let script = "import io, sys, zipfile\n\
        inner = io.BytesIO()\n\
        with zipfile.ZipFile(inner, 'w') as z: z.writestr('x', b'y')\n\
        with zipfile.ZipFile(sys.argv[1], 'w') as z: z.writestr('nested/data.pkl', inner.getvalue())\n";
    python_script(script, &[&path]);
    let bytes = std::fs::read(&path).unwrap();
    refused_within(
        dir.path(),
        "nested.pt",
        &bytes,
        "data.pkl holds a zip file, not a pickle",
        64 * MIB,
    );
}

#[test]
fn a_zip_with_two_data_pkl_is_refused() {
    // Two snapshots under two folders: which one is "the file" is a guess.
    let dir = tempdir();
    let path = dir.path().join("two.pt");
    let script = "import sys, zipfile\n\
        real = open(sys.argv[2], 'rb').read()\n\
        with zipfile.ZipFile(sys.argv[1], 'w') as z:\n\
        \x20   z.writestr('a/data.pkl', real)\n\
        \x20   z.writestr('b/data.pkl', real)\n";
    python_script(
        script,
        &[&path, &fixture("torch-format/snapshot-p4.pickle")],
    );
    let bytes = std::fs::read(&path).unwrap();
    refused_within(
        dir.path(),
        "two.pt",
        &bytes,
        "the zip holds more than one data.pkl",
        64 * MIB,
    );
}

#[test]
fn racing_converts_to_one_output_replace_nothing() {
    let dir = tempdir();
    let out = dir.path().join("out.snap");
    let input = fixture("torch-format/snapshot-p4.pickle");
    let runs: Vec<_> = (0..6)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_snapdiff"))
                .args(["convert".as_ref(), input.as_os_str(), out.as_os_str()])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outcomes: Vec<Output> = runs
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let won = outcomes.iter().filter(|o| o.status.success()).count();
    assert_eq!(won, 1, "exactly one convert may write the file");
    for o in outcomes.iter().filter(|o| !o.status.success()) {
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("already exists"), "{err}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "out.snap")
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// Control characters that must never reach a terminal from a file, as a
/// Python string literal: retitle the terminal, turn text red, go back to
/// the start of the line, and a C1 control sequence introducer.
const HOSTILE_PY: &str = r"\x1b]0;pwned\x07\x1b[31m\r\x9b";

/// Whether `text` holds a control character other than newline.
fn has_raw_controls(text: &str) -> bool {
    text.chars().any(|c| c.is_control() && c != '\n')
}

#[test]
fn frame_names_with_control_characters_are_escaped_in_every_report() {
    let dir = tempdir();
    let d = dir.path();
    let (a, b) = hostile_snapshots(d, HOSTILE_PY, "");

    let runs = [
        vec!["summary".as_ref(), a.as_os_str()],
        vec!["compare".as_ref(), a.as_os_str(), b.as_os_str()],
        vec!["trend".as_ref(), a.as_os_str()],
        vec![
            "trend".as_ref(),
            a.as_os_str(),
            b.as_os_str(),
            a.as_os_str(),
        ],
    ];
    let mut escaped_seen = false;
    for args in runs {
        let (run, _) = snapdiff_with_peak(&args);
        let (out, err) = (run.stdout(), run.stderr());
        assert!(
            !has_raw_controls(&out) && !has_raw_controls(&err),
            "snapdiff {:?} printed raw control characters:\n{out}\n{err}",
            run.args
        );
        escaped_seen |= out.contains("\\x1b]0;pwned\\x07");
    }
    assert!(escaped_seen, "no report showed the hostile name, escaped");

    // With colour on, snapdiff's own colour codes pass and nothing else: the
    // terminal title sequence stays escaped. (The file's own red code is
    // one of them; all it can do is colour text red.)
    let run = crate::util::snapdiff([
        "compare".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--color".as_ref(),
        "always".as_ref(),
    ]);
    let out = run.stdout();
    assert!(out.contains("\x1b[31m+"), "growth in red: {out}");
    let without_colors = out
        .replace("\x1b[31m", "")
        .replace("\x1b[32m", "")
        .replace("\x1b[0m", "");
    assert!(!has_raw_controls(&without_colors), "{out}");
    assert!(out.contains("\\x1b]0;pwned\\x07"), "{out}");

    // JSON output keeps the text exact.
    let run = crate::util::snapdiff(["summary".as_ref(), a.as_os_str(), "--json".as_ref()]);
    assert!(
        run.stdout().contains("\\u001b]0;pwned\\u0007"),
        "{}",
        run.stdout()
    );

    // An error that names a global from the file escapes it too.
    let global = b"\x80\x02c\x1b]0;pwned\x07\nsystem\n.";
    let path = d.join("global.pickle");
    std::fs::write(&path, global).unwrap();
    let run = crate::util::snapdiff(["summary".as_ref(), path.as_os_str()]);
    run.expect_code(2);
    assert!(!has_raw_controls(&run.stderr()), "{}", run.stderr());
    assert!(
        run.stderr().contains("\\x1b]0;pwned\\x07.system"),
        "{}",
        run.stderr()
    );
}

/// Text that forges or hides output where it is passed on raw: a comment
/// opener and a script tag for a page, a newline followed by a forged
/// folded-stack count, NUL and ESC (invalid XML, terminal codes), a bidi
/// override and a line separator. As a Python string literal.
const FORGING_PY: &str = r"<!--<script>x 999999999999\nforged;stack\x00\x1b[2J\u202eyp.tpg\u2028</script><img src=x onerror=document.title=\x27pwned\x27>";

/// Two snapshots of the real-format fixture written by CPython's pickler
/// into `dir` as `{prefix}a.pickle` and `{prefix}b.pickle`, their `util.py`
/// frames named with `hostile` (a Python string literal) and their trace
/// frames ending with it; the second holds one more block of that site, so
/// compare shows it.
fn hostile_snapshots(dir: &Path, hostile: &str, prefix: &str) -> (PathBuf, PathBuf) {
    let script = format!(
        "import copy, pickle, sys\n\
         hostile = '{hostile}'\n\
         snap = pickle.load(open(sys.argv[1], 'rb'))\n\
         for seg in snap['segments']:\n\
         \x20   for b in seg['blocks']:\n\
         \x20       for f in b.get('frames', []):\n\
         \x20           if f['filename'].endswith('util.py'):\n\
         \x20               f['name'] = 'helper' + hostile\n\
         \x20               f['filename'] = '/home/user/' + hostile + '.py'\n\
         for trace in snap['device_traces']:\n\
         \x20   for e in trace:\n\
         \x20       for f in e.get('frames', []):\n\
         \x20           if hostile not in f['name']: f['name'] += hostile\n\
         pickle.dump(snap, open(sys.argv[2], 'wb'), protocol=4)\n\
         seg = snap['segments'][0]\n\
         seg['blocks'].append(copy.deepcopy(next(b for s in snap['segments'] for b in s['blocks'] if b['state'] == 'active_allocated')))\n\
         pickle.dump(snap, open(sys.argv[3], 'wb'), protocol=4)\n"
    );
    let (a, b) = (
        dir.join(format!("{prefix}a.pickle")),
        dir.join(format!("{prefix}b.pickle")),
    );
    python_script(
        &script,
        &[&fixture("torch-format/snapshot-p4.pickle"), &a, &b],
    );
    (a, b)
}

/// [`hostile_snapshots`] with [`FORGING_PY`], under a file name that holds
/// a page placeholder and a tag.
pub(crate) fn forging_snapshots(dir: &Path) -> (PathBuf, PathBuf) {
    hostile_snapshots(
        dir,
        FORGING_PY,
        "{{DATA}}<img src=x onerror=document.title='pwned'>",
    )
}

/// Whether `text` holds a character that hides or reorders text around it.
fn has_bidi_or_separators(text: &str) -> bool {
    text.chars()
        .any(|c| matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}'))
}

#[test]
fn text_from_a_file_cannot_forge_lines_or_reorder_them() {
    let dir = tempdir();
    let (a, b) = forging_snapshots(dir.path());
    for args in [
        vec!["summary".as_ref(), a.as_os_str()],
        vec![
            "compare".as_ref(),
            a.as_os_str(),
            b.as_os_str(),
            "--frames".as_ref(),
            "3".as_ref(),
        ],
        vec!["trend".as_ref(), a.as_os_str()],
        vec!["peak".as_ref(), a.as_os_str()],
    ] {
        let run = crate::util::snapdiff(&args);
        run.expect_code(0);
        let out = run.stdout();
        assert!(
            !has_raw_controls(&out) && !has_bidi_or_separators(&out),
            "snapdiff {:?}:\n{out}",
            run.args
        );
        // The forged text stays on the line of the frame it is in.
        assert!(
            !out.lines().any(|l| l.trim_start().starts_with("forged")),
            "snapdiff {:?} printed a forged line:\n{out}",
            run.args
        );
    }
    let out = crate::util::snapdiff(["compare".as_ref(), a.as_os_str(), b.as_os_str()]).stdout();
    assert!(
        out.contains("\\x0aforged") && out.contains("\\u{202e}"),
        "{out}"
    );

    // Folded stacks: one stack a line, each ending in a real count.
    let folded = crate::util::snapdiff([
        "flamegraph".as_ref(),
        a.as_os_str(),
        "--folded".as_ref(),
        "-o".as_ref(),
        "-".as_ref(),
    ]);
    folded.expect_code(0);
    let total: u64 = crate::util::snapdiff(["summary".as_ref(), a.as_os_str(), "--json".as_ref()])
        .json()["reserved_bytes"]
        .as_u64()
        .unwrap();
    let mut sum = 0;
    for line in folded.stdout().lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        assert!(!stack.is_empty() && !has_raw_controls(line), "{line:?}");
        sum += count.parse::<u64>().unwrap_or_else(|_| panic!("{line:?}"));
    }
    assert!(
        sum <= total,
        "folded stacks add up to {sum}, the file holds {total}"
    );

    // The SVG is XML a strict parser reads.
    let svg = dir.path().join("flame.svg");
    crate::util::snapdiff([
        "flamegraph".as_ref(),
        a.as_os_str(),
        "-o".as_ref(),
        svg.as_os_str(),
    ])
    .expect_code(0);
    python_script(
        "import sys, xml.dom.minidom\nxml.dom.minidom.parse(sys.argv[1])",
        &[&svg],
    );
}

#[test]
fn an_error_quotes_a_file_in_a_short_escaped_excerpt() {
    // STACK_GLOBAL of a module whose name holds a forged error line, and a
    // 600-character name.
    let module = "os\nsnapdiff: all snapshots are fine";
    let name = "A".repeat(600);
    let mut body = s(module);
    body.push(b'X');
    body.extend_from_slice(&(name.len() as u32).to_le_bytes());
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(b"\x93.");
    let dir = tempdir();
    let path = dir.path().join("global.pickle");
    std::fs::write(&path, pickle4(&body)).unwrap();
    let run = crate::util::snapdiff(["summary".as_ref(), path.as_os_str()]);
    run.expect_code(2);
    let err = run.stderr();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("os\\x0asnapdiff: all"), "{err}");
    assert!(
        err.chars().count() < 300,
        "{} characters: {err}",
        err.chars().count()
    );
}

#[test]
fn one_trace_list_for_two_devices_is_named_at_its_first_repeat() {
    let dir = tempdir();
    let path = dir.path().join("shared-trace.pickle");
    python_script(
        "import pickle, sys\n\
         e = {'action': 'alloc', 'addr': 1, 'size': 512, 'stream': 0, 'frames': []}\n\
         pickle.dump({'segments': [], 'device_traces': [[e]] * 1000}, open(sys.argv[1], 'wb'), protocol=4)",
        &[&path],
    );
    let run = crate::util::snapdiff(["summary".as_ref(), path.as_os_str()]);
    run.expect_code(2);
    assert!(
        run.stderr().contains("device_traces[1]:"),
        "{}",
        run.stderr()
    );
}

#[test]
fn text_that_is_not_utf8_is_read_and_said() {
    // A lone surrogate, as Python's "surrogatepass" writes it, in a key
    // snapdiff does not know.
    let dir = tempdir();
    let path = dir.path().join("surrogate.pickle");
    python_script(
        "import pickle, sys\n\
         snap = pickle.load(open(sys.argv[1], 'rb'))\n\
         snap['\\udc80 notes'] = 'x'\n\
         open(sys.argv[2], 'wb').write(pickle.dumps(snap, protocol=4))",
        &[&fixture("torch-format/snapshot-p4.pickle"), &path],
    );
    let run = crate::util::snapdiff(["summary".as_ref(), path.as_os_str()]);
    run.expect_code(0);
    assert!(
        run.stdout()
            .contains("1 string not UTF-8, shown with U+FFFD"),
        "{}",
        run.stdout()
    );
}

#[test]
fn a_compressed_pickle_takes_the_memory_of_the_plain_one_plus_a_buffer() {
    // 2,000,000 trace events, about 110 MB as a pickle and 18 MB gzipped:
    // the content was once decompressed whole into memory before parsing,
    // and the parse's own peak came on top of it.
    let dir = tempdir();
    let plain = dir.path().join("large.pickle");
    let gz = dir.path().join("large.pickle.gz");
    let made = Command::new("python3")
        .arg(fixture("make_torch_format.py"))
        .args(["--large", "2000000", "--out"])
        .arg(&plain)
        .status()
        .unwrap();
    assert!(made.success());
    python_script(
        "import gzip, shutil, sys\n\
         with open(sys.argv[1], 'rb') as f, gzip.open(sys.argv[2], 'wb', compresslevel=1) as g:\n\
         \x20   shutil.copyfileobj(f, g, 1 << 20)\n",
        &[&plain, &gz],
    );
    let summary = |path: &Path| {
        let (run, peak) =
            snapdiff_with_peak(&["summary".as_ref(), "--json".as_ref(), path.as_os_str()]);
        let mut json = run.expect_code(0).json();
        json.as_object_mut().unwrap().remove("source");
        (json, peak)
    };
    let (plain_summary, plain_peak) = summary(&plain);
    let (gz_summary, gz_peak) = summary(&gz);
    assert_eq!(gz_summary["trace_events"], plain_summary["trace_events"]);
    assert_eq!(gz_summary["top_sites"], plain_summary["top_sites"]);
    assert!(
        gz_peak <= plain_peak + 40 * MIB,
        "gzipped: {} MiB, plain: {} MiB",
        gz_peak >> 20,
        plain_peak >> 20
    );
}

#[test]
fn a_table_of_one_long_name_repeated_is_read_in_bounded_memory() {
    if !crate::util::python_imports("pyarrow", "pip install pyarrow") {
        return;
    }
    // 300,000 site rows naming one process by a 3,000-character name: a few
    // KB in the file (dictionary-encoded), 900 MB once each row's string
    // was copied out of the dictionary, and every batch kept.
    let job = tempdir();
    let rank = job.path().join("rank0");
    std::fs::create_dir(&rank).unwrap();
    for file in std::fs::read_dir(fixture("torch-format").join("backward")).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, rank.join(file.file_name().unwrap())).unwrap();
    }
    let tables = job.path().join("tables");
    crate::util::snapdiff([
        "export".as_ref(),
        rank.as_os_str(),
        "-o".as_ref(),
        tables.as_os_str(),
    ])
    .expect_code(0);
    python_script(
        "import os, sys\n\
         import pyarrow as pa, pyarrow.parquet as pq\n\
         d = sys.argv[1]\n\
         name = 'rank0-' + 'x' * 3000\n\
         def renamed(t, n):\n\
         \x20   return t.set_column(t.schema.get_field_index('process'), 'process', pa.array([name] * n))\n\
         c = pq.read_table(os.path.join(d, 'checkpoints.parquet'))\n\
         pq.write_table(renamed(c, c.num_rows), os.path.join(d, 'checkpoints.parquet'))\n\
         s = pq.read_table(os.path.join(d, 'sites.parquet'))\n\
         n = 300_000\n\
         s = renamed(s.take([i % s.num_rows for i in range(n)]), n)\n\
         pq.write_table(s, os.path.join(d, 'sites.parquet'), use_dictionary=True)\n\
         if os.path.exists(os.path.join(d, 'owners.parquet')):\n\
         \x20   os.remove(os.path.join(d, 'owners.parquet'))\n",
        &[&tables],
    );
    let size = std::fs::metadata(tables.join("sites.parquet"))
        .unwrap()
        .len();
    assert!(size < 4 * MIB, "{size} B");
    let (run, peak) =
        snapdiff_with_peak(&["fleet".as_ref(), "--json".as_ref(), tables.as_os_str()]);
    let report = run.expect_code(0).json();
    assert_eq!(report["processes"], 1, "{report:#}");
    assert!(
        peak <= 200 * MIB,
        "{} MiB for {} KiB of tables",
        peak >> 20,
        size >> 10
    );
}

/// A device, a link to one, a pipe no one writes to: each named where a
/// snapshot is expected is refused at once in one line (before, `summary
/// /dev/zero` grew to 6.6 GB in 30 s and a pipe waited for a writer), by
/// every command that reads snapshots, and as an owners file beside one.
#[test]
fn devices_links_to_them_and_pipes_are_refused_at_every_open() {
    let dir = tempdir();
    let link = dir.path().join("rank0-step1.pickle");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let fifo = dir.path().join("fifo.pickle");
    let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a plain system call on a valid path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    let cases: [(&Path, &str); 3] = [
        (Path::new("/dev/zero"), "a device"),
        (&link, "a device"),
        (&fifo, "a pipe"),
    ];
    for (path, what) in cases {
        for command in ["summary", "peak", "trend", "steps"] {
            let (run, peak) = snapdiff_with_peak(&[command.as_ref(), path.as_os_str()]);
            run.expect_code(2);
            let err = run.stderr();
            assert_eq!(err.lines().count(), 1, "{command} {path:?}: {err}");
            assert!(
                err.contains(&format!("not a regular file ({what})")),
                "{command} {path:?}: {err}"
            );
            assert!(peak < 64 << 20, "{command} {path:?}: {} MiB", peak >> 20);
        }
    }
    // An owners file beside a real dump that is a link to /dev/zero is
    // no owners file; the dump still reads.
    let dump = dir.path().join("step.pickle");
    std::fs::copy(fixture("torch-format/newest-step1.pickle"), &dump).unwrap();
    let owners = snapdiff_format::owners_path(&dump);
    std::os::unix::fs::symlink("/dev/zero", &owners).unwrap();
    let (run, peak) = snapdiff_with_peak(&["summary".as_ref(), dump.as_os_str()]);
    run.expect_code(0);
    assert!(peak < 128 << 20, "{} MiB", peak >> 20);
}
