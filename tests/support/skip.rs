//! How a test says it skips its checks for want of a dependency; shared
//! by the workspace's test crates (`#[path]`).

/// Says that the running test skips its checks because `dependency` is
/// missing, and how to install it: one line on stderr, and, under
/// `tests/run.sh` (which sets `SNAPDIFF_SKIPS`), a line in its list of
/// skipped tests, which it prints at the end of the run (cargo's test
/// harness hides what a passing test prints).
pub fn skip(dependency: &str, install: &str) {
    eprintln!("skipped: needs {dependency} ({install})");
    if let Some(list) = std::env::var_os("SNAPDIFF_SKIPS") {
        use std::io::Write;
        let test = std::thread::current().name().unwrap_or("?").to_owned();
        let line = format!("{dependency}\t{install}\t{test}\n");
        // One write of a short line: lines of parallel tests never interleave.
        let list = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(list);
        if let Ok(mut file) = list {
            let _ = file.write_all(line.as_bytes());
        }
    }
}
