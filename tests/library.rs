//! The `snapdiff` library from a user's point of view: leak assertions in
//! tests, on the runtime's allocator and on PyTorch's files.

use std::panic::{AssertUnwindSafe, catch_unwind};

use snapdiff::testing::{LeakCheck, LeakOptions, assert_no_leaks_between};
use snapdiff::{Allocator, AllocatorConfig, DeviceBuffer, HostBackend, Stream};

use crate::util::{shared_torch, tempdir};

fn allocator() -> Allocator {
    Allocator::with_config(
        HostBackend::with_capacity(1 << 30),
        AllocatorConfig::default(),
    )
}

/// The panic message of `f`, which must panic.
fn panic_message(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("the check must fail");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap()
}

/// The line of this file that ends with `marker`.
fn line_of(marker: &str) -> u32 {
    include_str!("library.rs")
        .lines()
        .position(|l| l.trim_end().ends_with(marker))
        .unwrap() as u32
        + 1
}

/// One step of a training loop that forgets to drop what it keeps.
#[inline(never)]
fn leaky_training_step(a: &Allocator, history: &mut Vec<DeviceBuffer>) {
    let activations = a.alloc(1 << 20, Stream::DEFAULT).unwrap();
    history.push(a.alloc(64 << 10, Stream::DEFAULT).unwrap()); // KEPT EVERY STEP
    drop(activations);
}

/// One step that keeps nothing.
#[inline(never)]
fn clean_training_step(a: &Allocator) {
    let activations: Vec<DeviceBuffer> = (0..4)
        .map(|_| a.alloc(1 << 20, Stream::DEFAULT).unwrap())
        .collect();
    drop(activations);
}

/// Keeps one buffer, wherever it is called from.
#[inline(never)]
fn keep_one(a: &Allocator, history: &mut Vec<DeviceBuffer>) {
    history.push(a.alloc(16 << 10, Stream::DEFAULT).unwrap()); // KEPT FROM TWO PATHS
}

#[inline(never)]
fn first_path(a: &Allocator, history: &mut Vec<DeviceBuffer>) {
    keep_one(a, history);
}

#[inline(never)]
fn second_path(a: &Allocator, history: &mut Vec<DeviceBuffer>) {
    keep_one(a, history);
}

#[test]
fn a_line_reached_by_two_paths_is_one_site() {
    let a = allocator();
    let mut history = Vec::new();
    let check = LeakCheck::begin(&a);
    for _ in 0..3 {
        first_path(&a, &mut history);
        second_path(&a, &mut history);
        check.step();
    }
    let report = check.finish();
    assert_eq!(report.groups().len(), 1, "{report}");
    assert_eq!(report.leaked_bytes(), 6 * (16 << 10));
    assert_eq!(report.groups()[0].blocks(), 6);
    assert_eq!(
        report.groups()[0].culprit().line,
        line_of("// KEPT FROM TWO PATHS")
    );
    assert!(
        report.to_string().contains("(2 call paths to this line)"),
        "{report}"
    );
}

#[test]
fn a_leaking_test_fails_naming_its_own_line() {
    let a = allocator();
    let mut history = Vec::new();
    let check = LeakCheck::begin(&a);
    for _ in 0..3 {
        leaky_training_step(&a, &mut history);
        check.step();
    }
    let message = panic_message(|| check.assert_no_leaks());
    let line = line_of("// KEPT EVERY STEP");
    assert!(
        message.starts_with("snapdiff: 1 site kept 192 KiB more (allowed: 0 B):"),
        "{message}"
    );
    // The row is `snapdiff compare`'s: the culprit at the test's own line,
    // blocks and bytes from the end of warm-up to the end, the delta.
    // Its path follows the name, on the row or, where the table is too
    // narrow for both, on the next line.
    let lines: Vec<&str> = message.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("::leaky_training_step "))
        .unwrap_or_else(|| panic!("no row for the culprit: {message}"));
    let (row, culprit) = (lines[at], format!("{}:{line} ", file!()));
    assert!(
        row.contains(&culprit) || lines[at + 1].contains(&culprit),
        "{message}"
    );
    for cell in ["0 -> 3", "0 B -> 192 KiB", "+192 KiB", "100%"] {
        assert!(row.contains(cell), "{cell:?} in {row}");
    }
    assert!(
        // (cut from the left where the table is too narrow for it)
        message.contains("leaking_test_fails_naming_its_own_line"),
        "the test's own frame: {message}"
    );
    assert!(
        message.contains("look closer: snapdiff compare "),
        "{message}"
    );
    // Test runners show it where no terminal says its width: the table
    // fits 100 columns.
    for l in message
        .lines()
        .filter(|l| l.starts_with(['┌', '│', '╞', '└']))
    {
        assert!(
            l.chars().count() <= 100,
            "{} columns: {l}",
            l.chars().count()
        );
    }

    // The files it names are real snapshots, and the command line works on them.
    let last = message.lines().last().unwrap();
    let files: Vec<&str> = last
        .split_whitespace()
        .filter(|w| w.ends_with(".snap"))
        .collect();
    assert_eq!(files.len(), 2, "{last}");
    let cmp = snapdiff::compare(
        &snapdiff::read(files[0]).unwrap(),
        &snapdiff::read(files[1]).unwrap(),
        &snapdiff::CompareOptions::default(),
    );
    assert_eq!(cmp.leaked_bytes, 192 << 10);

    // The report, for custom assertions.
    let report = check.finish();
    assert_eq!(report.leaked_bytes(), 192 << 10);
    let g = &report.groups()[0];
    assert_eq!(
        (g.culprit().line, g.blocks(), g.delta_bytes()),
        (line, 3, 192 << 10)
    );
    assert!(
        g.frames()
            .iter()
            .any(|f| f.name.ends_with("leaky_training_step"))
    );
}

#[test]
fn a_clean_test_passes() {
    let a = allocator();
    let weights = a.alloc(8 << 20, Stream::DEFAULT).unwrap();
    let check = LeakCheck::begin(&a);
    for _ in 0..5 {
        clean_training_step(&a);
        check.step();
    }
    check.assert_no_leaks();
    assert_eq!(check.finish().leaked_bytes(), 0);
    drop(weights);
}

#[test]
fn warm_up_allocations_are_not_leaks_only_with_warmup() {
    let run = |warmup: Option<usize>| {
        let a = allocator();
        let mut optimizer_state: Option<DeviceBuffer> = None;
        // The strict rule: one-time allocations count unless in warm-up
        // (the floor rule never takes them for a leak).
        let check = match warmup {
            Some(n) => LeakCheck::begin(&a).strict().warmup(n),
            None => LeakCheck::begin(&a).strict(),
        };
        for _ in 0..5 {
            clean_training_step(&a);
            // The first step creates the optimizer's state, once.
            optimizer_state.get_or_insert_with(|| a.alloc(2 << 20, Stream::DEFAULT).unwrap());
            check.step();
        }
        let report = check.finish();
        drop(optimizer_state);
        report
    };
    assert!(run(Some(1)).is_clean(), "{}", run(Some(1)));
    let without = run(None);
    assert!(!without.is_clean());
    assert_eq!(without.leaked_bytes(), 2 << 20);
    assert!(
        without.groups()[0]
            .culprit()
            .name
            .contains("warm_up_allocations_are_not_leaks_only_with_warmup")
    );
}

#[test]
fn allow_bytes_and_ignore_do_what_they_say() {
    let a = allocator();
    let mut history = Vec::new();
    let check = LeakCheck::begin(&a).allow_bytes(256 << 10);
    for _ in 0..3 {
        leaky_training_step(&a, &mut history);
        check.step();
    }
    check.assert_no_leaks(); // 192 KiB kept, 256 KiB allowed
    // One step: judged by the strict rule (the floor rule has no verdict).
    let strict = LeakCheck::begin(&a).strict().allow_bytes(32 << 10);
    leaky_training_step(&a, &mut history);
    assert!(panic_message(|| strict.assert_no_leaks()).contains("(allowed: 32.0 KiB)"));
    let no_verdict = LeakCheck::begin(&a);
    leaky_training_step(&a, &mut history);
    assert!(panic_message(|| no_verdict.assert_no_leaks()).starts_with("snapdiff: no verdict: "));

    let ignoring = LeakCheck::begin(&a).strict().ignore("leaky_training_step");
    leaky_training_step(&a, &mut history);
    ignoring.assert_no_leaks();
    let only_other = LeakCheck::begin(&a).strict().only("clean_training_step");
    leaky_training_step(&a, &mut history);
    only_other.assert_no_leaks();
    let only_this = LeakCheck::begin(&a).strict().only("leaky_training_step");
    leaky_training_step(&a, &mut history);
    assert_eq!(only_this.finish().leaked_bytes(), 64 << 10);
}

#[test]
fn checks_over_pytorch_pickles() {
    let Some(file) = shared_torch("cs336-medium-128-inference.pickle") else {
        return;
    };
    // The same file twice: nothing leaked.
    assert_no_leaks_between(&file, &file, &LeakOptions::new());

    // A leak injected by CPython into a copy of it.
    let dir = tempdir();
    let leaked = dir.path().join("leaked.pickle");
    let out = std::process::Command::new("python3")
        .arg(crate::util::root().join("tests/support/inject_leak.py"))
        .args([
            "snapshot".as_ref(),
            file.as_os_str(),
            leaked.as_os_str(),
            "--blocks".as_ref(),
            "3".as_ref(),
        ])
        .args(["--size", "1048576"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let message = panic_message(|| assert_no_leaks_between(&file, &leaked, &LeakOptions::new()));
    assert!(
        message.starts_with("snapdiff: 1 site kept 3.00 MiB more"),
        "{message}"
    );
    assert!(
        message.contains(".py:"),
        "a Python line is named: {message}"
    );
    assert!(
        message.contains(&format!(
            "snapdiff compare {} {}",
            file.display(),
            leaked.display()
        )),
        "{message}"
    );
    assert_no_leaks_between(&file, &leaked, &LeakOptions::new().allow_bytes(3 << 20));
    assert_no_leaks_between(&file, &leaked, &LeakOptions::new().ignore(r"\.py:"));

    // An unreadable file is a clear panic.
    let bad = dir.path().join("bad.pickle");
    std::fs::write(&bad, b"nope").unwrap();
    let message = panic_message(|| assert_no_leaks_between(&file, &bad, &LeakOptions::new()));
    assert!(
        message.starts_with(&format!("snapdiff: {}: not a snapshot", bad.display())),
        "{message}"
    );
}

/// `LeakCheck` against a baseline file, the one `snapdiff baseline` writes:
/// written the first time, within it the second, and a buffer grown by
/// 3 MiB fails naming its line.
#[test]
fn leak_check_against_a_baseline_names_the_site_that_rose() {
    use snapdiff::analyze::baseline::Tolerance;
    let dir = tempdir();
    let file = dir.path().join("memory").join("step.json");
    let steps = |size: usize| {
        let a = allocator();
        let check = LeakCheck::begin(&a).warmup(1);
        let mut held: Vec<DeviceBuffer> = Vec::new();
        for _ in 0..4 {
            held.clear();
            held.push(a.alloc(size, Stream::DEFAULT).unwrap()); // the baselined buffer
            check.step();
        }
        check.assert_within_baseline(&file, Tolerance::default());
    };
    // Each run from the same caller, as a test suite runs it: a site is
    // keyed by its innermost frames of the program's own code.
    let attempt = |size: usize| {
        catch_unwind(AssertUnwindSafe(|| steps(size)))
            .err()
            .map(|e| e.downcast_ref::<String>().cloned().unwrap_or_default())
    };
    assert_eq!(attempt(1 << 20), None, "written");
    let kept = std::fs::read_to_string(&file).unwrap();
    assert!(kept.contains("\"snapdiff_baseline\": 1"), "{kept}");
    assert_eq!(attempt(1 << 20), None, "within the baseline");
    let message = attempt(4 << 20).expect("over the baseline");
    let line = line_of("// the baselined buffer");
    assert!(
        message.contains(&format!(
            "library.rs:{line}  at the peak: 1.00 MiB -> 4.00 MiB"
        )),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        kept,
        "a check never writes"
    );
}
