//! The newest PyTorch snapshot layout, read completely: every key optional,
//! unknown actions counted and skipped, pinned host memory apart from the
//! devices (its own lines, totals and verdict), `annotate` labels, compiled regions and user metadata shown with
//! their sites, private pools by pool, and XPU files read as CUDA files.
//! The files are written by CPython's pickler (`fixtures/make_torch_format.py`,
//! `newest_snapshot`, which names the PyTorch source each key follows).

use snapdiff_format::{PINNED_HOST_DEVICE, read_path};

use crate::util::{fixture, shared_torch_fixtures, snapdiff};

const MIB: u64 = 1 << 20;

fn newest(name: &str) -> std::path::PathBuf {
    fixture("torch-format").join(name)
}

/// [`newest`] as a command-line argument.
fn arg(name: &str) -> String {
    newest(name).to_str().unwrap().to_owned()
}

fn json(args: &[&str]) -> serde_json::Value {
    snapdiff(args).expect_code(0).json()
}

#[test]
fn pinned_host_memory_is_read_in_pytorchs_layout_and_named_so_in_reports() {
    let path = newest("newest-step6.pickle");
    let snap = read_path(&path).unwrap();
    let host: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.device == PINNED_HOST_DEVICE)
        .collect();
    // The host allocator never splits: a segment a block, one in use, one
    // cached.
    assert_eq!(host.len(), 2, "two pinned host segments");
    assert!(
        host.iter()
            .all(|s| s.blocks.len() == 1 && s.total_size == 2 * MIB)
    );
    let host_trace = snap
        .traces
        .iter()
        .find(|t| t.device == PINNED_HOST_DEVICE)
        .expect("host_traces read as the pinned host device's trace");
    // segment_alloc and alloc of each, then free_requested and
    // free_completed of the cached one.
    assert_eq!(host_trace.events.len(), 6);
    // Device 0 keeps only its own segments and events.
    assert_eq!(snap.segments.iter().filter(|s| s.device == 0).count(), 2);
    assert_eq!(snap.traces[0].events.len(), 30);

    let p = path.to_str().unwrap();
    let summary = snapdiff(["summary", p]).expect_code(0).stdout();
    assert!(
        summary
            .lines()
            .any(|l| l.contains("pinned host") && l.contains("4.00 MiB pinned, 2.00 MiB in use")),
        "summary names the pinned host device:\n{summary}"
    );
    assert!(!summary.contains("4294967295"), "{summary}");
    let peak = snapdiff(["peak", p]).expect_code(0).stdout();
    assert!(
        peak.contains("pinned host memory: peak of 4.00 MiB allocated after event 4 of 6"),
        "{peak}"
    );
    assert!(peak.contains("device 0: peak of 40.0 MiB"), "{peak}");
}

#[test]
fn unknown_actions_are_counted_and_keys_may_be_missing() {
    let p = &arg("newest-step6.pickle");
    let summary = json(&["summary", "--json", p]);
    assert_eq!(summary["actions"]["future_action"], 1);
    assert_eq!(summary["actions"]["annotate"], 1);
    // One alloc has neither `stream` nor `time_us`, yet the trace still cuts
    // at the external annotations and the leak is found, a step at a time.
    let trend = snapdiff(["trend", "--json", p]).expect_code(0).one_trend();
    assert_eq!(trend["checkpoint_source"], "annotations", "{trend:#}");
    let suspects = trend["suspects"].as_array().unwrap();
    assert_eq!(suspects.len(), 1, "{trend:#}");
    assert_eq!(suspects[0]["culprit"]["line"], 31);
    assert_eq!(suspects[0]["growth_bytes"], 5 * MIB);
}

#[test]
fn labels_compiled_regions_and_metadata_are_shown_with_their_sites() {
    let p = &arg("newest-step6.pickle");
    let trend = snapdiff(["trend", "--json", p]).expect_code(0).one_trend();
    let recorded = &trend["suspects"][0]["recorded"];
    assert_eq!(
        recorded["compiled_regions"],
        serde_json::json!(["Torch-Compiled Region: 0/1"])
    );
    assert_eq!(recorded["metadata"], serde_json::json!(["phase=train"]));
    let text = snapdiff(["trend", p]).expect_code(0).stdout();
    assert!(
        text.contains(r#"compiled region "Torch-Compiled Region: 0/1", metadata "phase=train""#),
        "{text}"
    );
    // The KV cache's block was labelled after it was allocated.
    let summary = json(&["summary", "--json", p]);
    let site = |name: &str| {
        summary["top_sites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["culprit"]["name"] == name)
            .unwrap_or_else(|| panic!("no site {name}: {summary:#}"))
    };
    let kv = site("allocate_kv_cache");
    assert_eq!(kv["recorded"]["labels"], serde_json::json!(["kv_cache"]));
    let text = snapdiff(["summary", p]).expect_code(0).stdout();
    assert!(text.contains(r#"label "kv_cache""#), "{text}");
    // Sites with nothing recorded say nothing.
    let weights = site("build_model");
    assert!(weights.get("recorded").is_none(), "{weights:#}");
}

#[test]
fn private_pools_are_shown_by_pool_in_summary_and_peak() {
    let p = &arg("newest-step6.pickle");
    let peak = json(&["peak", "--json", p]);
    let pools = &peak["devices"][0]["pools"];
    assert_eq!(
        *pools,
        serde_json::json!([
            {"pool_id": [0, 0], "blocks": 8, "bytes": 16 * MIB},
            {"pool_id": [1, 0], "blocks": 1, "bytes": 24 * MIB},
        ]),
        "{peak:#}"
    );
    let text = snapdiff(["peak", p]).expect_code(0).stdout();
    assert!(
        text.contains("live by pool: shared pool 16.0 MiB, private pool (1, 0) 24.0 MiB"),
        "{text}"
    );
    // vLLM's KV cache lives in a private pool of the real RL job.
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let verl = files
        .iter()
        .find(|f| f.ends_with("verl-rl-vllm.pickle"))
        .expect("torch-incoming/verl-rl-vllm.pickle");
    let summary = json(&["summary", "--json", verl.to_str().unwrap()]);
    let kv: u64 = summary["pools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["private_pool"] == serde_json::json!([0, 2]))
        .map(|p| p["reserved_bytes"].as_u64().unwrap())
        .sum();
    assert!(kv > 20 << 30, "pool (0, 2) holds the 20 GiB KV cache: {kv}");
}

#[test]
fn xpu_files_read_as_cuda_files() {
    let (xpu, cuda) = (&arg("xpu-step6.pickle"), &arg("newest-step6.pickle"));
    let x = json(&["summary", "--json", xpu]);
    let c = json(&["summary", "--json", cuda]);
    // The same device memory; the CUDA file adds the pinned host device.
    assert_eq!(
        x["pools"],
        serde_json::json!(c["pools"].as_array().unwrap()[..2])
    );
    assert_eq!(x["reserved_bytes"], 96 * MIB);
    let tx = snapdiff(["trend", "--json", xpu])
        .expect_code(0)
        .one_trend();
    let tc = snapdiff(["trend", "--json", cuda])
        .expect_code(0)
        .one_trend();
    assert_eq!(tx["suspects"], tc["suspects"]);
    let settings = read_path(newest("xpu-step6.pickle"))
        .unwrap()
        .allocator_settings;
    assert!(format!("{settings:?}").contains("PYTORCH_ALLOC_CONF"));
}

/// A serving process whose device memory never changes while the pinned
/// host cache keeps every buffer `pin_memory()` copies went through: 19 MiB
/// of pinned RAM at step 0, 167 MiB at step 20 (written by CPython's pickler
/// in the layout of `host_memory()` in `fixtures/make_torch_format.py`).
fn pinned_cache(step: u32) -> String {
    arg(&format!("pinned-cache/step{step:02}.pickle"))
}

#[test]
fn pinned_host_memory_is_never_counted_as_the_devices() {
    let (first, last) = (pinned_cache(0), pinned_cache(20));
    // compare: the device did not change; the host's lines say what did.
    let cmp = json(&["compare", "--json", &first, &last]);
    assert_eq!(cmp["reserved_before"], cmp["reserved_after"], "{cmp:#}");
    assert_eq!(cmp["allocated_before"], cmp["allocated_after"]);
    assert_eq!(cmp["leaked_bytes"], 0);
    assert_eq!(cmp["groups"], serde_json::json!([]), "{cmp:#}");
    let host = &cmp["pinned_host"];
    assert_eq!(host["before"]["reserved_bytes"], 19 * MIB);
    assert_eq!(host["after"]["reserved_bytes"], 167 * MIB);
    assert_eq!(host["after"]["in_use_bytes"], 12 * MIB);
    assert_eq!(host["after"]["cached_blocks"], 25);
    assert_eq!(host["after"]["cached_sizes"], 5);
    let text = snapdiff(["compare", &first, &last]).expect_code(0).stdout();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1],
        "reserved 1.71 GiB -> 1.71 GiB (0 B), allocated 1.68 GiB -> 1.68 GiB (0 B)"
    );
    assert_eq!(
        lines[2],
        "pinned host memory (host RAM, not the device's) 19.0 MiB -> 167 MiB (+148 MiB), \
         in use 12.0 MiB -> 12.0 MiB (0 B)"
    );
    assert_eq!(
        lines[3],
        "pinned host cache: 155 MiB in 25 free blocks of 5 sizes (PyTorch keeps them; \
         `pinned_max_cached_size_mb` caps it)"
    );
    assert!(!text.contains("the allocator's cache grew"), "{text}");

    // summary: the first table is the device's, the host has its own lines.
    let summary = json(&["summary", "--json", &last]);
    assert_eq!(summary["reserved_bytes"], (1024 + 700 + 28) * MIB);
    assert_eq!(summary["segments"], 1);
    assert_eq!(summary["fragmentation"]["free_bytes"], 28 * MIB);
    assert_eq!(summary["pinned_host"]["reserved_bytes"], 167 * MIB);
    let shares: f64 = summary["top_sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["share"].as_f64().unwrap())
        .sum();
    assert!((shares - 1.0).abs() < 1e-9, "{summary:#}");
    assert!(
        !summary["top_sites"].to_string().contains("pin_memory"),
        "{summary:#}"
    );

    // trend: no device site grows, and the pinned host's growth is a
    // verdict of its own, not an all-clear.
    let folder = newest("pinned-cache");
    let folder = folder.to_str().unwrap();
    let trend = snapdiff(["trend", "--json", folder])
        .expect_code(0)
        .one_trend();
    assert_eq!(trend["suspects"], serde_json::json!([]));
    assert_eq!(trend["suspected_bytes"], 0);
    assert_eq!(trend["pinned_host"]["grows"], true, "{trend:#}");
    assert_eq!(trend["pinned_host"]["rises"], 9);
    let text = snapdiff(["trend", folder]).expect_code(0).stdout();
    assert!(!text.contains("nothing here looks like a leak"), "{text}");
    assert!(
        text.contains(
            "pinned host memory keeps growing (host RAM, not the device's): 43.0 MiB -> 167 MiB \
             after warm-up, rising at 9 of 9 checkpoints"
        ),
        "{text}"
    );
    assert!(
        text.contains("the growth is free blocks the cache keeps, not memory in use"),
        "{text}"
    );
}

#[test]
fn too_few_checkpoints_say_nothing_of_pinned_memory_either() {
    // Three checkpoints, two of warm-up: no verdict, and none of the host's.
    let files: Vec<String> = [0, 2, 4].iter().map(|&s| pinned_cache(s)).collect();
    let mut args = vec!["trend", "--warmup", "2"];
    args.extend(files.iter().map(String::as_str));
    let text = snapdiff(args).expect_code(0).stdout();
    assert!(text.contains("no verdict"), "{text}");
    assert!(!text.contains("pinned host memory"), "{text}");
}

#[test]
fn a_private_pool_left_behind_is_said_and_a_working_graphs_is_not() {
    let step = |n: u32| arg(&format!("graph-pool/step{n}.pickle"));
    let cmp = json(&["compare", "--json", &step(2), &step(8)]);
    assert_eq!(
        cmp["idle_private_pools"],
        serde_json::json!([{
            "device": 0, "pool_id": [1, 2], "reserved_bytes": 2048 * MIB,
            "segments": 1, "snapshots": 2
        }]),
        "{cmp:#}"
    );
    // Its 2 GiB is not the shared pools' cache.
    assert_eq!(cmp["notes"], serde_json::json!([]), "{cmp:#}");
    let text = snapdiff(["compare", &step(2), &step(8)])
        .expect_code(0)
        .stdout();
    assert!(
        text.contains(
            "private pool (1, 2) on device 0: 2.00 GiB reserved in 1 segment, nothing in use in 2 \
             snapshots: a CUDA graph capture that failed or was dropped keeps it"
        ),
        "{text}"
    );
    assert!(!text.contains("(1, 3)"), "{text}");
    // Before the graphs were captured there was no pool to leave behind.
    let cmp = json(&["compare", "--json", &step(0), &step(2)]);
    assert!(cmp.get("idle_private_pools").is_none(), "{cmp:#}");

    let folder = newest("graph-pool");
    let trend = snapdiff(["trend", "--json", folder.to_str().unwrap()])
        .expect_code(0)
        .one_trend();
    let pools = trend["idle_private_pools"].as_array().unwrap();
    assert_eq!(pools.len(), 1, "{trend:#}");
    assert_eq!(pools[0]["pool_id"], serde_json::json!([1, 2]));
    assert_eq!(pools[0]["snapshots"], 4);
    assert_eq!(trend["suspects"], serde_json::json!([]));
}

#[test]
fn a_backward_allocation_is_named_by_the_forward_line_that_caused_it() {
    let step = |n: u32| arg(&format!("backward/step{n}.pickle"));
    let model = "/home/user/train/model.py";
    let cmp = json(&["compare", "--json", &step(0), &step(9)]);
    let grown: Vec<_> = cmp["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["delta_bytes"].as_i64() != Some(0))
        .collect();
    assert_eq!(grown.len(), 1, "{cmp:#}");
    let culprit = &grown[0]["culprit"];
    assert_eq!(
        (
            &culprit["kind"],
            &culprit["file"],
            &culprit["line"],
            &culprit["name"]
        ),
        (
            &serde_json::json!("forward"),
            &serde_json::json!(model),
            &serde_json::json!(31),
            &serde_json::json!("forward")
        ),
        "{cmp:#}"
    );
    assert_eq!(grown[0]["delta_bytes"], 36 * MIB, "{cmp:#}");
    // fc1's gradient, from line 30, is a site of its own, not merged with
    // fc2's: without the forward frames both had no stack at all.
    let text = snapdiff(["summary", &step(9)]).expect_code(0).stdout();
    for (line, bytes) in [(31, "52.0 MiB"), (30, "16.0 MiB")] {
        assert!(
            text.lines().any(
                |l| l.contains(&format!("backward of forward  model.py:{line}"))
                    && l.contains(bytes)
            ),
            "{text}"
        );
    }
    assert!(!text.contains("no stack recorded"), "{text}");
    // What the memory is for: anomaly mode's frames say backward.
    let peak = snapdiff(["peak", &step(9)]).expect_code(0).stdout();
    assert!(
        peak.lines()
            .any(|l| l.contains("gradients and backward") && l.contains("68.0 MiB")),
        "{peak}"
    );

    let folder = newest("backward");
    let trend = snapdiff(["trend", "--json", folder.to_str().unwrap()])
        .expect_code(0)
        .one_trend();
    let suspects = trend["suspects"].as_array().unwrap();
    assert_eq!(suspects.len(), 1, "{trend:#}");
    let culprit = &suspects[0]["culprit"];
    assert_eq!(
        (&culprit["kind"], &culprit["line"]),
        (&serde_json::json!("forward"), &serde_json::json!(31))
    );
    // The forward frames follow the allocation's own (none here) in the
    // site's stack, innermost first, after the marker that says so.
    let stack = suspects[0]["stack"].as_u64().unwrap() as usize;
    let frames: Vec<_> = trend["stacks"][stack]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &trend["frames"][f.as_u64().unwrap() as usize])
        .map(|f| (f["file"].as_str().unwrap(), f["line"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        frames,
        [
            ("<autograd>", 0),
            (model, 31),
            ("/home/user/train/train.py", 40)
        ]
    );
    // A flame graph shows the memory under the forward line as backward's.
    let folded = snapdiff(["flamegraph", "--folded", "-o", "-", &step(9)])
        .expect_code(0)
        .stdout();
    assert!(
        folded.contains("forward (train/model.py:31);(backward) (<autograd>) 54525952"),
        "{folded}"
    );
}

#[test]
fn forward_frames_survive_conversion_as_they_were_read() {
    let dir = tempfile::tempdir().unwrap();
    let original = newest("backward/step3.pickle");
    let snap_file = dir.path().join("step3.snap");
    let pickle_file = dir.path().join("step3.pickle");
    for (from, to) in [(&original, &snap_file), (&snap_file, &pickle_file)] {
        snapdiff(["convert", from.to_str().unwrap(), to.to_str().unwrap()]).expect_code(0);
    }
    // Read back by CPython: each block's own frames and forward frames are
    // those of the original file.
    let blocks = |path: &std::path::Path| {
        let script = "import pickle, sys, json\n\
            s = pickle.load(open(sys.argv[1], 'rb'))\n\
            print(json.dumps([[b['frames'], b.get('forward_frames')] for b in s['segments'][0]['blocks']]\n\
                + [[e['frames'], e.get('forward_frames')] for e in s['device_traces'][0]]))";
        serde_json::from_str::<serde_json::Value>(&crate::util::python_script(script, &[path]))
            .unwrap()
    };
    let (before, after) = (blocks(&original), blocks(&pickle_file));
    assert_eq!(before, after);
    assert!(before.to_string().contains("self.fc2(h)"), "{before}");
    // And the joined stacks read the same from each.
    let culprits = |path: &std::path::Path| {
        json(&["summary", "--json", path.to_str().unwrap()])["top_sites"].clone()
    };
    assert_eq!(culprits(&original), culprits(&snap_file));
    assert_eq!(culprits(&original), culprits(&pickle_file));
}
