//! compare, trend and summary on real PyTorch snapshots: leaks injected into
//! real files (reusing real stacks) must be named, first and alone, with
//! exact bytes; the unmodified files must show no leak.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::{
    compare_json, python_json, python_script, shared_torch, shared_torch_fixtures, snapdiff,
    tempdir,
};

/// Runs `tests/support/inject_leak.py` and returns what it injected.
pub(crate) fn inject(
    mode: &str,
    input: &Path,
    output: &Path,
    count: usize,
    size: u64,
    stack_from: Option<&Path>,
) -> Value {
    let (count, size) = (count.to_string(), size.to_string());
    let mut args: Vec<&OsStr> = vec![
        mode.as_ref(),
        input.as_os_str(),
        output.as_os_str(),
        "--blocks".as_ref(),
        count.as_ref(),
        "--size".as_ref(),
        size.as_ref(),
    ];
    if let Some(s) = stack_from {
        args.extend(["--stack-from".as_ref(), s.as_os_str()]);
    }
    python_json("inject_leak.py", &args)
}

fn culprit_of(group: &Value) -> (String, String, u64) {
    let c = &group["culprit"];
    (
        c["name"].as_str().unwrap().to_owned(),
        c["file"].as_str().unwrap().to_owned(),
        c["line"].as_u64().unwrap(),
    )
}

fn expected_culprit(injected: &Value) -> (String, String, u64) {
    culprit_of(injected)
}

#[test]
fn compare_names_a_leak_injected_into_each_real_snapshot() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let dir = tempdir();
    for file in &files {
        let leaked = dir.path().join("leaked.pickle");
        let injected = inject("snapshot", file, &leaked, 7, 3 << 20, None);
        let report = compare_json(file, &leaked);
        let groups = report["groups"].as_array().unwrap();
        assert_eq!(
            groups.len(),
            1,
            "{}: exactly the injected site changes: {report:#}",
            file.display()
        );
        assert_eq!(
            culprit_of(&groups[0]),
            expected_culprit(&injected),
            "{}",
            file.display()
        );
        assert_eq!(groups[0]["culprit"]["kind"], "user");
        assert_eq!(groups[0]["delta_bytes"], 7 * (3 << 20));
        assert_eq!(report["leaked_bytes"], 7 * (3 << 20));
        let blocks_added = groups[0]["blocks_after"].as_u64().unwrap()
            - groups[0]["blocks_before"].as_u64().unwrap();
        assert_eq!(blocks_added, 7);
        assert_eq!(report["matching"], "address_size_stack");
        // Every block of the original is still there: they are matched as kept.
        assert_eq!(groups[0]["blocks_kept"], groups[0]["blocks_before"]);

        // Unchanged: nothing to report.
        let same = compare_json(file, file);
        assert_eq!(
            same["groups"].as_array().unwrap().len(),
            0,
            "{}",
            file.display()
        );
        assert_eq!(same["leaked_bytes"], 0);
    }
}

#[test]
fn compare_reads_mixed_formats_and_sets_the_exit_code() {
    let Some(file) = shared_torch("cs336-medium-128-training.pickle") else {
        return;
    };
    let dir = tempdir();
    let leaked = dir.path().join("leaked.pickle");
    let injected = inject("snapshot", &file, &leaked, 4, 1 << 20, None);
    let leaked_snap = dir.path().join("leaked.snap");
    snapdiff([
        "convert".as_ref(),
        leaked.as_os_str(),
        leaked_snap.as_os_str(),
    ])
    .expect_code(0);
    let report = compare_json(&file, &leaked_snap);
    assert_eq!(
        culprit_of(&report["groups"][0]),
        expected_culprit(&injected)
    );
    assert_eq!(report["leaked_bytes"], 4 << 20);

    let args = |limit: &str| {
        vec![
            "compare".into(),
            file.clone().into_os_string(),
            leaked_snap.clone().into_os_string(),
            "--fail-over".into(),
            limit.into(),
        ]
    };
    snapdiff(args("4MiB")).expect_code(0);
    let over = snapdiff(args("3MiB"));
    assert_eq!(
        over.expect_code(1).stderr(),
        "snapdiff: 4.00 MiB leaked, over the 3.00 MiB limit (--max-growth)\n"
    );
    snapdiff(args("4MiB")).expect_code(0);

    // The table names user code, not the allocator.
    let run = snapdiff([
        "compare".as_ref(),
        file.as_os_str(),
        leaked_snap.as_os_str(),
        "--frames".as_ref(),
        "3".as_ref(),
        "--full-paths".as_ref(),
    ]);
    let table = run.expect_code(0).stdout();
    let (name, path, line) = expected_culprit(&injected);
    assert!(table.contains(&format!("{name}  {path}:{line}")), "{table}");
    assert!(!table.contains("unwind"), "{table}");
    assert!(
        table.contains("4.00 MiB more live memory in 1 site"),
        "{table}"
    );
}

#[test]
fn compare_of_different_devices_says_so() {
    let dir = tempdir();
    let one = crate::util::fixture("torch-format/snapshot-p4.pickle");
    let two = crate::util::fixture("torch-format/snapshot-2dev-awaiting.pickle");
    let report = compare_json(&one, &two);
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("different devices: [0] before, [0, 1] after"),
        "{notes}"
    );
    // Bad input on either side: one line, exit 2.
    let bad = dir.path().join("bad.pickle");
    std::fs::write(&bad, b"\x80\x04K\x01.").unwrap();
    let run = snapdiff(["compare".as_ref(), one.as_os_str(), bad.as_os_str()]);
    run.expect_code(2);
    assert!(
        run.stderr()
            .contains("bad.pickle: the pickle holds an integer"),
        "{}",
        run.stderr()
    );
}

fn trend_json(files: &[PathBuf]) -> Value {
    let mut args = vec!["trend".into(), "--json".into()];
    args.extend(files.iter().map(|f| f.clone().into_os_string()));
    snapdiff(args).expect_code(0).one_trend()
}

#[test]
fn trend_finds_no_leak_in_the_real_traces() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    for file in &files {
        // A file of the allocator's state alone (history off, or a state
        // dump) has no trace to judge: refused, saying what would do.
        if crate::util::state_only(file) {
            let run = snapdiff(["trend".as_ref(), file.as_os_str()]);
            run.expect_code(2);
            assert!(
                run.stderr().contains(
                    "has no allocations in its trace; record a trace, or give several snapshots"
                ),
                "{}: {}",
                file.display(),
                run.stderr()
            );
            continue;
        }
        let report = trend_json(std::slice::from_ref(file));
        assert_eq!(
            report["suspects"],
            serde_json::json!([]),
            "{}: {report:#}",
            file.display()
        );
    }
    // The one-step training trace: gradients and optimizer state are allocated
    // once and kept; that is not a leak.
    let training = files
        .iter()
        .find(|f| f.ends_with("cs336-medium-128-training.pickle"))
        .unwrap();
    let report = trend_json(std::slice::from_ref(training));
    assert_eq!(report["checkpoint_source"], "annotations");

    // Without markers: the repeating allocation sites of cs336's forward
    // passes give its iterations; maph's generation loop, whose sites do not
    // repeat at one period, is cut at its low points; a notebook fine-tune
    // whose memory never falls back gets no verdict.
    let by_name = |name: &str| files.iter().find(|f| f.ends_with(name)).unwrap();
    for (name, source) in [
        ("cs336-medium-128-inference.pickle", "iterations"),
        ("maph-llama-inference.pickle", "troughs"),
    ] {
        let report = trend_json(std::slice::from_ref(by_name(name)));
        assert_eq!(report["checkpoint_source"], source, "{name}");
    }
    let report = trend_json(std::slice::from_ref(by_name("ftcourse-finetune.pickle")));
    assert_eq!(report["checkpoint_source"], "evenly_spaced");
    assert!(
        report["notes"][0]
            .as_str()
            .unwrap()
            .starts_with("no verdict"),
        "{report:#}"
    );
}

/// Bytes of the allocations inserted before each checkpoint's cut.
fn injected_series(report: &Value, positions: &[u64], size: u64) -> Vec<u64> {
    report["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let cut = p["event_index"].as_u64().unwrap();
            positions.iter().filter(|&&pos| pos < cut).count() as u64 * size
        })
        .collect()
}

#[test]
fn trend_names_allocations_injected_into_a_real_trace() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let dir = tempdir();
    let training = files
        .iter()
        .find(|f| f.ends_with("cs336-medium-128-training.pickle"))
        .unwrap();
    for name in [
        "eor-nn-counterfactuals.pickle",
        "cs336-medium-128-inference.pickle",
    ] {
        let file = files.iter().find(|f| f.ends_with(name)).unwrap();
        let leaked = dir.path().join(format!("leaked-{name}"));
        // A real stack from another run, so that its site is only the leak's.
        let injected = inject("trace", file, &leaked, 30, 1 << 20, Some(training));
        let report = trend_json(std::slice::from_ref(&leaked));
        let suspects = report["suspects"].as_array().unwrap();
        assert_eq!(
            suspects.len(),
            1,
            "{name}: only the injected site: {report:#}"
        );
        assert_eq!(
            culprit_of(&suspects[0]),
            expected_culprit(&injected),
            "{name}"
        );
        let positions: Vec<u64> = serde_json::from_value(injected["positions"].clone()).unwrap();
        let expected = injected_series(&report, &positions, 1 << 20);
        let series: Vec<u64> = serde_json::from_value(suspects[0]["series"].clone()).unwrap();
        assert_eq!(
            series, expected,
            "{name}: live bytes of the site at each checkpoint"
        );
        let warmup = report["warmup"].as_u64().unwrap() as usize;
        assert_eq!(
            suspects[0]["growth_bytes"].as_u64().unwrap(),
            expected[expected.len() - 1] - expected[warmup]
        );
        // The evidence: the floor, which for steady growth is the series.
        let floor: Vec<u64> = serde_json::from_value(suspects[0]["floor"].clone()).unwrap();
        assert_eq!(floor, expected, "{name}: the floor of the injected site");

        // The same, with a stack of the file itself: still the first and only suspect.
        let own = dir.path().join(format!("own-{name}"));
        let injected = inject("trace", file, &own, 30, 1 << 20, None);
        let report = trend_json(std::slice::from_ref(&own));
        let suspects = report["suspects"].as_array().unwrap();
        assert_eq!(suspects.len(), 1, "{name}: {report:#}");
        assert_eq!(
            culprit_of(&suspects[0]),
            expected_culprit(&injected),
            "{name}"
        );
    }
}

#[test]
fn trend_over_several_snapshots_of_a_growing_job() {
    let Some(file) = shared_torch("eor-nn-counterfactuals.pickle") else {
        return;
    };
    let dir = tempdir();
    // Snapshots after 0, 2, 4, ... leaked blocks: a job leaking 2 MiB per
    // step, its files in one folder (files nothing names in two folders
    // are two runs).
    let first = dir.path().join("step-0.pickle");
    std::fs::copy(&file, &first).unwrap();
    let mut files = vec![first];
    let mut injected = None;
    for step in 1..6 {
        let out = dir.path().join(format!("step-{step}.pickle"));
        injected = Some(inject("snapshot", &file, &out, 2 * step, 1 << 20, None));
        files.push(out);
    }
    let report = trend_json(&files);
    assert_eq!(report["checkpoints"], 6);
    let suspects = report["suspects"].as_array().unwrap();
    assert_eq!(suspects.len(), 1, "{report:#}");
    assert_eq!(
        culprit_of(&suspects[0]),
        expected_culprit(&injected.unwrap())
    );
    assert_eq!(
        suspects[0]["growth_bytes"],
        8 << 20,
        "from 2 MiB after warm-up to 10 MiB"
    );
    assert_eq!(suspects[0]["growth_per_checkpoint"], 2 << 20);
    // Pickles record neither step nor time: ordered by file name, numbers
    // as numbers, whatever order they are given in.
    assert_eq!(report["order"], "names");
    let mut shuffled = files.clone();
    shuffled.reverse();
    shuffled.swap(0, 2);
    let again = trend_json(&shuffled);
    assert_eq!(again["suspects"], report["suspects"]);
    assert_eq!(again["points"], report["points"]);

    // --fail-over: 8 MiB suspected.
    let mut args: Vec<std::ffi::OsString> =
        vec!["trend".into(), "--fail-over".into(), "7MiB".into()];
    args.extend(files.iter().map(|f| f.clone().into_os_string()));
    let run = snapdiff(&args);
    run.expect_code(1);
    assert_eq!(
        run.stderr(),
        "snapdiff: 8.00 MiB of suspected growth, over the 7.00 MiB limit (--max-growth)\n"
    );
    assert!(
        run.stdout()
            .contains("1 site keeps growing: 8.00 MiB after warm-up"),
        "{}",
        run.stdout()
    );
    // The evidence under the table: the floor and blocks at each checkpoint
    // after warm-up (the pickles carry no steps, so checkpoints are numbered).
    let text = run.stdout();
    let evidence: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| !l.starts_with("evidence:"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        evidence[0],
        ["1", "checkpoint", "#2", "#3", "#4", "#5", "#6"]
    );
    // The injected stack is a real one that already held 15 MiB in 2 blocks.
    assert_eq!(
        evidence[2].join(" "),
        "floor 17.0 MiB 19.0 MiB 21.0 MiB 23.0 MiB 25.0 MiB"
    );
    assert_eq!(evidence[3], ["blocks", "4", "6", "8", "10", "12"]);

    // Steady: the same file five times.
    let same = vec![file.clone(); 5];
    assert_eq!(trend_json(&same)["suspects"], serde_json::json!([]));

    // An unreadable file among them: reported, the rest analysed, exit code 2.
    let bad = dir.path().join("bad.snap");
    std::fs::write(&bad, b"SNAPDIFF").unwrap();
    let mut args: Vec<std::ffi::OsString> = vec!["trend".into()];
    args.extend(files.iter().map(|f| f.clone().into_os_string()));
    args.push(bad.into_os_string());
    let run = snapdiff(&args);
    run.expect_code(2);
    assert!(
        run.stderr().contains("bad.snap: truncated .snap header"),
        "{}",
        run.stderr()
    );
    assert!(run.stdout().contains("keeps growing"), "{}", run.stdout());
}

#[test]
fn summary_names_the_sites_holding_the_most_memory() {
    let Some(file) = shared_torch("cs336-medium-128-training.pickle") else {
        return;
    };
    let report = snapdiff(["summary".as_ref(), file.as_os_str(), "--json".as_ref()])
        .expect_code(0)
        .json();
    let top = report["top_sites"].as_array().unwrap();
    assert!(!top.is_empty());
    let bytes: Vec<u64> = top.iter().map(|s| s["bytes"].as_u64().unwrap()).collect();
    assert!(
        bytes.windows(2).all(|w| w[0] >= w[1]),
        "most first: {bytes:?}"
    );
    // The optimizer state is named by the user's optimizer code.
    assert!(
        top.iter().any(|s| s["culprit"]["file"]
            .as_str()
            .unwrap()
            .ends_with("cs336_basics/optimizer.py")),
        "{report:#}"
    );
    let frag = &report["fragmentation"];
    assert!(frag["free_bytes"].as_u64().unwrap() >= frag["largest_free_block"].as_u64().unwrap());
}

#[test]
fn a_culprit_line_is_shown_with_its_largest_stack() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let mut merged = 0;
    for file in &files {
        let summary = |by: &str| {
            let args = ["summary", "--json", "--top", "1000", "--by", by];
            let mut args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
            args.insert(1, file.as_os_str());
            snapdiff(args).expect_code(0).json()["top_sites"]
                .as_array()
                .unwrap()
                .clone()
        };
        let by_stack = summary("stack");
        for row in summary("culprit") {
            let stacks: Vec<&Value> = by_stack
                .iter()
                .filter(|s| culprit_of(s) == culprit_of(&row))
                .collect();
            if stacks.len() > 1 {
                merged += 1;
            }
            // The most bytes, then the smallest key: whatever order the
            // stacks were grouped in.
            let largest = stacks
                .iter()
                .max_by_key(|s| {
                    let key = s["key"].as_str().unwrap();
                    (s["bytes"].as_u64().unwrap(), std::cmp::Reverse(key))
                })
                .unwrap();
            assert_eq!(row["key"], largest["key"], "{}: {row:#}", file.display());
        }
    }
    // ftcourse-finetune's notebook cell alone reaches its line by 7 stacks.
    assert!(merged >= 3, "{merged} merged rows");
}
#[test]
fn compare_says_when_only_the_cache_grew() {
    use snapdiff::{Allocator, AllocatorConfig, HostBackend, Stream};
    let dir = tempdir();
    let a = Allocator::with_config(
        HostBackend::with_capacity(1 << 30),
        AllocatorConfig::default(),
    );
    let weights = a.alloc(4 << 20, Stream::DEFAULT).unwrap();
    let before = dir.path().join("before.snap");
    a.dump(&before).unwrap();
    // A peak of activations, all freed: the allocator keeps their segments cached.
    let peak: Vec<_> = (0..4)
        .map(|_| a.alloc(30 << 20, Stream::DEFAULT).unwrap())
        .collect();
    drop(peak);
    let after = dir.path().join("after.snap");
    a.dump(&after).unwrap();
    let report = compare_json(&before, &after);
    assert_eq!(report["leaked_bytes"], 0);
    assert_eq!(
        report["matching"], "allocation_sequence",
        "two dumps of one run"
    );
    assert!(report["reserved_after"].as_u64() > report["reserved_before"].as_u64());
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("reserved memory grew by 120 MiB while allocated memory did not"),
        "{notes}"
    );
    drop(weights);
}

/// Rewrites the frame paths of `input` into `form` (see
/// `tests/support/rewrite_paths.py`); returns the map of old to new paths.
fn rewrite_paths(form: &str, input: &Path, output: &Path) -> Value {
    let args: [&OsStr; 3] = [form.as_ref(), input.as_os_str(), output.as_os_str()];
    python_json("rewrite_paths.py", &args)
}

/// Each top site's culprit as (function, file, line, kind) and its bytes,
/// with the file passed through `map`.
fn summary_culprits(
    file: &Path,
    map: &dyn Fn(&str) -> String,
) -> Vec<(String, String, u64, String, u64)> {
    let report = snapdiff(["summary".as_ref(), file.as_os_str(), "--json".as_ref()])
        .expect_code(0)
        .json();
    let mut sites: Vec<_> = report["top_sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let c = &s["culprit"];
            (
                c["name"].as_str().unwrap().to_owned(),
                map(c["file"].as_str().unwrap()),
                c["line"].as_u64().unwrap(),
                c["kind"].as_str().unwrap().to_owned(),
                s["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    sites.sort();
    sites
}

#[test]
fn culprits_are_the_same_lines_in_every_environment_users_record_in() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let dir = tempdir();
    for file in &files {
        let leaked = dir.path().join("leaked.pickle");
        let injected = inject("snapshot", file, &leaked, 3, 1 << 20, None);
        for form in ["windows", "conda", "debian", "notebook"] {
            let rewritten = dir.path().join(format!("{form}.pickle"));
            let map = rewrite_paths(form, file, &rewritten);
            let mapped = |f: &str| map[f].as_str().unwrap_or(f).to_owned();
            assert_eq!(
                summary_culprits(&rewritten, &|f| f.to_owned()),
                summary_culprits(file, &mapped),
                "{} as {form}",
                file.display()
            );
            // Tables show paths from the folder of the user's code, so a
            // Windows recording reads as the original does; whole on request.
            if form == "windows" {
                let rows = |f: &Path, full: bool| {
                    let mut args = vec!["summary".as_ref(), f.as_os_str()];
                    if full {
                        args.push("--full-paths".as_ref());
                    }
                    let out = snapdiff(args).expect_code(0).stdout();
                    out.lines()
                        .filter(|l| l.starts_with("│ "))
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                };
                // Without the rank column: sites of equal bytes are ordered
                // by stack key, which the paths are part of.
                let culprit_rows = |rows: Vec<String>| -> Vec<String> {
                    let mut rows: Vec<String> = rows
                        .into_iter()
                        .filter(|r| r.contains(':'))
                        .map(|r| {
                            // Columns as words: a wider row elsewhere pads these.
                            let words: Vec<&str> = r
                                .trim_start_matches(|c: char| !c.is_alphabetic())
                                .split_whitespace()
                                .collect();
                            words.join(" ")
                        })
                        // Context lines show paths whole, as recorded.
                        .filter(|r| !r.starts_with("in compiled code"))
                        .collect();
                    rows.sort();
                    rows
                };
                assert_eq!(
                    culprit_rows(rows(&rewritten, false)),
                    culprit_rows(rows(file, false)),
                    "{} as {form}",
                    file.display()
                );
                let has_user_site = summary_culprits(&rewritten, &|f| f.to_owned())
                    .iter()
                    .any(|c| c.3 == "user" && c.1.starts_with("C:") && !c.1.contains("ipykernel"));
                if has_user_site {
                    let full = rows(&rewritten, true).join("\n");
                    assert!(full.contains("C:\\"), "{full}");
                }
            }
            // compare names the injected line in the new form too.
            let rewritten_leaked = dir.path().join(format!("{form}-leaked.pickle"));
            rewrite_paths(form, &leaked, &rewritten_leaked);
            let report = compare_json(&rewritten, &rewritten_leaked);
            let (name, culprit_file, line) = expected_culprit(&injected);
            assert_eq!(
                culprit_of(&report["groups"][0]),
                (name, mapped(&culprit_file), line),
                "{} as {form}",
                file.display()
            );
            assert_eq!(report["groups"][0]["culprit"]["kind"], "user");
        }
    }
}

/// Writes a copy of `input` in which every live block of the 20 largest
/// sites is rounded to 512 bytes more (the same blocks, carved from other
/// segments), as CPython's pickler writes it. Returns the slack added.
fn reround(input: &Path, output: &Path) -> u64 {
    let script = "import pickle, sys\n\
        snap = pickle.load(open(sys.argv[1], 'rb'))\n\
        live = [b for s in snap['segments'] for b in s['blocks'] if b['state'] == 'active_allocated']\n\
        for b in live:\n\
        \x20   b.setdefault('requested_size', b['size'])\n\
        slack = 0\n\
        for b in live[:400]:\n\
        \x20   b['size'] += 512\n\
        \x20   slack += 512\n\
        pickle.dump(snap, open(sys.argv[2], 'wb'), protocol=4)\n\
        print(slack)\n";
    python_script(script, &[input, output])
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn allocator_rounding_is_slack_not_a_leak() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let dir = tempdir();
    for file in &files {
        // A steady job: the same blocks, rounded differently. Nothing leaked.
        let rerounded = dir.path().join("rerounded.pickle");
        let slack = reround(file, &rerounded);
        let report = compare_json(file, &rerounded);
        assert_eq!(report["leaked_bytes"], 0, "{}: {report:#}", file.display());
        assert!(slack > 0);
        for g in report["groups"].as_array().unwrap() {
            assert_eq!(g["change"], "rounding", "{}: {g:#}", file.display());
        }

        // A slow leak of 3 KiB under that slack: named first, exact bytes.
        let leaked = dir.path().join("leaked.pickle");
        let injected = inject("snapshot", &rerounded, &leaked, 3, 1024, None);
        let report = compare_json(file, &leaked);
        assert_eq!(
            report["leaked_bytes"],
            3 * 1024,
            "{}: {report:#}",
            file.display()
        );
        let first = &report["groups"][0];
        assert_eq!(
            culprit_of(first),
            expected_culprit(&injected),
            "{}",
            file.display()
        );
        assert_eq!(first["delta_bytes"], 3 * 1024);
    }
}

/// `name` (a real PyTorch trace) with 30 allocations of 1 MiB, never freed,
/// spread through its first device's trace at a real stack of another run:
/// the leaked file in `dir`, and what was injected. `None` without
/// `../shared`.
fn leaking_trace(name: &str, dir: &Path) -> Option<(PathBuf, Value)> {
    let file = shared_torch(name)?;
    let training = shared_torch("cs336-medium-128-training.pickle")?;
    let leaked = dir.join("leaked.pickle");
    let injected = inject("trace", &file, &leaked, 30, 1 << 20, Some(&training));
    Some((leaked, injected))
}

#[test]
fn an_idle_device_with_markers_changes_nothing_on_the_busy_one() {
    let dir = tempdir();
    let Some((leaked, injected)) = leaking_trace("maph-llama-inference.pickle", dir.path()) else {
        return;
    };
    // Device 1 (idle) gets three snapshot markers and nothing else, as a
    // job that marks steps on every visible device records.
    let marked = dir.path().join("marked.pickle");
    let script = "import pickle, sys\n\
        snap = pickle.load(open(sys.argv[1], 'rb'))\n\
        snap['device_traces'][1] = [{'action': 'snapshot', 'addr': 0, 'size': 0, 'stream': 0,\n\
        \x20   'frames': []} for k in range(3)]\n\
        pickle.dump(snap, open(sys.argv[2], 'wb'), protocol=4)\n";
    python_script(script, &[&leaked, &marked]);
    let plain = trend_json(std::slice::from_ref(&leaked));
    let report = trend_json(std::slice::from_ref(&marked));
    for r in [&plain, &report] {
        let suspects = r["suspects"].as_array().unwrap();
        assert_eq!(suspects.len(), 1, "only the injected site: {r:#}");
        assert_eq!(culprit_of(&suspects[0]), expected_culprit(&injected));
    }
    assert_eq!(report["suspects"], plain["suspects"]);
    assert_eq!(report["checkpoint_source"], plain["checkpoint_source"]);
    let notes = report["notes"].to_string();
    assert!(notes.contains("device 1 recorded no allocation"), "{notes}");
}

#[test]
fn a_wrapped_trace_is_judged_on_its_window_and_says_so() {
    let dir = tempdir();
    let Some((leaked, injected)) = leaking_trace("eor-nn-counterfactuals.pickle", dir.path())
    else {
        return;
    };
    // Keep the last two thirds of the trace, as a ring buffer that wrapped
    // keeps only its newest events.
    let wrapped = dir.path().join("wrapped.pickle");
    let script = "import pickle, sys\n\
        snap = pickle.load(open(sys.argv[1], 'rb'))\n\
        t = snap['device_traces'][0]\n\
        snap['device_traces'][0] = t[len(t) // 3:]\n\
        pickle.dump(snap, open(sys.argv[2], 'wb'), protocol=4)\n";
    python_script(script, &[&leaked, &wrapped]);
    let report = trend_json(std::slice::from_ref(&wrapped));
    let suspects = report["suspects"].as_array().unwrap();
    assert_eq!(suspects.len(), 1, "only the injected site: {report:#}");
    assert_eq!(culprit_of(&suspects[0]), expected_culprit(&injected));
    let notes = report["notes"].to_string();
    assert!(notes.contains("never saw allocated"), "{notes}");
}

#[test]
fn trend_names_the_same_line_in_every_environment_users_record_in() {
    let dir = tempdir();
    let Some((leaked, injected)) = leaking_trace("eor-nn-counterfactuals.pickle", dir.path())
    else {
        return;
    };
    let (name, culprit_file, line) = expected_culprit(&injected);
    for form in ["windows", "conda", "debian", "notebook"] {
        let rewritten = dir.path().join(format!("{form}.pickle"));
        let map = rewrite_paths(form, &leaked, &rewritten);
        let report = trend_json(std::slice::from_ref(&rewritten));
        let suspects = report["suspects"].as_array().unwrap();
        assert_eq!(suspects.len(), 1, "{form}: {report:#}");
        assert_eq!(
            culprit_of(&suspects[0]),
            (
                name.clone(),
                map[&culprit_file].as_str().unwrap().to_owned(),
                line
            ),
            "{form}"
        );
    }
}

#[test]
fn folders_are_read_by_trend_and_refused_by_summary_and_unrelated_files_are_said() {
    let Some(eor) = shared_torch("eor-nn-counterfactuals.pickle") else {
        return;
    };
    let Some(ft) = shared_torch("ftcourse-finetune.pickle") else {
        return;
    };
    let dir = tempdir();
    // trend DIR: the snapshots in it, whatever else is there.
    for step in 1..5 {
        let out = dir.path().join(format!("step-{step}.pickle"));
        inject("snapshot", &eor, &out, 2 * step, 1 << 20, None);
    }
    std::fs::write(dir.path().join("notes.txt"), "not a snapshot").unwrap();
    let report = snapdiff(["trend".as_ref(), dir.path().as_os_str(), "--json".as_ref()])
        .expect_code(0)
        .one_trend();
    assert_eq!(report["checkpoints"], 4, "{report:#}");
    // summary DIR: one line saying what to do instead.
    let run = snapdiff(["summary".as_ref(), dir.path().as_os_str()]);
    run.expect_code(2);
    assert_eq!(
        run.stderr(),
        format!(
            "snapdiff: {}: is a folder, not a snapshot file (snapdiff trend FOLDER reads the \
             snapshots in one)\n",
            dir.path().display()
        )
    );
    // Two programs' snapshots share no site: compare says so.
    let notes = compare_json(&eor, &ft)["notes"].to_string();
    assert!(
        notes.contains("share no code path: different programs?"),
        "{notes}"
    );
}

#[test]
fn completions_and_the_man_page_cover_every_command() {
    let bash = snapdiff(["completions", "bash"]).expect_code(0).stdout();
    let man = snapdiff(["man"]).expect_code(0).stdout();
    assert!(man.contains(".TH snapdiff 1"), "{man}");
    for command in [
        "capture",
        "compare",
        "trend",
        "summary",
        "peak",
        "oom",
        "steps",
        "report",
        "flamegraph",
        "pprof",
        "convert",
    ] {
        assert!(
            bash.contains(&format!("snapdiff__subcmd__{command}")),
            "bash: {command}"
        );
        assert!(man.contains(command), "man: {command}");
    }
    let run = snapdiff(["completions", "tcsh"]);
    run.expect_code(2);
}

#[test]
fn flags_say_how_a_trace_is_cut_and_into_how_many_checkpoints() {
    let Some(eor) = shared_torch("eor-nn-counterfactuals.pickle") else {
        return;
    };
    let trend = |flags: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> =
            vec!["trend".as_ref(), eor.as_os_str(), "--json".as_ref()];
        args.extend(flags.iter().map(std::ffi::OsStr::new));
        snapdiff(args)
    };
    // By default, at its 9 snapshot markers and its end.
    let default = trend(&[]).expect_code(0).one_trend();
    assert_eq!(default["checkpoint_source"], "snapshot_markers");
    assert_eq!(default["checkpoints"], 10);
    // --checkpoints limits the markers too, keeping the first and last.
    let four = trend(&["--checkpoints", "4"]).expect_code(0).one_trend();
    assert_eq!(four["checkpoint_source"], "snapshot_markers");
    assert_eq!(four["checkpoints"], 4);
    let events = |r: &serde_json::Value| -> Vec<u64> {
        r["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["event_index"].as_u64().unwrap())
            .collect()
    };
    let (all, some) = (events(&default), events(&four));
    assert_eq!((some[0], some[3]), (all[0], all[9]));
    // --cut chooses the way, and a way the trace lacks is a clear error.
    let even = trend(&["--cut", "evenly", "--checkpoints", "6"])
        .expect_code(0)
        .one_trend();
    assert_eq!(even["checkpoint_source"], "evenly_spaced");
    assert_eq!(even["checkpoints"], 6);
    let run = trend(&["--cut", "steps"]);
    run.expect_code(2);
    assert!(
        run.stderr()
            .contains("device 0's trace has no step marks to cut at"),
        "{}",
        run.stderr()
    );
}

#[test]
fn compiled_code_is_never_the_culprit_but_is_shown_beside_it() {
    // A mixture-of-experts model under torch.compile: Inductor's generated
    // `call` in /tmp/torchinductor_*/ allocated some of its memory.
    let Some(file) = shared_torch("blockzero-moe-compile.pickle") else {
        return;
    };
    let json = snapdiff(["summary".as_ref(), file.as_os_str(), "--json".as_ref()]).json();
    let culprits: Vec<String> = json["top_sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["culprit"]["file"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        culprits.iter().all(|f| !f.contains("torchinductor_")),
        "{culprits:?}"
    );
    let text = snapdiff(["summary".as_ref(), file.as_os_str()]).stdout();
    let at = text
        .find("in compiled code call  /tmp/torchinductor_")
        .expect(&text);
    // Beside the user's line that ran the compiled model.
    let row = &text[text[..at].rfind("│ 2 ").unwrap()..at];
    assert!(
        row.contains("evaluate_model  shared/evaluate.py:58"),
        "{row}"
    );
}
