//! A fuzz test of the three readers (pickle, `.snap`, JSON) on stable Rust.
//!
//! Inputs are the real snapshots, mutated byte by byte and by structure:
//! pickle opcodes deleted, duplicated, moved and rewritten (memo slots, stack
//! and mark opcodes, strings and keys, huge lengths); `.snap` bodies re-framed
//! (skippable and extra zstd frames, wrong declared sizes) around mutated
//! MessagePack; JSON documents with elements and keys duplicated, deleted and
//! replaced. Every input must give a snapshot or a one-line error, never a
//! panic, and the reader's heap must stay within [`memory_bound`] of the
//! input's size (counted by this binary's allocator, per thread); a body of
//! a million empty events, which compresses to almost nothing, is among the
//! `.snap` seeds. The same counter checks that a long `.snap` trace is read
//! without its whole body.
//!
//! Files that still read after their strings were overwritten with hostile
//! text (line breaks, NUL, ESC, markup) are read from disk as users' are,
//! mapped, and drawn by every writer: each output must parse (SVG as XML,
//! folded stacks as one stack a line, JSON as JSON, a few report pages in
//! Chromium) and no text output may hold a raw control character.
//!
//! The seed is fixed, so a run is repeatable; `SNAPDIFF_FUZZ_ROUNDS` sets the
//! number of rounds (the default takes about a minute on two cores; longer
//! runs and their figures are in `docs/performance.md`), and
//! `SNAPDIFF_FUZZ_SEED` another seed, for a long run over inputs the ones
//! before did not try.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use snapdiff_format::{Parts, Reader, Snapshot, read_bytes, write_json, write_snap};

/// Counts the live heap bytes of each thread, and their peak.
struct CountingAllocator;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: a thread being torn down has no counters left.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is passed to `System` unchanged; only counters change.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The most heap a reader may take for an input of `len` bytes: a fixed
/// multiple of the input, plus room for small files. (CPython's unpickler
/// takes 6 to 12 times a real snapshot's size, and up to 80 times on a file
/// of nothing but EMPTY_DICT.)
fn memory_bound(len: usize) -> usize {
    64 * len + (32 << 20)
}

/// Reads `input` as a user's file would be read, and checks the outcome:
/// no panic, a one-line error, memory within the bound. Returns whether it
/// read as a snapshot.
fn check(input: &[u8], what: &str) -> bool {
    let whole = check_read(input, what, Parts::All);
    // A reader that needs no events steps over a pickle's trace: it may
    // read what a whole read refuses for its events, never the reverse.
    let without_events = check_read(
        input,
        &format!("{what} without events"),
        Parts::WithoutEvents,
    );
    assert!(
        !whole || without_events,
        "{what}: read whole, not without events"
    );
    whole
}

/// Whether `input`'s `parts` read, after checking that the reader neither
/// panicked, nor took more memory than its bound, nor failed with other
/// than a one-line error.
fn check_read(input: &[u8], what: &str, parts: Parts) -> bool {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let result =
        std::panic::catch_unwind(|| Reader::new().parts(parts).read_bytes(input).map(drop));
    let peak = (PEAK.with(Cell::get) - base) as usize;
    let keep = || {
        let path = std::env::temp_dir().join("snapdiff-fuzz-failure.bin");
        std::fs::write(&path, input).unwrap();
        path
    };
    let result = result.unwrap_or_else(|_| {
        panic!(
            "{what}: the reader panicked; input saved to {}",
            keep().display()
        )
    });
    if peak > memory_bound(input.len()) {
        panic!(
            "{what}: {peak} bytes of heap for a {}-byte input; input saved to {}",
            input.len(),
            keep().display()
        );
    }
    match result {
        Ok(()) => true,
        Err(e) => {
            let message = e.to_string();
            assert!(
                !message.is_empty() && !message.contains('\n'),
                "{what}: not a one-line error: {message:?}"
            );
            false
        }
    }
}

/// The project's own fixtures, and the smaller real PyTorch snapshots when
/// `../shared` is present (the large ones cost seconds per mutation).
fn seed_files() -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths: Vec<PathBuf> = ["torch-format", "snap-v1"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join("fixtures").join(d)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    let shared = root.join("../shared/fixtures/torch");
    for name in [
        "snapviewer-memory.pickle",
        "cs336-medium-128-inference.pickle",
    ] {
        if shared.join(name).exists() {
            paths.push(shared.join(name));
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect()
}

/// The random generator of a test whose own seed is `own`, changed by
/// `SNAPDIFF_FUZZ_SEED` where set.
fn seeded_rng(own: u64) -> fastrand::Rng {
    let chosen = std::env::var("SNAPDIFF_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    fastrand::Rng::with_seed(own ^ chosen.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn rounds(default: usize) -> usize {
    std::env::var("SNAPDIFF_FUZZ_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

// ---- byte-level mutations, for every format ----

/// Values that break lengths, counts and signs.
const INTERESTING: [u8; 8] = [0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff, b'(', b']'];

fn mutate_bytes(rng: &mut fastrand::Rng, data: &mut Vec<u8>, donor: &[u8]) {
    if data.is_empty() {
        data.push(rng.u8(..));
        return;
    }
    let at = rng.usize(..data.len());
    match rng.u8(..8) {
        0 => data[at] ^= 1 << rng.u8(..8),
        1 => data[at] = INTERESTING[rng.usize(..INTERESTING.len())],
        2 => data.truncate(at),
        3 => {
            // A huge little-endian length or index.
            let word = [0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0];
            let end = (at + 4).min(data.len());
            data[at..end].copy_from_slice(&word[..end - at]);
        }
        4 => {
            let len = rng.usize(1..=64.min(data.len() - at));
            let chunk = data[at..at + len].to_vec();
            let times = rng.usize(1..64);
            for _ in 0..times {
                data.splice(at..at, chunk.iter().copied());
            }
        }
        5 => {
            let len = rng.usize(..=256.min(data.len() - at));
            data.drain(at..at + len);
        }
        6 if !donor.is_empty() => {
            // Splice in a piece of another file.
            let from = rng.usize(..donor.len());
            let len = rng.usize(..=512.min(donor.len() - from));
            data.splice(at..at, donor[from..from + len].iter().copied());
        }
        _ => {
            let len = rng.usize(1..16);
            data.splice(at..at, std::iter::repeat_with(|| rng.u8(..)).take(len));
        }
    }
}

// ---- pickle opcodes ----

/// The length of the opcode at `pos` with its argument, for the opcodes of
/// protocols 2 to 5 (the text opcodes of protocols 0 and 1 end the walk).
fn opcode_len(data: &[u8], pos: usize) -> Option<usize> {
    let arg = |width: usize| -> Option<usize> {
        let b = data.get(pos + 1..pos + 1 + width)?;
        let mut word = [0u8; 8];
        word[..width].copy_from_slice(b);
        usize::try_from(u64::from_le_bytes(word)).ok()
    };
    let len = match *data.get(pos)? {
        b'(' | b'.' | b'0' | b'1' | b'2' | b'N' | b'}' | b']' | b')' | b'l' | b't' | b'd'
        | b'a' | b'e' | b's' | b'u' | b'R' | b'b' | b'o' => 1,
        0x81 | 0x85..=0x89 | 0x8f..=0x94 | 0x97 | 0x98 => 1,
        b'K' | b'h' | b'q' | 0x80 | 0x82 => 2,
        b'M' | 0x83 => 3,
        b'J' | b'j' | b'r' | 0x84 => 5,
        b'G' | 0x95 => 9,
        b'C' | 0x8c | 0x8a => 2 + arg(1)?,
        b'X' | b'B' | 0x8b => 5usize.checked_add(arg(4)?)?,
        0x8d | 0x8e | 0x96 => 9usize.checked_add(arg(8)?)?,
        _ => return None,
    };
    (pos + len <= data.len()).then_some(len)
}

/// The start of each opcode of the pickle in `data`, as far as it parses.
fn opcodes(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(len) = opcode_len(data, pos) {
        out.push((pos, len));
        pos += len;
        if data[pos - len] == b'.' {
            break;
        }
    }
    out
}

/// Mutates a pickle by its opcodes: the kinds of damage and hostility a
/// byte flip rarely produces.
fn mutate_pickle(rng: &mut fastrand::Rng, data: &mut Vec<u8>) {
    let ops = opcodes(data);
    if ops.len() < 4 {
        return;
    }
    let (at, len) = ops[rng.usize(1..ops.len() - 1)];
    let op = data[at..at + len].to_vec();
    match rng.u8(..10) {
        // Delete, duplicate or move one opcode, or a run of them.
        0 => {
            data.drain(at..at + len);
        }
        1 => {
            let times = rng.usize(1..4);
            for _ in 0..times {
                data.splice(at..at, op.iter().copied());
            }
        }
        2 => {
            let (to, _) = ops[rng.usize(1..ops.len() - 1)];
            data.drain(at..at + len);
            let to = to.min(data.len());
            data.splice(to..to, op.iter().copied());
        }
        3 => {
            // A run of opcodes, duplicated: repeated elements and keys.
            let i = ops.iter().position(|&(p, _)| p == at).unwrap();
            let n = rng.usize(1..64).min(ops.len() - 1 - i);
            let end = ops[i + n - 1].0 + ops[i + n - 1].1;
            let run = data[at..end].to_vec();
            data.splice(end..end, run);
        }
        // Memo gets of another slot: a value shared where it must not be.
        4 => {
            let slot = rng.u32(..4096);
            let get = [&[b'j'][..], &slot.to_le_bytes()].concat();
            data.splice(at..at, get);
        }
        // A PUT to a far, sparse slot.
        5 => {
            let slot = rng.u32(..) | 0x10000;
            let put = [&[b'r'][..], &slot.to_le_bytes()].concat();
            data.splice(at..at, put);
        }
        // Runs of stack and mark opcodes.
        6 => {
            let fill = [b'(', b']', b'}', b'N', b'2', b'0', b'1'][rng.usize(..7)];
            let n = rng.usize(1..100_000);
            data.splice(at..at, std::iter::repeat_n(fill, n));
        }
        7 => {
            // One memo get repeated many times (references to one dict).
            let get = [b'h', rng.u8(..)];
            let n = rng.usize(1..50_000);
            data.splice(at..at, get.iter().copied().cycle().take(2 * n));
        }
        8 => {
            // A string replaced by another of the file's strings: keys
            // renamed, values of the wrong kind.
            let strings: Vec<_> = ops
                .iter()
                .filter(|&&(p, _)| data[p] == 0x8c)
                .copied()
                .collect();
            if let Some(&(p, l)) = strings.get(rng.usize(..strings.len().max(1))) {
                let s = data[p..p + l].to_vec();
                data.splice(at..at + len, s);
            }
        }
        _ => {
            // An integer made huge or negative.
            let v = [0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80];
            data.splice(at..at + len, v);
        }
    }
}

// ---- .snap and JSON ----

/// A `.snap` file of format version 2 holding `body`, whose header
/// declares `declared` bytes, its zstd frames rearranged by `framing`.
fn snap_v2_file(body: &[u8], declared: u64, framing: u8, rng: &mut fastrand::Rng) -> Vec<u8> {
    let frame = zstd::bulk::compress(body, 1).unwrap();
    let skippable = |n: u32| {
        let mut s = 0x184D_2A50u32.to_le_bytes().to_vec();
        s.extend_from_slice(&n.to_le_bytes());
        s.resize(8 + n as usize, 0);
        s
    };
    let mut zeros = || zstd::bulk::compress(&vec![0u8; rng.usize(1..4 << 20)], 1).unwrap();
    let compressed = match framing {
        0 => [skippable(16), frame].concat(),
        1 => [frame, skippable(16)].concat(),
        2 => [frame, zeros()].concat(),
        3 => [zeros(), frame].concat(),
        _ => frame,
    };
    let mut out = snapdiff_format::MAGIC.to_vec();
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&declared.to_le_bytes());
    out.extend_from_slice(&compressed);
    out
}

/// Duplicates, deletes or replaces an element or key somewhere in `v`.
fn mutate_json(rng: &mut fastrand::Rng, v: &mut serde_json::Value, depth: usize) {
    use serde_json::Value;
    let descend = depth < 12 && rng.u8(..4) != 0;
    match v {
        Value::Array(items) if !items.is_empty() => {
            let i = rng.usize(..items.len());
            if descend {
                return mutate_json(rng, &mut items[i], depth + 1);
            }
            match rng.u8(..4) {
                0 => {
                    let dup = items[i].clone();
                    let n = rng.usize(1..1000);
                    items.splice(i..i, std::iter::repeat_n(dup, n));
                }
                1 => {
                    items.remove(i);
                }
                2 => items[i] = Value::from(u64::MAX),
                _ => items[i] = Value::from(-1),
            }
        }
        Value::Object(map) if !map.is_empty() => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = &keys[rng.usize(..keys.len())];
            if descend {
                return mutate_json(rng, map.get_mut(key).unwrap(), depth + 1);
            }
            match rng.u8(..4) {
                0 => {
                    let value = map.remove(key).unwrap();
                    map.insert(format!("{key}_"), value);
                }
                1 => {
                    map.remove(key);
                }
                2 => {
                    map.insert(key.clone(), Value::from("\u{1b}]0;x\u{7}"));
                }
                _ => {
                    map.insert(key.clone(), Value::Array(vec![Value::Null; 3]));
                }
            }
        }
        Value::Number(_) => *v = Value::from(i64::MIN),
        Value::String(s) => s.push('\u{0}'),
        _ => *v = Value::Bool(true),
    }
}

/// Readable snapshots of the seeds, for the `.snap` and JSON rounds: those
/// under a megabyte, which this test's unoptimized code mutates quickly.
fn seed_snapshots() -> Vec<Snapshot> {
    seed_files()
        .into_iter()
        .filter(|(_, data)| data.len() < 1 << 20)
        .filter_map(|(_, data)| read_bytes(&data).ok())
        .collect()
}

#[test]
fn pickles_never_panic_or_blow_up() {
    let seeds: Vec<_> = seed_files()
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "pickle" || e == "pt"))
        .collect();
    let mut rng = seeded_rng(0x5eed_0001);
    let started = Instant::now();
    let (mut tried, mut read) = (0, 0);
    for round in 0..rounds(20_000) {
        let (path, seed) = &seeds[round % seeds.len()];
        let donor = &seeds[rng.usize(..seeds.len())].1;
        let mut data = seed.clone();
        for _ in 0..rng.usize(1..4) {
            if rng.bool() && path.extension().is_some_and(|e| e == "pickle") {
                mutate_pickle(&mut rng, &mut data);
            } else {
                mutate_bytes(&mut rng, &mut data, donor);
            }
        }
        read += usize::from(check(
            &data,
            &format!("round {round} of {}", path.display()),
        ));
        tried += 1;
    }
    eprintln!(
        "fuzz: {tried} mutated pickles in {:.1?}, {read} still read as snapshots",
        started.elapsed()
    );
    assert!(
        read > 0 && read < tried,
        "the mutations did nothing, or broke everything"
    );
}

#[test]
fn snap_and_json_never_panic_or_blow_up() {
    // Each seed as a version-2 body, the two bodies of its version-3 file
    // (head and events) and its JSON document, made once.
    let mut seeds: Vec<Seed> = seed_snapshots().iter().map(Seed::of).collect();
    // A body of empty events, just over the most a small file may hold:
    // its columns compress to almost nothing (see `snap::EVENTS_PER_BYTE`).
    let mut empty = snapdiff_format::Events::new();
    for _ in 0..(1 << 20) + 1 {
        empty.push(snapdiff_format::TraceEvent::default());
    }
    let many = Snapshot {
        traces: vec![snapdiff_format::DeviceTrace {
            device: 0,
            events: empty,
        }],
        ..Snapshot::default()
    };
    seeds.push(Seed {
        json: serde_json::Value::Null,
        ..Seed::of(&many)
    });
    drop(many);
    assert!(!seeds.is_empty());
    let mut rng = seeded_rng(0x5eed_0002);
    let started = Instant::now();
    let (mut tried, mut read) = (0, 0);
    for round in 0..rounds(3000) {
        let seed = &seeds[round % seeds.len()];
        let input = match round % 3 {
            0 => {
                let mut body = seed.v2_body.clone();
                let declared = declared_len(&mut rng, &body);
                if rng.bool() {
                    mutate_bytes(&mut rng, &mut body, &[]);
                }
                let mut file = snap_v2_file(&body, declared, rng.u8(..8), &mut rng);
                if rng.u8(..4) == 0 {
                    mutate_bytes(&mut rng, &mut file, &[]);
                }
                file
            }
            1 if !seed.json.is_null() => {
                let mut doc = seed.json.clone();
                for _ in 0..rng.usize(1..4) {
                    mutate_json(&mut rng, &mut doc, 0);
                }
                let mut text = serde_json::to_vec(&doc).unwrap();
                if rng.u8(..4) == 0 {
                    mutate_bytes(&mut rng, &mut text, &[]);
                }
                text
            }
            _ => {
                let (mut head, mut events) = (seed.head.clone(), seed.events.clone());
                match rng.u8(..3) {
                    0 => mutate_bytes(&mut rng, &mut head, &[]),
                    1 => mutate_bytes(&mut rng, &mut events, &[]),
                    _ => {}
                }
                let declared = (
                    declared_len(&mut rng, &head),
                    declared_len(&mut rng, &events),
                );
                let mut file = snap_v3_file(&head, &events, declared);
                if rng.u8(..4) == 0 {
                    mutate_bytes(&mut rng, &mut file, &[]);
                }
                file
            }
        };
        read += usize::from(check(&input, &format!("round {round}")));
        tried += 1;
    }
    eprintln!(
        "fuzz: {tried} mutated .snap and JSON files in {:.1?}, {read} still read as snapshots",
        started.elapsed()
    );
    assert!(
        read > 0 && read < tried,
        "the mutations did nothing, or broke everything"
    );
}

/// A snapshot to mutate, in each of the forms the fuzzer mutates.
struct Seed {
    /// The MessagePack body of its `.snap` file of format version 2.
    v2_body: Vec<u8>,
    /// The head and events bodies of its `.snap` file (version 3 on).
    head: Vec<u8>,
    events: Vec<u8>,
    /// Its JSON document (null when too large to mutate).
    json: serde_json::Value,
}

impl Seed {
    fn of(snap: &Snapshot) -> Seed {
        let mut file = Vec::new();
        write_snap(snap, &mut file).unwrap();
        let head_end = 36 + u64::from_le_bytes(file[20..28].try_into().unwrap()) as usize;
        let mut json = Vec::new();
        write_json(snap, &mut json).unwrap();
        Seed {
            v2_body: rmp_serde::to_vec(snap).unwrap(),
            head: zstd::bulk::decompress(&file[36..head_end], 1 << 30).unwrap(),
            events: zstd::bulk::decompress(&file[head_end..], 1 << 30).unwrap(),
            json: serde_json::from_slice(&json).unwrap(),
        }
    }
}

/// The length a header declares for `body`: mostly its own, sometimes far more.
fn declared_len(rng: &mut fastrand::Rng, body: &[u8]) -> u64 {
    match rng.u8(..4) {
        0 => body.len() as u64 * rng.u64(2..2000),
        _ => body.len() as u64,
    }
}

/// A `.snap` file of format version 3 holding `head` and `events`, whose
/// header declares the lengths `declared`.
fn snap_v3_file(head: &[u8], events: &[u8], declared: (u64, u64)) -> Vec<u8> {
    let head_frame = zstd::bulk::compress(head, 1).unwrap();
    let mut out = snapdiff_format::MAGIC.to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&declared.0.to_le_bytes());
    out.extend_from_slice(&(head_frame.len() as u64).to_le_bytes());
    out.extend_from_slice(&declared.1.to_le_bytes());
    out.extend_from_slice(&head_frame);
    out.extend_from_slice(&zstd::bulk::compress(events, 1).unwrap());
    out
}

#[test]
fn a_long_snap_trace_is_read_without_holding_its_body() {
    // 2M events of a loop: the body is tens of megabytes, which the reader
    // once decompressed whole and held beside the events it decoded.
    let events: snapdiff_format::Events = (0..2_000_000u64)
        .map(|i| snapdiff_format::TraceEvent {
            action: if i % 2 == 0 {
                snapdiff_format::Action::Alloc
            } else {
                snapdiff_format::Action::FreeCompleted
            },
            address: 0x7f00_0000_0000 + (i / 2) * 512,
            size: 512 * (1 + i % 4096),
            time_us: Some(1_700_000_000_000_000 + i as i64 * 3),
            stack: Some((i % 700) as u32),
            ..Default::default()
        })
        .collect();
    let snap = Snapshot {
        stacks: vec![Vec::new(); 700],
        traces: vec![snapdiff_format::DeviceTrace { device: 0, events }],
        ..Default::default()
    };
    let mut file = Vec::new();
    write_snap(&snap, &mut file).unwrap();
    drop(snap);
    // The events' uncompressed length, from the header.
    let body_len = u64::from_le_bytes(file[28..36].try_into().unwrap()) as isize;

    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let read = read_bytes(&file).unwrap();
    let kept = LIVE.with(Cell::get) - base;
    let transient = PEAK.with(Cell::get) - base - kept;
    assert_eq!(read.trace_len(), 2_000_000);
    // What reading needs beyond the events it keeps: the longest column's
    // bytes and buffers, never the whole body.
    assert!(
        transient < body_len * 3 / 4,
        "reading took {} MiB beyond the {} MiB it keeps; the body is {} MiB",
        transient >> 20,
        kept >> 20,
        body_len >> 20
    );
}

// ---- what the writers make of files that read ----

/// Text a string of a file may hold that would forge or break an output if
/// passed on raw: line breaks, NUL and ESC, HTML and XML markup, the folded
/// format's separator, quotes. All single bytes, so the UTF-8 stays valid.
const HOSTILE_TEXT: &[u8] = b"\n\r\0\x1b<>&;\"'</script><!--{{DATA}}\t\x07\x7f";

/// Overwrites the text of one of the pickle's short strings with
/// [`HOSTILE_TEXT`], keeping its length.
fn poison_a_string(rng: &mut fastrand::Rng, data: &mut [u8]) {
    let strings: Vec<(usize, usize)> = opcodes(data)
        .into_iter()
        .filter(|&(p, l)| data[p] == 0x8c && l > 2)
        .collect();
    if strings.is_empty() {
        return;
    }
    let (p, l) = strings[rng.usize(..strings.len())];
    let start = rng.usize(..HOSTILE_TEXT.len());
    for (i, b) in data[p + 2..p + l].iter_mut().enumerate() {
        *b = HOSTILE_TEXT[(start + i) % HOSTILE_TEXT.len()];
    }
}

/// Runs the `snapdiff` binary; its stdout, and whether it exited 0 (else
/// its one-line error is checked).
fn snapdiff_out(args: &[&std::ffi::OsStr]) -> (Vec<u8>, bool) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapdiff"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        assert_eq!(out.status.code(), Some(2), "snapdiff {args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "snapdiff {args:?}: {stderr}");
        assert!(!stderr.trim_end().contains(char::is_control), "{stderr:?}");
    }
    (out.stdout, out.status.success())
}

#[test]
fn every_output_of_a_mutated_file_parses() {
    // Mutated pickles, many with hostile text in their names, read from a
    // file as users' are (mapped); each one that reads is drawn as a
    // flame graph (SVG, parsed as XML), folded stacks (one stack a line),
    // JSON (parsed), text (no raw controls) and, for a few, a report page
    // opened in Chromium.
    let seeds: Vec<_> = seed_files()
        .into_iter()
        .filter(|(p, d)| p.extension().is_some_and(|e| e == "pickle") && d.len() < 1 << 20)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = seeded_rng(0x5eed_0003);
    let (mut read, mut svgs, mut pages) = (0, Vec::new(), Vec::new());
    for round in 0..rounds(20_000) / 100 {
        let (path, seed) = &seeds[round % seeds.len()];
        let mut data = seed.clone();
        for _ in 0..rng.usize(1..4) {
            poison_a_string(&mut rng, &mut data);
        }
        if rng.u8(..4) == 0 {
            mutate_pickle(&mut rng, &mut data);
        }
        let file = dir.path().join(format!("round{round}.pickle"));
        std::fs::write(&file, &data).unwrap();
        let what = format!("round {round} of {}", path.display());
        let mapped = std::panic::catch_unwind(|| snapdiff_format::read_path(&file).map(drop));
        match mapped.unwrap_or_else(|_| panic!("{what}: the mapped reader panicked")) {
            Ok(()) => read += 1,
            Err(e) => {
                assert!(!e.to_string().contains('\n'), "{what}: {e}");
                continue;
            }
        }
        let f = file.as_os_str();
        let svg = dir.path().join(format!("round{round}.svg"));
        // A file may read and still not be drawn (a malformed stack
        // table, say): then a one-line error, checked by `snapdiff_out`.
        if snapdiff_out(&["flamegraph".as_ref(), f, "-o".as_ref(), svg.as_os_str()]).1 {
            svgs.push(svg);
        }
        let (folded, _) = snapdiff_out(&[
            "flamegraph".as_ref(),
            "--folded".as_ref(),
            "-o".as_ref(),
            "-".as_ref(),
            f,
        ]);
        for line in String::from_utf8(folded).unwrap().lines() {
            let (stack, count) = line.rsplit_once(' ').expect(&what);
            assert!(
                !stack.is_empty()
                    && count.parse::<u64>().is_ok()
                    && !line.contains(char::is_control),
                "{what}: folded line {line:?}"
            );
        }
        for command in ["summary", "peak", "trend", "steps", "oom"] {
            let (json, _) = snapdiff_out(&[command.as_ref(), f, "--json".as_ref()]);
            if !json.is_empty() {
                serde_json::from_slice::<serde_json::Value>(&json)
                    .unwrap_or_else(|e| panic!("{what}: {command} --json: {e}"));
            }
            let (text, _) = snapdiff_out(&[command.as_ref(), f]);
            let text = String::from_utf8(text).unwrap();
            assert!(
                !text.chars().any(|c| c.is_control() && c != '\n'),
                "{what}: {command} printed a raw control character: {text:?}"
            );
        }
        if pages.len() < 4 {
            let page = dir.path().join(format!("round{round}.html"));
            if snapdiff_out(&["report".as_ref(), f, "-o".as_ref(), page.as_os_str()]).1 {
                pages.push(page);
            }
        }
    }
    assert!(read > 0, "no mutated file read");
    // Every SVG, parsed by a strict XML parser (one process for all).
    let parse = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom\nfor p in sys.argv[1:]: xml.dom.minidom.parse(p)",
        ])
        .args(&svgs)
        .output()
        .expect("python3 parses the SVGs");
    assert!(
        parse.status.success(),
        "{}",
        String::from_utf8_lossy(&parse.stderr)
    );
    // The pages, in Chromium when it is installed: their script runs on
    // their data, and nothing of the file's runs.
    let chromium_found = std::process::Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if chromium_found {
        for page in &pages {
            let dom = std::process::Command::new("chromium")
                .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
                .arg(format!("file://{}", page.display()))
                .output()
                .unwrap();
            let dom = String::from_utf8_lossy(&dom.stdout);
            assert!(
                dom.contains("data-ready=\"yes\""),
                "{}: the script did not run",
                page.display()
            );
            assert!(
                dom.contains("<title>snapdiff report</title>"),
                "{}",
                page.display()
            );
        }
    }
    eprintln!(
        "fuzz: {read} poisoned files read; {} flame graphs parsed as XML, {} pages in a browser",
        svgs.len(),
        if chromium_found { pages.len() } else { 0 }
    );
}
