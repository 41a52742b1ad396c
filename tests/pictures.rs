//! Flame graphs, folded stacks and pprof profiles of real snapshots, read
//! back by the tools they are for: CPython's XML parser for the SVG and
//! `go tool pprof` (Debian's `golang-go`) for the profiles.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use crate::util::{python_script, shared_torch, snapdiff, tempdir};

/// The live bytes of each culprit line of `file` (`function file:line`),
/// from `summary --json`.
fn bytes_by_culprit(file: &Path) -> HashMap<String, u64> {
    let summary = snapdiff([
        "summary".as_ref(),
        file.as_os_str(),
        "--json".as_ref(),
        "--top".as_ref(),
        "0".as_ref(),
    ])
    .expect_code(0)
    .json();
    let mut by_line: HashMap<String, u64> = HashMap::new();
    for site in summary["top_sites"].as_array().unwrap() {
        let c = &site["culprit"];
        let line = format!(
            "{} {}:{}",
            c["name"].as_str().unwrap(),
            c["file"].as_str().unwrap(),
            c["line"]
        );
        *by_line.entry(line).or_default() += site["bytes"].as_u64().unwrap();
    }
    by_line
}

fn largest(by_line: &HashMap<String, u64>) -> (&String, u64) {
    by_line
        .iter()
        .max_by_key(|(line, bytes)| (**bytes, std::cmp::Reverse(line.as_str())))
        .map(|(l, &b)| (l, b))
        .unwrap()
}

#[test]
fn flame_graphs_and_folded_stacks_show_every_live_byte_under_its_stack() {
    let Some(file) = shared_torch("eor-nn-counterfactuals.pickle") else {
        return;
    };
    let dir = tempdir();
    let svg = dir.path().join("live.svg");
    snapdiff([
        "flamegraph".as_ref(),
        file.as_os_str(),
        "-o".as_ref(),
        svg.as_os_str(),
    ])
    .expect_code(0);
    // A well-formed SVG (CPython's XML parser) that names the largest
    // culprit line's function and file.
    let parsed = python_script(
        "import sys, xml.etree.ElementTree as ET\n\
         root = ET.parse(sys.argv[1]).getroot()\n\
         print(root.tag)\n\
         print('\\n'.join(t.text or '' for t in root.iter('{http://www.w3.org/2000/svg}title')))",
        &[svg.as_os_str()],
    );
    assert!(
        parsed.starts_with("{http://www.w3.org/2000/svg}svg"),
        "{parsed}"
    );
    assert!(
        parsed.contains("generate_counterfactuals (FourierNN/counterfactuals.py:102)"),
        "{parsed}"
    );

    // Folded stacks: one line per site, outermost frame first; their bytes
    // add up to the snapshot's live requested bytes.
    let folded = dir.path().join("live.folded");
    snapdiff([
        "flamegraph".as_ref(),
        file.as_os_str(),
        "--folded".as_ref(),
        "-o".as_ref(),
        folded.as_os_str(),
    ])
    .expect_code(0);
    let text = std::fs::read_to_string(&folded).unwrap();
    let total: u64 = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let live: u64 = bytes_by_culprit(&file).values().sum();
    assert_eq!(total, live);
    assert!(
        text.lines().any(|l| {
            l.contains(";generate_counterfactuals (FourierNN/counterfactuals.py:102);")
                && l.ends_with(" 15728640")
        }),
        "{text}"
    );

    // The same file as BEFORE and AFTER: a difference of nothing.
    let diff = dir.path().join("diff.folded");
    snapdiff([
        "flamegraph".as_ref(),
        "--diff".as_ref(),
        file.as_os_str(),
        file.as_os_str(),
        "--folded".as_ref(),
        "-o".as_ref(),
        diff.as_os_str(),
    ])
    .expect_code(0);
    for line in std::fs::read_to_string(&diff).unwrap().lines() {
        let mut counts = line.rsplitn(3, ' ');
        let (after, before) = (counts.next().unwrap(), counts.next().unwrap());
        assert_eq!(before, after, "{line}");
    }

    // Nothing is replaced without --force.
    let again = snapdiff([
        "flamegraph".as_ref(),
        file.as_os_str(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    again.expect_code(2);
    assert!(
        again.stderr().contains("already exists; pass --force"),
        "{}",
        again.stderr()
    );
    // A moment the file does not have is a clear error.
    let bad = snapdiff([
        "flamegraph".as_ref(),
        file.as_os_str(),
        "--at".as_ref(),
        "step:99".as_ref(),
        "-o".as_ref(),
        dir.path().join("x.svg").as_os_str(),
    ]);
    bad.expect_code(2);
    assert!(bad.stderr().contains("has no step 99"), "{}", bad.stderr());
}

/// `go tool pprof`, or `None` (with a line saying why) when Go is not
/// installed and SNAPDIFF_REQUIRE_GO is not set.
fn go() -> Option<Command> {
    let found = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("SNAPDIFF_REQUIRE_GO").is_none(),
            "go is missing, and SNAPDIFF_REQUIRE_GO says it must be there (apt-get install golang-go)"
        );
        crate::util::skip("go", "apt-get install golang-go");
        return None;
    }
    let mut go = Command::new("go");
    go.args(["tool", "pprof"]);
    Some(go)
}

/// The rows of `go tool pprof -top -lines -unit=B FILE`: (flat bytes, name).
fn pprof_top(profile: &Path, sample: &str) -> Option<Vec<(u64, String)>> {
    let out = go()?
        .args([
            "-top",
            "-lines",
            "-unit=B",
            &format!("-sample_index={sample}"),
        ])
        .arg(profile)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        text.lines()
            .skip_while(|l| !l.trim_start().starts_with("flat"))
            .skip(1)
            .map(|l| {
                let mut parts = l.split_whitespace();
                let flat = parts.next().unwrap().trim_end_matches('B').parse().unwrap();
                let name = parts.skip(4).collect::<Vec<_>>().join(" ");
                (flat, name)
            })
            .collect(),
    )
}

#[test]
fn pprof_profiles_read_in_go_tool_pprof_with_the_culprit_line_first() {
    let Some(file) = shared_torch("eor-nn-counterfactuals.pickle") else {
        return;
    };
    let dir = tempdir();
    let profile = dir.path().join("live.pb.gz");
    snapdiff([
        "pprof".as_ref(),
        file.as_os_str(),
        "-o".as_ref(),
        profile.as_os_str(),
    ])
    .expect_code(0);
    let Some(rows) = pprof_top(&profile, "inuse_space") else {
        return;
    };
    // Each site's bytes sit on its culprit line, so pprof's largest line is
    // the largest culprit line of `summary`, with the same bytes (ties in
    // bytes may come in either order).
    let by_line = bytes_by_culprit(&file);
    let (_, bytes) = largest(&by_line);
    assert_eq!(rows[0].0, bytes, "{rows:?}");
    assert!(
        by_line.get(&rows[0].1) == Some(&bytes),
        "{rows:?} {by_line:?}"
    );
    let total: u64 = rows.iter().map(|r| r.0).sum();
    assert!(total <= by_line.values().sum(), "{rows:?}");

    // A script's module-level code is named by its file, not `<unknown>`
    // (pprof drops what is between `<` and `>`, as in C++ templates).
    let cumulative = go()
        .unwrap()
        .args(["-top", "-cum"])
        .arg(&profile)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&cumulative.stdout);
    assert!(!text.contains("<unknown>"), "{text}");
    assert!(
        text.lines().any(|l| l.ends_with(" counterfactuals.py")),
        "{text}"
    );

    // A difference of a file with itself: no growth anywhere.
    let diff = dir.path().join("diff.pb.gz");
    snapdiff([
        "pprof".as_ref(),
        "--diff".as_ref(),
        file.as_os_str(),
        file.as_os_str(),
        "-o".as_ref(),
        diff.as_os_str(),
    ])
    .expect_code(0);
    let rows = pprof_top(&diff, "growth_space").unwrap();
    assert!(rows.iter().all(|r| r.0 == 0), "{rows:?}");
}
