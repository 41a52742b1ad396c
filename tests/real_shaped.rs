//! Results on real-shaped files are those of the build before the speed
//! work (per-frame caches, trace-less reading, JSON schema 2).
//!
//! `bench/make_real_shaped.py` writes a pair of snapshots shaped like real
//! ones (deep mixed C++/Python stacks built from the frames of the real
//! PyTorch snapshots, thousands of distinct stacks); the expected reports
//! in `tests/data/real-shaped-*.txt` are what commit bc8ed05 printed for
//! them, in the canonical form of `tests/support/canonical_report.py`.
//! That build had a row per stack, so the reports are asked `--by stack`.

use std::path::Path;

use crate::util::{python_file, root, shared_torch_fixtures, snapdiff, tempdir};

/// The report `args` prints, in canonical lines.
fn canonical(dir: &Path, name: &str, args: &[&str]) -> String {
    let run = snapdiff(args.iter().copied());
    assert!(run.code() <= 1, "{args:?} failed: {}", run.stderr());
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, run.stdout()).unwrap();
    python_file(&root().join("tests/support/canonical_report.py"), &[&path])
}

/// The kept result `name` (`tests/data/`); `SNAPDIFF_BLESS=1` rewrites it
/// with `got` (read the diff before committing).
fn expected(name: &str, got: &str) -> String {
    let path = root().join("tests/data").join(name);
    if std::env::var_os("SNAPDIFF_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
    }
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn real_shaped_results_are_unchanged() {
    if shared_torch_fixtures().is_none() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let small = [
        "--blocks", "20000", "--events", "20000", "--stacks", "2000", "--growth", "400",
    ];
    let generator_args: Vec<&str> = [d.to_str().unwrap()].into_iter().chain(small).collect();
    python_file(&root().join("bench/make_real_shaped.py"), &generator_args);
    let file = |name: &str| d.join(name).to_str().unwrap().to_owned();
    for f in ["a", "b"] {
        let pickle = file(&format!("real-{f}.pickle"));
        let snap = file(&format!("real-{f}.snap"));
        snapdiff(["convert", pickle.as_str(), snap.as_str()]).expect_code(0);
    }
    let (a, b) = (file("real-a.pickle"), file("real-b.pickle"));
    let (sa, sb) = (file("real-a.snap"), file("real-b.snap"));

    let pickles = canonical(
        d,
        "cmp",
        &["compare", "--json", "--top", "0", "--by", "stack", &a, &b],
    );
    let want = expected("real-shaped-compare.txt", &pickles);
    assert_eq!(pickles, want, "compare of the pickles changed");
    let snaps = canonical(
        d,
        "cmp-snap",
        &["compare", "--json", "--top", "0", "--by", "stack", &sa, &sb],
    );
    assert_eq!(snaps, want, "compare of the .snap files changed");

    let summary = canonical(
        d,
        "sum",
        &["summary", "--json", "--top", "300", "--by", "stack", &a],
    );
    assert_eq!(
        summary,
        expected("real-shaped-summary.txt", &summary),
        "summary changed"
    );
}
