//! One limit gives one answer: `trend --max-growth`, `fleet --max-growth`,
//! the library's `LeakCheck` (its report over the same snapshots) and the
//! pytest plugin's judge (Python's `Limit`, passed through to the command)
//! decide "over the limit" alike, on one table of cases.

use std::path::Path;
use std::process::Command;

use snapdiff::testing::{LeakOptions, LeakReport};

use crate::util::{leaking_training_job, root, snapdiff, tempdir};

/// Whether Python's `Limit` (as the pytest plugin and the training
/// callbacks use it) finds `folder` over `max_growth`, the command doing
/// the judging.
fn python_over(folder: &Path, max_growth: &str) -> bool {
    let script = "import sys; from snapdiff._limits import Limit, judge\n\
                  limit = Limit({'max_growth': sys.argv[2]})\n\
                  print(limit.over(judge([sys.argv[1]], 1, limit)))";
    let bin = Path::new(env!("CARGO_BIN_EXE_snapdiff")).parent().unwrap();
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(folder)
        .arg(max_growth)
        .env("PYTHONPATH", root().join("python"))
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    match String::from_utf8_lossy(&out.stdout).trim() {
        "True" => true,
        "False" => false,
        other => panic!("python said {other:?}"),
    }
}

#[test]
fn the_same_limit_gives_the_same_exit_in_trend_fleet_leakcheck_and_the_plugin() {
    let dir = tempdir();
    let job = dir.path().join("job");
    let files = leaking_training_job(&job, 40, 4);
    let trend = snapdiff(["trend".as_ref(), "--json".as_ref(), job.as_os_str()])
        .expect_code(0)
        .one_trend();
    let suspects = trend["suspects"].as_array().unwrap();
    assert!(!suspects.is_empty(), "{trend:#}");
    let sum = |field: &str| -> u64 {
        suspects
            .iter()
            .map(|s| s[field].as_f64().unwrap().round() as u64)
            .sum()
    };
    let (all, step, checkpoint) = (
        trend["suspected_bytes"].as_u64().unwrap(),
        sum("growth_per_step"),
        sum("growth_per_checkpoint"),
    );
    assert!(step > 0 && checkpoint > step, "a dump every 4 steps");
    // (limit, over?)
    let cases = [
        ("0".to_owned(), true),
        (format!("{}", all - 1), true),
        (format!("{all}"), false),
        ("1GiB".to_owned(), false),
        (format!("{}/step", step - 1), true),
        (format!("{step}/step"), false),
        (format!("{}/checkpoint", checkpoint - 1), true),
        (format!("{checkpoint}/checkpoint"), false),
    ];
    let snapshots: Vec<snapdiff::Snapshot> =
        files.iter().map(|f| snapdiff::read(f).unwrap()).collect();
    for (limit, over) in &cases {
        let exit = if *over { 1 } else { 0 };
        let gate = |command: &str| {
            snapdiff([
                command.as_ref(),
                job.as_os_str(),
                "--max-growth".as_ref(),
                limit.as_ref(),
            ])
            .code()
        };
        assert_eq!(gate("trend"), exit, "trend --max-growth {limit}");
        assert_eq!(gate("fleet"), exit, "fleet --max-growth {limit}");
        let options = LeakOptions::new().limit(limit.parse().unwrap());
        let report = LeakReport::between(&snapshots, 1, &options);
        assert_eq!(report.is_clean(), !over, "LeakCheck with {limit}: {report}");
        assert_eq!(
            python_over(&job, limit),
            *over,
            "the plugin's max_growth={limit}"
        );
    }
}
