//! Reading a large snapshot pickle on two threads.
//!
//! PyTorch writes the segments first and the trace after them, each about
//! half of the reading time. The calling thread reads from the start (the
//! first half); a second thread skims the opcodes to the top dict's
//! `device_traces` key (`skim.rs`), then reads from there to the end (the
//! second half), finding the strings, frames and frame lists it shares with
//! the segments in the file itself (`machine/foreign.rs`). The first half
//! pauses at the split; each half becomes a snapshot of its own keys, and
//! the second's frames, stacks and strings are renumbered into the first's
//! ([`join`]), as one thread would have numbered them.
//!
//! A long trace (recorded with a large `max_entries`) takes more of the
//! time than the segments before it: in a file of 64 MiB or more (smaller
//! ones would pay more in memory than they gain), the skim then goes on
//! into the trace and the second half starts at a batch of events where
//! the work splits evenly (`skim::find_balanced`), with the list of
//! devices and the devices before stood in for. The first half pauses there inside the
//! trace, the events of the device the split cuts are joined, and the
//! second half's devices are numbered on from it.
//!
//! A reader that needs no events (`Parts::WithoutEvents`) has no trace
//! read at all: the skim goes on over the trace's value, counting its
//! devices and the memo slots it writes (`skim::past_trace`), and the
//! second half starts after it, with the trace's pair stood in for; the
//! devices come back without events. On one thread the same halves run one
//! after the other ([`read_around_trace`]). A step's pickle is mostly
//! trace, and skimming a byte costs about 0.4 of reading it.
//!
//! Whatever goes wrong in the second half (a value the first half's part
//! must make, a malformed trace, a first half that got to the split before
//! the skim did), the file reads, or fails, exactly as it does on one
//! thread: a first half that has not paused yet reads on alone; one that
//! has already made its records (it does so while the second half reads
//! on) has the file read again on one thread, which costs time only on
//! such files.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use crate::Parts;
use crate::error::Result;
use crate::events::Events;
use crate::model::{DeviceTrace, FrameId, PINNED_HOST_DEVICE, Snapshot, StackId, StrId};
use crate::pickle::heap::{Container, Val};
use crate::pickle::machine::{self, FirstHalf, Ran};
use crate::pickle::skim::{self, InTrace};
use crate::progress::Progress;
use crate::read::Threads;

/// Pickles from this size are read in two halves, where two cores are free
/// to: below it the second thread's start and skim cost more than they save.
const TWO_HALVES_FROM: usize = 8 << 20;

/// Where the two halves meet: told by the second half's skim, read by the
/// first half as it goes.
pub(crate) struct SplitPoint {
    /// [`SplitPoint::UNKNOWN`] until the skim is done, then the split's
    /// position, or [`SplitPoint::NONE`] if there is none.
    at: AtomicUsize,
    /// How many pairs of the top dict come before the split.
    pairs: AtomicUsize,
    /// Set when the halves will not meet: the first half went past the
    /// split, read the whole file or failed, or the second half failed.
    abandoned: AtomicBool,
    /// Set, before `at`, when the split is inside the trace.
    in_trace: OnceLock<InTrace>,
}

impl SplitPoint {
    const UNKNOWN: usize = 0;
    const NONE: usize = usize::MAX;

    fn new() -> SplitPoint {
        SplitPoint {
            at: AtomicUsize::new(SplitPoint::UNKNOWN),
            pairs: AtomicUsize::new(0),
            abandoned: AtomicBool::new(false),
            in_trace: OnceLock::new(),
        }
    }

    /// The split's position, `Ok(None)` if there is none, `Err` while the
    /// skim goes on.
    pub(crate) fn position(&self) -> std::result::Result<Option<usize>, ()> {
        match self.at.load(Ordering::Acquire) {
            SplitPoint::UNKNOWN => Err(()),
            SplitPoint::NONE => Ok(None),
            at => Ok(Some(at)),
        }
    }

    /// Tells where the skim found the split, if it did.
    fn found(&self, skim: Option<&skim::Split>) {
        // A split is never at the pickle's first byte (its PROTO).
        let at = skim.map_or(SplitPoint::NONE, |s| s.at.max(1));
        self.pairs
            .store(skim.map_or(0, |s| s.pairs), Ordering::Relaxed);
        if let Some(in_trace) = skim.and_then(|s| s.in_trace) {
            _ = self.in_trace.set(in_trace);
        }
        self.at.store(at, Ordering::Release);
    }

    /// Where in the trace the split is, if it is inside it.
    fn in_trace(&self) -> Option<&InTrace> {
        self.in_trace.get()
    }

    /// How many pairs of the top dict come before the split.
    fn pairs(&self) -> usize {
        self.pairs.load(Ordering::Relaxed)
    }

    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    pub(crate) fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }
}

/// A pickle read whole, or in two halves and joined.
#[allow(clippy::large_enum_variant, reason = "one per read, moved once")]
pub(crate) enum Read<'a> {
    Whole(Ran<'a>),
    Joined(Joined),
}

/// A snapshot read in two halves, joined, and what its source says.
pub(crate) struct Joined {
    pub(crate) snap: Snapshot,
    /// The pickle's protocol.
    pub(crate) protocol: u8,
    /// How many strings of the file were not UTF-8.
    pub(crate) not_utf8: usize,
    /// Whether either half met the string `forward_frames`.
    pub(crate) forward_frames: bool,
}

/// Reads `data`, in two halves when it is large, a second core is free, and
/// `threads` allows. Without events, the trace is stepped over where the
/// skim can (see the module's doc), on one thread or two alike.
pub(crate) fn read(
    data: &[u8],
    parts: Parts,
    threads: Threads,
    progress: Option<Progress>,
) -> Result<Read<'_>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if data.len() < TWO_HALVES_FROM || cores < 2 || threads == Threads::One {
        return match parts {
            Parts::All => machine::run(data, progress).map(Read::Whole),
            Parts::WithoutEvents => read_around_trace(data, progress),
        };
    }
    read_in_two(data, parts, progress, None)
}

/// Reads `data` on this thread without its trace: the part before the
/// trace key as the first half, the skim over the trace, and the part after
/// it as a second half; the file whole where the skim gives up.
fn read_around_trace(data: &[u8], progress: Option<Progress>) -> Result<Read<'_>> {
    let pages = progress.as_ref().and_then(Progress::pages);
    let past = skim::find(data, |_| None).and_then(|key| skim::past_trace(data, key, pages));
    let Some(past) = past else {
        return machine::run(data, progress).map(Read::Whole);
    };
    let split = Arc::new(SplitPoint::new());
    split.found(Some(&past.key));
    // The second half reads values back from the first's part of the file.
    let progress = progress.map(Progress::releasing_again);
    let paused = match machine::run_first_half(data, split.clone(), progress)? {
        FirstHalf::Whole(ran) => return Ok(Read::Whole(ran)),
        FirstHalf::Paused(paused) => paused,
    };
    let (first, progress) = match paused.into_pairs(past.key.pairs, None) {
        Ok(first) => first,
        Err(paused) => return paused.resume().map(Read::Whole),
    };
    let first = HalfSnapshot::of(first)?;
    let second = machine::run_second_half(data, past.after, split, progress)
        .ok()
        .and_then(|half| HalfSnapshot::of(half).ok());
    match second {
        Some(second) => meet(first, second, None, Some(past.devices)),
        // As on one thread, whose first error is in the same keys.
        None => machine::run(data, None).map(Read::Whole),
    }
}

/// A half made a snapshot of its own keys, and what its source says.
struct HalfSnapshot {
    snap: Snapshot,
    protocol: u8,
    not_utf8: usize,
    forward_frames: bool,
    has_segments: bool,
}

impl HalfSnapshot {
    fn of(half: machine::Half) -> Result<HalfSnapshot> {
        let (protocol, not_utf8) = (half.protocol, half.heap.not_utf8);
        let forward_frames = half.heap.forward_frames;
        let has_segments = super::has_segments(&half.heap, &half.pairs);
        Ok(HalfSnapshot {
            snap: super::snapshot_of(half)?,
            protocol,
            not_utf8,
            forward_frames,
            has_segments,
        })
    }
}

/// The snapshot of two halves that met: the second read from a split at
/// the trace key, inside the trace (the events of device `continued` go
/// on), or after the trace (its `devices` stood in for by devices
/// without events).
fn meet<'a>(
    mut first: HalfSnapshot,
    second: HalfSnapshot,
    continued: Option<usize>,
    devices: Option<usize>,
) -> Result<Read<'a>> {
    if !first.has_segments && !second.has_segments {
        return Err(super::not_snapshot("a dict without 'segments'"));
    }
    if let Some(devices) = devices {
        first.snap.traces = (0..devices as u32)
            .map(|device| DeviceTrace {
                device,
                events: Events::new(),
            })
            .collect();
    }
    join(&mut first.snap, second.snap, continued);
    Ok(Read::Joined(Joined {
        snap: first.snap,
        protocol: first.protocol,
        not_utf8: first.not_utf8 + second.not_utf8,
        forward_frames: first.forward_frames || second.forward_frames,
    }))
}

/// Reads `data` in two halves, whatever its size (see the module's doc);
/// without events, the second half starts past the trace. With `skimmed`
/// (a whole read's), the split is that one, found before the first half
/// starts (for tests: on a small file the first half may reach the split
/// before the skim has found it, and read on alone).
fn read_in_two(
    data: &[u8],
    parts: Parts,
    progress: Option<Progress>,
    skimmed: Option<Option<skim::Split>>,
) -> Result<Read<'_>> {
    let split = Arc::new(SplitPoint::new());
    if let Some(skim) = &skimmed {
        split.found(skim.as_ref());
    }
    let pages = progress.as_ref().and_then(Progress::pages);
    // The second half's position, told on by the first once it is done.
    let (second_at, second_progress) = std::sync::mpsc::channel::<usize>();
    std::thread::scope(|scope| {
        let second = scope.spawn({
            let split = split.clone();
            move || {
                // Where the second half starts, and the devices it stands
                // in for when that is past the trace.
                let (skim, devices) = match parts {
                    Parts::All => {
                        let skim = skimmed.unwrap_or_else(|| {
                            let skim = skim::find_balanced(data);
                            split.found(skim.as_ref());
                            skim
                        });
                        (skim?, None)
                    }
                    Parts::WithoutEvents => {
                        let past = skim::find(data, |_| None)
                            .and_then(|key| skim::past_trace(data, key, pages));
                        split.found(past.as_ref().map(|p| &p.key));
                        let past = past?;
                        (past.after, Some(past.devices))
                    }
                };
                let (at, in_trace) = (skim.at, skim.in_trace);
                let progress = Progress::with_pages(
                    move |done| _ = second_at.send(done),
                    pages.map(|p| p.from(at)),
                );
                let half = machine::run_second_half(data, skim, split.clone(), Some(progress));
                let half = match (half, in_trace) {
                    (Ok(mut half), Some(t)) => {
                        drop_stand_ins(&mut half, t.devices_before).then_some(half)
                    }
                    (half, _) => half.ok(),
                };
                let Some(half) = half.and_then(|half| HalfSnapshot::of(half).ok()) else {
                    // Most often early, at a value it cannot read back: the
                    // first half, told now, reads on without pausing.
                    split.abandon();
                    return None;
                };
                Some((half, in_trace.map(|t| t.devices_before), devices))
            }
        });
        // The second half reads values back from the first's part.
        let progress = progress.map(Progress::releasing_again);
        let first = machine::run_first_half(data, split.clone(), progress);
        let paused = match first {
            Ok(FirstHalf::Paused(paused)) => paused,
            Ok(FirstHalf::Whole(ran)) => {
                split.abandon();
                return Ok(Read::Whole(ran));
            }
            Err(e) => {
                split.abandon();
                return Err(e);
            }
        };
        let (first, mut progress) = match paused.into_pairs(split.pairs(), split.in_trace()) {
            Ok(first) => first,
            Err(paused) => {
                split.abandon();
                return paused.resume().map(Read::Whole);
            }
        };
        // The first half's records are made while the second half reads on.
        let first = match HalfSnapshot::of(first) {
            Ok(first) => first,
            // As on one thread, whose first error is in the same keys.
            Err(e) => {
                split.abandon();
                return Err(e);
            }
        };
        let mut told = 0;
        for at in second_progress {
            if let Some(progress) = progress.as_mut().filter(|_| at > told) {
                progress.done(at);
                told = at;
            }
        }
        match second.join() {
            Ok(Some((second, continued, devices))) => meet(first, second, continued, devices),
            // The first half's machine is spent: read again on one thread,
            // to read or fail as that does.
            _ => machine::run(data, None).map(Read::Whole),
        }
    })
}

/// Takes the stand-ins for the devices before the split, `devices` of
/// them, out of the list of devices of a second half split inside the trace
/// (its first pair's value); false if that list is not as the second half
/// began it.
fn drop_stand_ins(half: &mut machine::Half, devices: usize) -> bool {
    let Some(&[_, Val::Obj(list)]) = half.pairs.first() else {
        return false;
    };
    match &mut half.heap.containers[list as usize] {
        Container::List(items)
            if items.len() > devices && items[..devices].iter().all(|v| *v == Val::None) =>
        {
            items.drain(..devices);
            true
        }
        _ => false,
    }
}

/// Adds `second`, read from the part of a file after the split, to `first`,
/// read from the part before it: the second's frames, stacks and strings
/// take the first's ids where the first has them, and new ids after the
/// first's in the order the second met them, as one reader would number
/// them. With `continued`, the split was inside the events of that device:
/// the second's devices are numbered on from it, and its events go on
/// from the first's.
pub(crate) fn join(first: &mut Snapshot, second: Snapshot, continued: Option<usize>) {
    let frames: Vec<FrameId> = renumber(&mut first.frames, second.frames, |f| f);
    let stacks: Vec<StackId> = renumber(&mut first.stacks, second.stacks, |stack| {
        stack.into_iter().map(|f| frames[f as usize]).collect()
    });
    let strings: Vec<StrId> = renumber(&mut first.strings, second.strings, |s| s);
    let stack = |s: &mut Option<StackId>| {
        if let Some(id) = s {
            *id = stacks[*id as usize];
        }
    };
    let mut segments = second.segments;
    for seg in &mut segments {
        stack(&mut seg.stack);
        for block in &mut seg.blocks {
            stack(&mut block.stack);
            for entry in &mut block.history {
                stack(&mut entry.stack);
            }
        }
    }
    let mut traces = second.traces;
    for trace in &mut traces {
        trace.events.renumber(&stacks, &strings);
    }
    if let Some(device) = continued {
        for trace in traces.iter_mut().filter(|t| t.device != PINNED_HOST_DEVICE) {
            trace.device += device as u32;
        }
        let split_in = first.traces.iter_mut().find(|t| t.device == device as u32);
        if let Some(before) = split_in
            && traces.first().is_some_and(|t| t.device == device as u32)
        {
            before.events.append(traces.remove(0).events);
        }
    }
    first.segments.extend(segments);
    first.traces.extend(traces);
    first.annotations.extend(second.annotations);
    if second.allocator_settings != crate::value::Value::None {
        first.allocator_settings = second.allocator_settings;
    }
    first.extra.extend(second.extra);
}

/// Adds the items of `more` (each made by `convert`) to `table`, an
/// interning table with no two items equal, and returns the id each has in
/// `table`: an equal item's, or a new one at the end.
fn renumber<T: Hash + Eq, M>(
    table: &mut Vec<T>,
    more: Vec<M>,
    mut convert: impl FnMut(M) -> T,
) -> Vec<u32> {
    let hasher = FxBuildHasher;
    let mut index: HashTable<u32> = HashTable::with_capacity(table.len());
    for (i, item) in table.iter().enumerate() {
        index.insert_unique(hasher.hash_one(item), i as u32, |&j| {
            hasher.hash_one(&table[j as usize])
        });
    }
    more.into_iter()
        .map(|item| {
            let item = convert(item);
            let hash = hasher.hash_one(&item);
            if let Some(&id) = index.find(hash, |&j| table[j as usize] == item) {
                return id;
            }
            table.push(item);
            let id = table.len() as u32 - 1;
            index.insert_unique(hash, id, |&j| hasher.hash_one(&table[j as usize]));
            id
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use std::collections::HashMap;

    use super::*;
    use crate::model::Snapshot;
    use crate::pickle::snapshot_read;

    /// The pickles of real PyTorch runs (`../shared/fixtures`) and of this
    /// repository's fixtures, anomaly mode's forward stacks among them.
    fn pickles() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let folders = [
            "../shared/fixtures/torch",
            "../shared/fixtures/torch-incoming",
            "fixtures/torch-format",
            "fixtures/torch-format/backward",
        ];
        let mut out: Vec<PathBuf> = folders
            .iter()
            .flat_map(|f| std::fs::read_dir(root.join(f)).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
            .collect();
        out.sort();
        out
    }

    fn on_one_thread(data: &[u8]) -> crate::Result<Snapshot> {
        snapshot_read(Read::Whole(machine::run(data, None)?), None)
    }

    fn in_two(data: &[u8]) -> crate::Result<(Snapshot, bool)> {
        split_at(data, skim::find_balanced(data))
    }

    fn split_at(data: &[u8], split: Option<skim::Split>) -> crate::Result<(Snapshot, bool)> {
        let read = read_in_two(data, Parts::All, None, Some(split))?;
        let split = matches!(read, Read::Joined(..));
        Ok((snapshot_read(read, None)?, split))
    }

    /// A real trace (cs336-medium-128-training's) given to three devices,
    /// as this crate writes a PyTorch pickle: a split in the second or
    /// third device's events has devices before it.
    fn three_devices() -> Vec<u8> {
        let path = pickles()
            .into_iter()
            .find(|p| p.ends_with("cs336-medium-128-training.pickle"))
            .unwrap();
        let mut snap = on_one_thread(&std::fs::read(path).unwrap()).unwrap();
        let events = snap.traces[0].events.clone();
        snap.traces = (0..3)
            .map(|device| crate::model::DeviceTrace {
                device,
                events: events.clone(),
            })
            .collect();
        let mut data = Vec::new();
        crate::pickle::write_torch_pickle(&snap, &mut data).unwrap();
        data
    }

    #[test]
    fn real_snapshots_split_inside_their_trace_read_as_on_one_thread() {
        let mut splits = 0;
        let mut devices_before = 0;
        let files = pickles().into_iter().map(|path| {
            let data = std::fs::read(&path).unwrap();
            (path.display().to_string(), data)
        });
        for (path, data) in files.chain([("three devices".to_owned(), three_devices())]) {
            let one = on_one_thread(&data).unwrap();
            // A split at each of 24 places through the file, where the
            // trace has a batch of events there.
            let mut places = std::collections::BTreeSet::new();
            for k in 0..24 {
                let split = skim::find(&data, |_| Some(data.len() * k / 24));
                if let Some(split) = split.filter(|s| s.in_trace.is_some())
                    && places.insert(split.at)
                {
                    devices_before += split.in_trace.as_ref().unwrap().devices_before;
                    let (two, was_split) = split_at(&data, Some(split)).unwrap();
                    assert!(was_split, "{path}");
                    assert!(one == two, "{path} split inside its trace");
                    splits += 1;
                }
            }
        }
        assert!(splits >= 40, "{splits} splits inside a trace");
        assert!(devices_before >= 10, "splits after a first device");
    }

    /// A skim keeps positions in 32 bits, so it reaches 4 GiB into a file
    /// at most: here a reach cut to a part of each real file stands in for
    /// that limit. A split is found before the reach (inside the trace, or
    /// at its key when no batch of events starts in time) or not at all,
    /// and the file reads there as on one thread.
    #[test]
    fn a_split_is_found_within_the_skims_reach() {
        let (mut inside, mut at_key, mut none) = (0, 0, 0);
        for path in pickles() {
            let data = std::fs::read(&path).unwrap();
            let one = on_one_thread(&data).unwrap();
            for reach in [data.len() / 8, data.len() / 3, data.len() * 2 / 3] {
                let wanted = data.len() / 2;
                let Some(split) = skim::find_within(&data, reach, |_| Some(wanted)) else {
                    none += 1;
                    continue;
                };
                assert!(split.at < reach, "{}", path.display());
                assert!(split.made_at.iter().all(|&at| (at as usize) < reach));
                let in_trace = split.in_trace.is_some();
                // A first half that passes the split before the skim is
                // done reads on alone (small files): a split not made.
                let (two, was_split) = split_at(&data, Some(split)).unwrap();
                assert!(one == two, "{} within {reach}", path.display());
                match (was_split, in_trace) {
                    (true, true) => inside += 1,
                    (true, false) => at_key += 1,
                    (false, _) => {}
                }
            }
        }
        assert!(
            inside > 0 && at_key > 0 && none > 0,
            "{inside} {at_key} {none}"
        );
    }

    #[test]
    fn real_snapshots_read_in_two_halves_as_on_one_thread() {
        let mut split = Vec::new();
        for path in pickles() {
            let data = std::fs::read(&path).unwrap();
            let one = on_one_thread(&data).unwrap();
            let (two, was_split) = in_two(&data).unwrap();
            assert!(one == two, "{}", path.display());
            if was_split {
                split.push(path.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        // Those with a trace after their segments.
        assert!(split.len() >= 8, "{split:?}");
        assert!(split.contains(&"cs336-medium-128-training.pickle".to_owned()));
    }

    #[test]
    fn a_damaged_snapshot_fails_in_two_halves_as_on_one_thread() {
        let path = pickles()
            .into_iter()
            .find(|p| p.ends_with("cs336-medium-128-training.pickle"))
            .unwrap();
        let data = std::fs::read(path).unwrap();
        for cut in [data.len() / 5, data.len() / 2, data.len() - 3] {
            let one = on_one_thread(&data[..cut]).unwrap_err().to_string();
            let two = in_two(&data[..cut]).unwrap_err().to_string();
            assert_eq!(one, two, "cut at {cut}");
        }
    }

    /// `snap` with its events dropped and its frames and stacks numbered in
    /// the order its segments use them, leaving out those nothing else
    /// uses: what a read without events must hold.
    fn without_events(mut snap: Snapshot) -> Snapshot {
        let mut frames: Vec<crate::model::Frame> = Vec::new();
        let mut stacks: Vec<Vec<FrameId>> = Vec::new();
        let (mut frame_ids, mut stack_ids) = (HashMap::new(), HashMap::new());
        let mut renumber = |stack: &mut Option<StackId>| {
            let Some(old) = *stack else { return };
            let new = *stack_ids.entry(old).or_insert_with(|| {
                let frames = snap.stacks[old as usize]
                    .iter()
                    .map(|&f| {
                        *frame_ids.entry(f).or_insert_with(|| {
                            frames.push(snap.frames[f as usize].clone());
                            frames.len() as FrameId - 1
                        })
                    })
                    .collect();
                stacks.push(frames);
                stacks.len() as StackId - 1
            });
            *stack = Some(new);
        };
        for seg in &mut snap.segments {
            renumber(&mut seg.stack);
            for block in &mut seg.blocks {
                renumber(&mut block.stack);
                block
                    .history
                    .iter_mut()
                    .for_each(|h| renumber(&mut h.stack));
            }
        }
        for trace in &mut snap.traces {
            trace.events = Events::new();
        }
        (snap.frames, snap.stacks, snap.strings) = (frames, stacks, Vec::new());
        snap
    }

    #[test]
    fn real_snapshots_read_without_events_hold_what_a_whole_read_does() {
        let mut read_whole = Vec::new();
        for path in pickles() {
            let data = std::fs::read(&path).unwrap();
            let whole = without_events(on_one_thread(&data).unwrap());
            let read = read_around_trace(&data, None).unwrap();
            if let Read::Whole(..) = read {
                read_whole.push(path.file_name().unwrap().to_string_lossy().into_owned());
            }
            let around = without_events(snapshot_read(read, None).unwrap());
            assert!(whole == around, "{} on one thread", path.display());
            let read = read_in_two(&data, Parts::WithoutEvents, None, None).unwrap();
            let in_two = without_events(snapshot_read(read, None).unwrap());
            assert!(whole == in_two, "{} in two halves", path.display());
        }
        // A bare list of segments has no trace; the newest layout's host
        // segments, after the trace, give a get of the pool id tuple of a
        // device segment before it, which the part after the trace cannot
        // read back (a tuple is made from values before its opcode).
        let expected = [
            "newest-step1.pickle",
            "newest-step6.pickle",
            "segments-list.pickle",
        ];
        assert_eq!(read_whole, expected);
    }
}
