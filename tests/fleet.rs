//! `snapdiff fleet` and `export` on a generated job of 64 ranks replayed
//! from a real PyTorch trace (see `fleet_job`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Value, json};
use snapdiff_analyze::Culprit;
use snapdiff_format::units::format_size as size;

use crate::fleet_job::{Truth, make_fleet};
use crate::util::{shared_torch, snapdiff, tempdir};

const RANKS: u32 = 64;
const STEPS: u32 = 6;

/// The job, made once for all the tests here, and its folder.
fn fleet() -> Option<&'static (Truth, PathBuf)> {
    static FLEET: OnceLock<Option<(Truth, PathBuf)>> = OnceLock::new();
    FLEET
        .get_or_init(|| {
            let source = shared_torch("cs336-medium-128-inference.pickle")?;
            // Under the target folder, one per test process (nextest runs
            // each test in its own, at the same time), since no drop would
            // remove it from a static; the folders of processes that have
            // ended are removed first.
            let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
            for old in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
                let name = old.file_name().to_string_lossy().into_owned();
                let ended = name
                    .strip_prefix("fleet-64-")
                    .is_some_and(|pid| !Path::new("/proc").join(pid).exists());
                if ended || name == "fleet-64" {
                    let _ = std::fs::remove_dir_all(old.path());
                }
            }
            let dir = tmp.join(format!("fleet-64-{}", std::process::id()));
            let truth = make_fleet(&source, RANKS, STEPS, &dir);
            Some((truth, dir))
        })
        .as_ref()
}

fn same_line(json: &Value, culprit: &Culprit) -> bool {
    json["name"] == culprit.name.as_str()
        && json["file"] == culprit.file.as_str()
        && json["line"] == culprit.line
}

/// The fleet's JSON without what depends on where rows were read from
/// (files and their bytes).
fn verdict_of(mut report: Value) -> Value {
    let fields = report.as_object_mut().unwrap();
    fields.remove("files");
    fields.remove("bytes");
    report
}

fn ranks_of(members: &Value) -> Vec<u64> {
    members
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["rank"].as_u64().unwrap())
        .collect()
}

#[test]
fn every_leaking_rank_and_line_is_named_with_its_growth_and_rank0_is_imbalance() {
    let Some((truth, dir)) = fleet() else {
        return crate::util::skip("fleet", "../shared/fixtures/torch is not here");
    };
    let run = snapdiff([
        "fleet".as_ref(),
        dir.as_os_str(),
        "--json".as_ref(),
        "--top".as_ref(),
        "0".as_ref(),
    ]);
    let report = run.expect_code(0).json();
    assert_eq!(report["processes"], RANKS, "{report:#}");
    assert_eq!(report["files"], truth.files);
    let leaking: usize = truth.leaks.iter().map(|l| l.ranks.len()).sum();
    assert_eq!(report["leaking"], leaking);
    assert_eq!(
        report["steady"],
        RANKS as usize - leaking,
        "no steady rank called leaking"
    );
    assert_eq!(report["leaks"].as_array().unwrap().len(), truth.leaks.len());
    for leak in &truth.leaks {
        let found = report["leaks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| same_line(&l["site"]["culprit"], &leak.culprit))
            .unwrap_or_else(|| panic!("{:?} not among {:#}", leak.culprit, report["leaks"]));
        let expected: Vec<u64> = leak.ranks.iter().map(|&(r, _)| u64::from(r)).collect();
        assert_eq!(ranks_of(&found["members"]), expected);
        for (member, &(_, bytes)) in found["members"].as_array().unwrap().iter().zip(&leak.ranks) {
            assert_eq!(member["growth_per_step"], bytes as f64, "{member:#}");
        }
    }
    let imbalance = report["imbalance"].as_array().unwrap();
    assert_eq!(imbalance.len(), 1, "{imbalance:#?}");
    assert!(same_line(
        &imbalance[0]["site"]["culprit"],
        &truth.held_by_rank0
    ));
    assert_eq!(ranks_of(&imbalance[0]["members"]), [0]);
    assert_eq!(imbalance[0]["median_bytes"], 0);
    let excess = imbalance[0]["members"][0]["excess_bytes"].as_u64().unwrap();
    assert!(
        truth.held_bytes - excess < 512,
        "{excess} of {}",
        truth.held_bytes
    );
    // Every rank has a row: its verdict, suspects and checkpoints.
    let members = report["members"].as_array().unwrap();
    assert_eq!(members.len(), RANKS as usize);
    assert!(
        members
            .iter()
            .all(|m| m["checkpoints"].as_array().unwrap().len() == STEPS as usize)
    );
    assert_eq!(members[7]["verdict"], "leaking");
    assert_eq!(members[1]["verdict"], "steady");
}

#[test]
fn the_report_fits_one_screen_and_names_the_ranks_and_lines() {
    let Some((truth, dir)) = fleet() else {
        return crate::util::skip("fleet", "../shared/fixtures/torch is not here");
    };
    let text = snapdiff(["fleet".as_ref(), dir.as_os_str()])
        .expect_code(0)
        .stdout();
    assert!(text.lines().count() <= 40, "{text}");
    assert!(
        text.starts_with("64 ranks read from 384 snapshots"),
        "{text}"
    );
    assert!(text.contains(": 61 steady, 3 leaking"), "{text}");
    let big = &truth.leaks[0];
    let ranks: Vec<String> = big.ranks.iter().map(|r| r.0.to_string()).collect();
    let line = text
        .lines()
        .find(|l| l.contains(&format!("ranks {} (2 of 64)", ranks.join(", "))))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&format!(
            "{}:{}",
            big.culprit.file.rsplit('/').next().unwrap(),
            big.culprit.line
        )),
        "{line}"
    );
    assert!(line.ends_with("a step each"), "{line}");
    let held = format!(
        "rank 0 holds {} more than the median (0 B) at",
        size(truth.held_bytes)
    );
    assert!(text.contains(&held), "{held} in {text}");
    // One rank's full report.
    let rank = snapdiff([
        "fleet".as_ref(),
        dir.as_os_str(),
        "--rank".as_ref(),
        "7".as_ref(),
    ])
    .expect_code(0)
    .stdout();
    assert!(rank.contains("6 checkpoints (one per snapshot)"), "{rank}");
    assert!(rank.contains(&format!(":{}", big.culprit.line)), "{rank}");
}

#[test]
fn parquet_tables_give_the_same_verdict_as_the_snapshots() {
    let Some((_, dir)) = fleet() else {
        return crate::util::skip("fleet", "../shared/fixtures/torch is not here");
    };
    let direct = snapdiff([
        "fleet".as_ref(),
        dir.as_os_str(),
        "--json".as_ref(),
        "--top".as_ref(),
        "0".as_ref(),
    ])
    .expect_code(0)
    .json();
    let out = tempdir();
    // One table folder per machine of eight ranks, as each node would write its own.
    for node in 0..RANKS / 8 {
        let tables = out.path().join(format!("node{node}"));
        snapdiff([
            "export".as_ref(),
            dir.join(format!("node{node}")).as_os_str(),
            "-o".as_ref(),
            tables.as_os_str(),
        ])
        .expect_code(0);
    }
    let from_tables = snapdiff([
        "fleet".as_ref(),
        out.path().as_os_str(),
        "--json".as_ref(),
        "--top".as_ref(),
        "0".as_ref(),
    ])
    .expect_code(0)
    .json();
    assert_eq!(verdict_of(from_tables), verdict_of(direct));
    // Writing over them asks first.
    let again = snapdiff([
        "export".as_ref(),
        dir.join("node0").as_os_str(),
        "-o".as_ref(),
        out.path().join("node0").as_os_str(),
    ]);
    assert!(again.expect_code(2).stderr().contains("pass --force"));
    // Parquet bytes per rank, against the rank's snapshot bytes.
    let tables: u64 = walk(out.path())
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .sum();
    let snapshots: u64 = walk(dir).iter().map(|p| p.metadata().unwrap().len()).sum();
    assert!(
        tables * 20 < snapshots,
        "{tables} B of tables for {snapshots} B of snapshots"
    );
}

#[test]
fn unreadable_files_are_named_and_the_rest_judged() {
    let Some((_, dir)) = fleet() else {
        return crate::util::skip("fleet", "../shared/fixtures/torch is not here");
    };
    let copy = tempdir();
    for rank in [1u32, 2, 3, 7] {
        for step in 0..STEPS {
            let name = format!("rank{rank}-step{step}.snap");
            std::fs::copy(dir.join("node0").join(&name), copy.path().join(&name)).unwrap();
        }
    }
    // A dump cut short by a rank that was killed while writing it.
    let cut = copy.path().join("rank3-step5.snap");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let run = snapdiff(["fleet".as_ref(), copy.path().as_os_str()]);
    let text = run.expect_code(2).stdout();
    assert!(text.contains("4 ranks read from 23 snapshots"), "{text}");
    assert!(
        text.contains("1 file could not be read and is left out:"),
        "{text}"
    );
    assert!(text.contains("rank3-step5.snap"), "{text}");
    assert!(text.contains("rank 7 (1 of 4)"), "{text}");
    assert!(run.stderr().contains("rank3-step5.snap"));
}

#[test]
fn a_ranks_files_spread_over_folders_links_and_hard_links_are_one_series_read_once() {
    let Some((_, dir)) = fleet() else {
        return crate::util::skip("fleet", "../shared/fixtures/torch is not here");
    };
    // Rank 7 leaks. Its first steps in folder a, its last in folder z, the
    // other ranks' files in m between them: the fleet hands a rank on
    // once all its files are found, so it must wait for z. m also holds a
    // hard link to one of rank 7's files and a symbolic link to another,
    // under their own names: reached twice, read once.
    let plain = tempdir();
    let spread = tempdir();
    for name in ["a", "m", "z"] {
        std::fs::create_dir(spread.path().join(name)).unwrap();
    }
    for rank in [1u32, 2, 3, 7] {
        for step in 0..STEPS {
            let name = format!("rank{rank}-step{step}.snap");
            let from = dir.join("node0").join(&name);
            std::fs::copy(&from, plain.path().join(&name)).unwrap();
            let folder = match (rank, step) {
                (7, s) if s < STEPS / 2 => "a",
                (7, _) => "z",
                _ => "m",
            };
            std::fs::copy(&from, spread.path().join(folder).join(&name)).unwrap();
        }
    }
    std::fs::hard_link(
        spread.path().join("a/rank7-step0.snap"),
        spread.path().join("m/rank7-step0.snap"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        spread.path().join("z/rank7-step5.snap"),
        spread.path().join("m/rank7-step5.snap"),
    )
    .unwrap();
    let judge = |folder: &Path| {
        snapdiff(["fleet".as_ref(), folder.as_os_str(), "--json".as_ref()])
            .expect_code(0)
            .json()
    };
    let (plain, spread) = (judge(plain.path()), judge(spread.path()));
    assert_eq!(spread["files"], 4 * STEPS, "{spread:#}");
    assert_eq!(spread["processes"], 4);
    assert_eq!(spread["leaking"], 1);
    assert_eq!(spread["leaks"], plain["leaks"]);
    let rank7 = &spread["members"][3];
    assert_eq!(rank7["rank"], 7);
    let steps: Vec<u64> = rank7["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (0..u64::from(STEPS)).collect::<Vec<_>>());
}

#[test]
fn quoted_globs_and_missing_paths() {
    let Some((_, dir)) = fleet() else {
        return crate::util::skip("fleet", "../shared/fixtures/torch is not here");
    };
    let pattern = dir.join("node0").join("rank[0-3]-step*.snap");
    let report = snapdiff(["fleet".as_ref(), pattern.as_os_str(), "--json".as_ref()])
        .expect_code(0)
        .json();
    assert_eq!(report["processes"], 4);
    assert_eq!(report["files"], 4 * STEPS);
    // A rank the job does not have: said, not that there are no snapshots.
    let absent = snapdiff([
        "fleet".as_ref(),
        dir.as_os_str(),
        "--rank".as_ref(),
        "999".as_ref(),
    ]);
    let said = absent.expect_code(2).stderr();
    assert!(
        said.contains("no snapshot of rank 999 could be read"),
        "{said}"
    );
    let missing = snapdiff(["fleet", "/nonexistent/rank*.snap"]);
    assert!(
        missing
            .expect_code(2)
            .stderr()
            .contains("no file matches this pattern")
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn export_never_writes_through_a_link_planted_in_its_folder() {
    let dir = tempdir();
    let dumps = dir.path().join("dumps");
    crate::util::leaking_training_job(&dumps, 6, 2);
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "a user's own file").unwrap();
    let out = crate::util::shared_folder(dir.path(), "tables");
    // Another user plants the names a table was once written under first.
    for table in snapdiff_fleet::TABLE_FILES {
        crate::util::plant_link(&victim, &out.join(format!(".{table}.partial")));
    }
    snapdiff([
        "export".as_ref(),
        dumps.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ])
    .expect_code(0);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "a user's own file"
    );
    for table in snapdiff_fleet::TABLE_FILES {
        assert!(out.join(table).is_file() && !out.join(table).is_symlink());
    }
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && !n.ends_with(".partial"))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "temporary files left");
}

#[test]
fn fifos_devices_and_too_few_checkpoints_never_hang_or_pass_for_a_verdict() {
    let Some((_, dir)) = fleet() else {
        return crate::util::skip("fleet", "../shared/fixtures/torch is not here");
    };
    let copy = tempdir();
    for rank in [1u32, 2] {
        for step in 0..STEPS {
            let name = format!("rank{rank}-step{step}.snap");
            std::fs::copy(dir.join("node0").join(&name), copy.path().join(&name)).unwrap();
        }
    }
    // A FIFO (a read would wait forever) and a link to /dev/zero (a read
    // would never end) named like snapshots: named, left out, exit 2.
    let fifo = copy.path().join("rank3-step0.pickle");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    std::os::unix::fs::symlink("/dev/zero", copy.path().join("rank4-step0.pickle")).unwrap();
    let run = snapdiff(["fleet".as_ref(), copy.path().as_os_str()]);
    let text = run.expect_code(2).stdout();
    assert!(text.contains("2 ranks read from 12 snapshots"), "{text}");
    assert!(
        text.contains("2 files could not be read and are left out:"),
        "{text}"
    );
    assert!(text.contains("not a regular file"), "{text}");
    // Named on its own too.
    let run = snapdiff(["fleet".as_ref(), fifo.as_os_str()]);
    assert!(run.expect_code(2).stderr().contains("not a regular file"));

    // Every rank with too few checkpoints: no verdict, exit 3, never "no
    // rank's memory keeps growing".
    let few = tempdir();
    for rank in [1u32, 2] {
        for step in 0..2 {
            let name = format!("rank{rank}-step{step}.snap");
            std::fs::copy(dir.join("node0").join(&name), few.path().join(&name)).unwrap();
        }
    }
    let run = snapdiff(["fleet".as_ref(), few.path().as_os_str()]);
    let text = run.expect_code(3).stdout();
    assert!(
        text.contains("no verdict: no rank has checkpoints enough"),
        "{text}"
    );
    assert!(!text.contains("keeps growing at any line"), "{text}");
}

#[test]
fn export_into_a_folder_inside_its_input_never_reads_its_own_tables() {
    let Some((_, dir)) = fleet() else {
        return crate::util::skip("fleet", "../shared/fixtures/torch is not here");
    };
    let job = tempdir();
    for rank in [1u32, 2, 7] {
        for step in 0..STEPS {
            let name = format!("rank{rank}-step{step}.snap");
            std::fs::copy(dir.join("node0").join(&name), job.path().join(&name)).unwrap();
        }
    }
    let tables = job.path().join("tables");
    let export = |force: bool| {
        let mut args = vec![
            "export".as_ref(),
            job.path().as_os_str(),
            "-o".as_ref(),
            tables.as_os_str(),
            "--json".as_ref(),
        ];
        if force {
            args.push("--force".as_ref());
        }
        snapdiff(args).expect_code(0).json()
    };
    let first = export(false);
    let again = export(true);
    assert_eq!(first["files"], 3 * STEPS);
    assert_eq!(again["files"], first["files"], "{again:#}");
    let from_tables = snapdiff(["fleet".as_ref(), tables.as_os_str(), "--json".as_ref()])
        .expect_code(0)
        .json();
    assert_eq!(
        from_tables["processes"], 3,
        "every rank once: {from_tables:#}"
    );
    for m in from_tables["members"].as_array().unwrap() {
        assert_eq!(m["checkpoints"].as_array().unwrap().len() as u32, STEPS);
    }
    // A snapshot written into the tables' folder since: refused, not
    // passed over.
    std::fs::copy(
        job.path().join("rank1-step0.snap"),
        tables.join("rank1-step0.snap"),
    )
    .unwrap();
    let run = snapdiff(["fleet".as_ref(), tables.as_os_str()]);
    assert!(
        run.expect_code(2)
            .stderr()
            .contains("holds site tables and 1 snapshot file together"),
        "{}",
        run.stderr()
    );
}

#[test]
fn ranks_dumping_plain_pytorch_names_into_folders_of_their_own_are_never_one_series() {
    // `_dump_snapshot(f"{out}/rank{r}/step{n}.pickle")`: every rank's files
    // have the same names, which say nothing of the rank; the folder does.
    let job = tempdir();
    let series = [
        ("rank0", "backward"),
        ("rank1", "graph-pool"),
        ("rank_2", "pinned-cache"),
        ("node-a", "backward"),
    ];
    for (folder, source) in series {
        let to = job.path().join(folder);
        std::fs::create_dir(&to).unwrap();
        for file in std::fs::read_dir(crate::util::fixture("torch-format").join(source)).unwrap() {
            let file = file.unwrap().path();
            let name = file.file_name().unwrap().to_str().unwrap();
            std::fs::copy(&file, to.join(name)).unwrap();
        }
    }
    let report = snapdiff(["fleet".as_ref(), "--json".as_ref(), job.path().as_os_str()])
        .expect_code(0)
        .json();
    assert_eq!(
        (&report["processes"], &report["leaking"]),
        (&serde_json::json!(4), &serde_json::json!(2)),
        "{report:#}"
    );
    let leaks = report["leaks"].as_array().unwrap();
    assert_eq!(leaks.len(), 1, "{report:#}");
    let members: Vec<_> = leaks[0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["rank"].clone(), m["process"].as_str().unwrap().to_owned()))
        .collect();
    let node_a = job.path().join("node-a").to_str().unwrap().to_owned();
    assert_eq!(
        members,
        [
            (Value::Null, node_a),
            (serde_json::json!(0), "rank0".to_owned())
        ],
        "{report:#}"
    );
    assert_eq!(leaks[0]["site"]["culprit"]["line"], 31);
    let text = snapdiff(["fleet".as_ref(), job.path().as_os_str()])
        .expect_code(0)
        .stdout();
    assert!(
        text.contains("4 ranks read from 36 snapshots (93.4 KiB): 2 steady, 2 leaking"),
        "{text}"
    );
}

#[test]
fn two_runs_in_sibling_folders_without_manifests_are_never_one_series() {
    // Before, `fleet` merged them into one series and the leaking run
    // disappeared: "1 steady, 0 leaking", exit 0.
    let dir = tempdir();
    let (job, files) = crate::util::sibling_runs(dir.path());
    let fleet = snapdiff(["fleet".as_ref(), "--json".as_ref(), job.as_os_str()])
        .expect_code(0)
        .json();
    assert_eq!(
        (&fleet["processes"], &fleet["leaking"]),
        (&json!(2), &json!(1)),
        "{fleet:#}"
    );
    let judged: Vec<(&str, &str)> = fleet["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["process"].as_str().unwrap(),
                m["verdict"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        judged,
        [("rank1@runA", "leaking"), ("rank1@runB", "steady")]
    );
    assert_eq!(fleet["leaks"][0]["site"]["culprit"]["line"], 31);
    // `trend` and `report` of the same files, given one by one.
    let args = |command: &str| -> Vec<std::ffi::OsString> {
        std::iter::once(command.into())
            .chain(files.iter().map(|f| f.as_os_str().to_owned()))
            .collect()
    };
    let mut trend_args = args("trend");
    trend_args.push("--json".into());
    let trend = snapdiff(trend_args).expect_code(0).json();
    let processes: Vec<(&str, usize)> = trend["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let suspects = p["trend"]["suspects"].as_array().unwrap().len();
            (p["process"].as_str().unwrap(), suspects)
        })
        .collect();
    assert_eq!(
        processes,
        [("rank1@runA", 1), ("rank1@runB", 0)],
        "{trend:#}"
    );
    let page = dir.path().join("page.html");
    let mut report_args = args("report");
    report_args.extend(["-o".into(), page.clone().into_os_string()]);
    snapdiff(report_args).expect_code(0);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("rank1@runA") && html.contains("rank1@runB"));
}

#[test]
fn folders_of_one_dump_each_are_one_runs_steps() {
    // `_dump_snapshot(f"{out}/step{n}/rank1.pickle")`: a folder a step.
    let dir = tempdir();
    let from = crate::util::fixture("torch-format").join("backward");
    for step in 0..9 {
        let to = dir.path().join(format!("step{step}"));
        std::fs::create_dir(&to).unwrap();
        std::fs::copy(
            from.join(format!("step{step}.pickle")),
            to.join("rank1-step.pickle"),
        )
        .unwrap();
    }
    let fleet = snapdiff(["fleet".as_ref(), "--json".as_ref(), dir.path().as_os_str()])
        .expect_code(0)
        .json();
    assert_eq!(
        (&fleet["processes"], &fleet["leaking"]),
        (&json!(1), &json!(1)),
        "{fleet:#}"
    );
    assert_eq!(
        fleet["members"][0]["checkpoints"].as_array().unwrap().len(),
        9
    );
}

/// A job of three ranks that each left one file with a trace: ranks 0 and
/// 1 leak (allocations injected into real traces), rank 2 does not.
/// Returns the job's folder and its files in rank order.
pub(crate) fn ranks_of_one_file(parent: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
    let training = shared_torch("cs336-medium-128-training.pickle")?;
    let job = parent.join("job");
    std::fs::create_dir(&job).unwrap();
    let mut files = Vec::new();
    for (rank, fixture, leaks) in [
        (0, "eor-nn-counterfactuals.pickle", true),
        (1, "cs336-medium-128-inference.pickle", true),
        (2, "cs336-medium-128-inference.pickle", false),
    ] {
        let file = job.join(format!("rank{rank}-step30-exit.pickle"));
        let from = shared_torch(fixture)?;
        if leaks {
            crate::analyze::inject("trace", &from, &file, 30, 1 << 20, Some(&training));
        } else {
            std::fs::copy(&from, &file).unwrap();
        }
        files.push(file);
    }
    Some((job, files))
}

#[test]
fn a_rank_of_one_file_is_judged_by_its_trace_as_trend_judges_it() {
    // Before, `fleet` judged such a rank by its one dump: "no verdict",
    // while `trend` of the same file named the leaking line.
    let dir = tempdir();
    let Some((job, files)) = ranks_of_one_file(dir.path()) else {
        return crate::util::skip("one-file ranks", "../shared/fixtures/torch is not here");
    };
    let fleet = snapdiff(["fleet".as_ref(), "--json".as_ref(), job.as_os_str()])
        .expect_code(0)
        .json();
    assert_eq!(
        (&fleet["processes"], &fleet["leaking"]),
        (&json!(3), &json!(2)),
        "{fleet:#}"
    );
    for (member, file) in fleet["members"].as_array().unwrap().iter().zip(&files) {
        let trend = snapdiff(["trend".as_ref(), "--json".as_ref(), file.as_os_str()])
            .expect_code(0)
            .one_trend();
        let name = file.display();
        assert_eq!(
            member["suspected_bytes"], trend["suspected_bytes"],
            "{name}"
        );
        for field in ["culprit", "series", "floor", "growth_bytes"] {
            let of = |suspects: &Value| -> Vec<Value> {
                suspects
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s[field].clone())
                    .collect()
            };
            assert_eq!(
                of(&member["suspects"]),
                of(&trend["suspects"]),
                "{name}: {field}"
            );
        }
        let leaks = !trend["suspects"].as_array().unwrap().is_empty();
        assert_eq!(
            member["verdict"],
            if leaks { "leaking" } else { "steady" },
            "{name}"
        );
    }
}

#[test]
fn one_folder_of_two_runs_far_apart_in_time_is_two_runs() {
    // Snapshots that record their time but no process (another tool's
    // JSON): a steady run, then 1157 days later a leaking one, in one
    // folder under one rank's names. Each is a run of its own; the latest
    // is judged, said.
    let dir = tempdir();
    let made = dir.path().join("made");
    let steady = made.join("steady");
    let leaking = made.join("leaking");
    let job = dir.path().join("job");
    std::fs::create_dir_all(&job).unwrap();
    let steady_files = crate::util::steady_training_job(&steady, 40, 4);
    let leaking_files = crate::util::leaking_training_job(&leaking, 40, 4);
    let day_us: i64 = 86_400 * 1_000_000;
    for (files, shift, first) in [(&steady_files, 0, 0), (&leaking_files, 1157 * day_us, 100)] {
        for (i, file) in files.iter().enumerate() {
            let json = job.join(format!("rank1-step{}.json", first + i));
            snapdiff(["convert".as_ref(), file.as_os_str(), json.as_os_str()]).expect_code(0);
            let mut value: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
            let meta = value["snapshot"]["meta"].as_object_mut().unwrap();
            for key in ["pid", "host", "run_id"] {
                meta.remove(key);
            }
            let t = meta["created_us"].as_i64().unwrap();
            meta.insert("created_us".into(), json!(t + shift));
            std::fs::write(&json, serde_json::to_vec(&value).unwrap()).unwrap();
        }
    }
    let fleet = snapdiff(["fleet".as_ref(), "--json".as_ref(), job.as_os_str()])
        .expect_code(0)
        .json();
    assert_eq!(
        (&fleet["processes"], &fleet["leaking"]),
        (&json!(1), &json!(1)),
        "{fleet:#}"
    );
    let member = &fleet["members"][0];
    assert_eq!(
        member["checkpoints"].as_array().unwrap().len(),
        leaking_files.len()
    );
    let notes = fleet["notes"].to_string();
    assert!(
        notes.contains("a pause far longer than their spacing"),
        "{notes}"
    );
    let trend = snapdiff(["trend".as_ref(), "--json".as_ref(), job.as_os_str()])
        .expect_code(0)
        .one_trend();
    assert_eq!(trend["checkpoints"], leaking_files.len(), "{trend:#}");
    assert_eq!(trend["suspected_bytes"], member["suspected_bytes"]);
    assert!(
        trend["notes"].to_string().contains("earlier run"),
        "{trend:#}"
    );
}
