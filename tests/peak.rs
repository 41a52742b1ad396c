//! `snapdiff peak` on the real PyTorch snapshots.

use serde_json::Value;

use crate::util::{python_script, shared_torch, shared_torch_fixtures, snapdiff, tempdir};

/// CPython's reading of a pickle: `before_recording(device, trace)` gives
/// the `free` action a trace records and `live`, the blocks live when
/// recording began (freed without an alloc, or live at the end and never
/// mentioned), by address; `busy`, the traces that allocate, by device;
/// `trace`, `free` and `live` of the first of them, before the rest of a
/// script.
const LIVE_BEFORE_RECORDING: &str = r#"
import pickle, sys
snap = pickle.load(open(sys.argv[1], "rb"))
def before_recording(device, trace):
    free = "free_completed" if any(e["action"] == "free_completed" for e in trace) else "free_requested"
    live, seen, allocated = {}, set(), set()
    for e in trace:
        if e["action"] == "alloc":
            allocated.add(e["addr"]); seen.add(e["addr"])
        elif e["action"] == free:
            if e["addr"] not in allocated and e["addr"] not in seen:
                live[e["addr"]] = e["size"]
            allocated.discard(e["addr"]); seen.add(e["addr"])
    for s in snap["segments"]:
        for b in s["blocks"]:
            if s["device"] == device and b["state"] != "inactive" and b["address"] not in seen:
                live[b["address"]] = b["requested_size"] or b["size"]
    return free, live
busy = [(d, t) for d, t in enumerate(snap["device_traces"]) if any(e["action"] == "alloc" for e in t)]
if busy:
    free, live = before_recording(*busy[0])
    trace = busy[0][1]
"#;

/// `script` after [`LIVE_BEFORE_RECORDING`].
fn with_live_before_recording(script: &str) -> String {
    format!("{LIVE_BEFORE_RECORDING}{script}")
}

/// `peak(trace, free, live)`: the highest bytes live in a trace, and after
/// how many events, computed by CPython from the pickle itself: the blocks
/// live before recording (freed without an alloc, or live at the end and
/// never mentioned) plus each alloc, minus each completed free.
const CPYTHON_PEAK_OF: &str = r#"
def peak(trace, free, live):
    live = dict(live)
    total = sum(live.values()); best = (total, 0)
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            total += e["size"] - live.get(e["addr"], 0); live[e["addr"]] = e["size"]
            if total > best[0]: best = (total, i + 1)
        elif e["action"] == free and e["addr"] in live:
            total -= live.pop(e["addr"])
    return best
"#;

/// The peak of the first busy trace, as `BYTES EVENTS`.
const CPYTHON_PEAK: &str = r#"
print(*peak(trace, free, live))
"#;

/// The peak of every busy trace, a line each: `DEVICE BYTES EVENTS`.
const CPYTHON_PEAK_OF_EACH_DEVICE: &str = r#"
for device, t in busy:
    print(device, *peak(t, *before_recording(device, t)))
"#;

fn peak_json(file: &str) -> Value {
    snapdiff(["peak", "--json", "--top", "0", file])
        .expect_code(0)
        .json()
}

#[test]
fn peak_of_a_training_step_is_where_cpython_finds_it_with_its_categories() {
    let Some(path) = shared_torch("cs336-medium-128-training.pickle") else {
        return;
    };
    let file = path.to_str().unwrap();
    let report = peak_json(file);
    assert_eq!(report["schema"], 2);
    let device = &report["devices"][0];

    let expected = python_script(
        &with_live_before_recording(&format!("{CPYTHON_PEAK_OF}{CPYTHON_PEAK}")),
        &[file],
    );
    let (bytes, index) = expected.trim().split_once(' ').unwrap();
    assert_eq!(device["allocated_bytes"].to_string(), bytes);
    assert_eq!(device["event_index"].to_string(), index);

    // Every live byte is in one category.
    let categories = device["categories"].as_array().unwrap();
    let sum: u64 = categories
        .iter()
        .map(|c| c["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, device["allocated_bytes"].as_u64().unwrap());
    let category = |name: &str| {
        categories
            .iter()
            .find(|c| c["category"] == name)
            .map_or(0, |c| c["bytes"].as_u64().unwrap())
    };

    // The optimizer (an AdamW written in the job's own optimizer.py) keeps
    // two moments per trainable parameter, made at lines 73 and 74: equal
    // in blocks and bytes, and both optimizer state.
    let sites = device["sites"].as_array().unwrap();
    let moment = |line: u64| {
        sites
            .iter()
            .find(|s| {
                s["culprit"]["line"] == line
                    && s["culprit"]["file"]
                        .as_str()
                        .unwrap()
                        .ends_with("optimizer.py")
            })
            .unwrap_or_else(|| panic!("no site at optimizer.py:{line}"))
    };
    let (m, v) = (moment(73), moment(74));
    assert_eq!(m["category"], "optimizer_state");
    assert_eq!(v["category"], "optimizer_state");
    assert_eq!(
        (m["blocks"].clone(), m["bytes"].clone()),
        (v["blocks"].clone(), v["bytes"].clone())
    );
    let trainable = m["bytes"].as_u64().unwrap();
    assert!(category("optimizer_state") >= 2 * trainable);
    // A gradient per trainable parameter, made by the backward pass.
    assert!(category("backward") >= trainable);
    // The parameters were made before recording began, with no stack: at
    // least the trainable ones' bytes, and not guessed to be anything else.
    assert!(category("before_recording") >= trainable);
    assert_eq!(category("parameters"), 0);
}

/// On every real snapshot, each busy device's peak (the bytes and the
/// event after which they were live) is where CPython finds it.
#[test]
fn the_peak_of_every_real_trace_is_where_cpython_finds_it() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let script =
        with_live_before_recording(&format!("{CPYTHON_PEAK_OF}{CPYTHON_PEAK_OF_EACH_DEVICE}"));
    let mut busy = 0;
    for path in files {
        let file = path.to_str().unwrap();
        let report = peak_json(file);
        let got: Vec<String> = report["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                format!(
                    "{} {} {}",
                    d["device"], d["allocated_bytes"], d["event_index"]
                )
            })
            .collect();
        let expected = python_script(&script, &[file]);
        let expected: Vec<&str> = expected.lines().collect();
        assert_eq!(got, expected, "{file}");
        busy += got.len();
    }
    assert!(
        busy >= 4,
        "only {busy} busy traces among the real snapshots"
    );
}

#[test]
fn peak_reads_snap_files_and_says_when_there_is_no_trace() {
    let Some(path) = shared_torch("eor-nn-counterfactuals.pickle") else {
        return;
    };
    let dir = tempdir();
    let snap = dir.path().join("eor.snap");
    let (file, snap) = (path.to_str().unwrap(), snap.to_str().unwrap());
    snapdiff(["convert", file, snap]).expect_code(0);
    assert_eq!(peak_json(file), peak_json(snap));
    let device = &peak_json(file)["devices"][0];
    // This trace follows its segments: the cache at the peak is what is
    // reserved and not allocated.
    let reserved = device["reserved_bytes"].as_u64().unwrap();
    let allocated = device["allocated_bytes"].as_u64().unwrap();
    assert_eq!(
        device["cache_bytes"].as_u64().unwrap(),
        reserved - allocated
    );

    // A snapshot without a trace has no peak to find, and says so.
    let bare = dir.path().join("bare.pickle");
    let bare = bare.to_str().unwrap();
    python_script(
        r#"
import json, pickle, sys
snap = pickle.load(open(sys.argv[1], "rb"))
snap["device_traces"] = []
pickle.dump(snap, open(sys.argv[2], "wb"), protocol=4)
"#,
        &[file, bare],
    );
    let report = peak_json(bare);
    assert_eq!(report["devices"], serde_json::json!([]));
    assert!(
        report["notes"][0]
            .as_str()
            .unwrap()
            .contains("no trace allocates")
    );
}

/// Each step of the first busy trace of `file`, cut after each `snapshot`
/// marker and at the end, computed by CPython from the pickle: (start,
/// peak, allocated, freed, retained) per step, one line each.
const CPYTHON_STEPS: &str = r#"
cuts = sorted(set([i + 1 for i, e in enumerate(trace) if e["action"] == "snapshot"] + [len(trace)]))
total = sum(live.values())
steps, current = [], None
for i, e in enumerate(trace):
    while len(steps) < len(cuts) and cuts[len(steps)] <= i:
        if steps: steps[-1][4] = total
        steps.append([total, total, 0, 0, total])
    step = steps[-1] if steps else [0, 0, 0, 0, 0]
    if e["action"] == "alloc":
        if e["addr"] in live:
            old = live.pop(e["addr"]); total -= old; step[3] += old
        live[e["addr"]] = e["size"]; total += e["size"]; step[2] += e["size"]
        step[1] = max(step[1], total)
    elif e["action"] == free and e["addr"] in live:
        old = live.pop(e["addr"]); total -= old; step[3] += old
    step[4] = total
while len(steps) < len(cuts):
    if steps: steps[-1][4] = total
    steps.append([total, total, 0, 0, total])
for start, peak, alloc, freed, end in steps[:len(cuts) - 1]:
    print(start, peak, alloc, freed, end - start)
"#;

#[test]
fn steps_of_a_marked_trace_are_what_cpython_finds() {
    let Some(path) = shared_torch("eor-nn-counterfactuals.pickle") else {
        return;
    };
    let file = path.to_str().unwrap();
    let report = snapdiff(["steps", "--json", file]).expect_code(0).json();
    let device = &report["devices"][0];
    assert_eq!(device["source"], "snapshot_markers", "{device:#}");
    let got: Vec<String> = device["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {} {} {} {}",
                s["start_bytes"],
                s["peak_bytes"],
                s["allocated_bytes"],
                s["freed_bytes"],
                s["retained_bytes"]
            )
        })
        .collect();
    let expected = python_script(
        &with_live_before_recording(CPYTHON_STEPS),
        &[path.as_os_str()],
    );
    let expected: Vec<&str> = expected.lines().collect();
    assert_eq!(got, expected);
    assert!(got.len() >= 3, "{got:?}");
}
