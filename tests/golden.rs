//! The text and JSON of each analysis command on each real PyTorch
//! snapshot, against the outputs kept in `tests/data/golden/`: any change
//! to what users read shows up as a diff to review.
//!
//! After a change meant to alter the output, run the tests with
//! `SNAPDIFF_BLESS=1` to rewrite the files, and read the diff before
//! committing it.

use crate::util::{root, shared_torch_fixtures, snapdiff};

/// The commands of one file whose output is kept, each as text and as JSON.
const COMMANDS: [&str; 5] = ["summary", "trend", "peak", "steps", "oom"];

/// Pairs of fixtures `compare` runs on: the same model training and in
/// inference (a comparison of two programs' states), and a file with itself.
const PAIRS: [(&str, &str); 2] = [
    ("cs336-medium-128-training", "cs336-medium-128-inference"),
    ("ftcourse-finetune", "ftcourse-finetune"),
];

#[test]
fn outputs_on_the_real_fixtures_are_the_kept_ones() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let bless = std::env::var_os("SNAPDIFF_BLESS").is_some();
    let golden = root().join("tests/data/golden");
    std::fs::create_dir_all(&golden).unwrap();
    let mut changed = Vec::new();
    // Named as users name them, relative to the repository.
    let folders: std::collections::HashMap<String, String> = files
        .iter()
        .map(|f| {
            let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
            let folder = f
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (stem, folder)
        })
        .collect();
    let shown = |stem: &str| format!("../shared/fixtures/{}/{stem}.pickle", folders[stem]);
    let mut runs: Vec<(String, Vec<String>)> = Vec::new();
    for file in &files {
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        for command in COMMANDS {
            runs.push((
                format!("{stem}.{command}"),
                vec![command.into(), shown(&stem)],
            ));
        }
        // At 80 columns, whole paths: cut from the left, never wrapped.
        for command in ["summary", "trend"] {
            runs.push((
                format!("{stem}.{command}.80-columns"),
                [command, "--width", "80", "--full-paths", &shown(&stem)]
                    .map(String::from)
                    .into(),
            ));
        }
        runs.push((
            format!("{stem}.folded"),
            ["flamegraph", "--folded", "-o", "-", &shown(&stem)]
                .map(String::from)
                .into(),
        ));
    }
    for (before, after) in PAIRS {
        runs.push((
            format!("{before}.compare.{after}"),
            vec!["compare".into(), shown(before), shown(after)],
        ));
    }
    for (name, args) in runs {
        // Folded stacks and fitted tables have no JSON form.
        let forms: &[bool] = if args[0] == "flamegraph" || args.contains(&"--width".into()) {
            &[false]
        } else {
            &[false, true]
        };
        for &json in forms {
            let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
            if json {
                args.push("--json");
            }
            let run = snapdiff(&args);
            let output = format!(
                "$ snapdiff {}\nexit {}\n{}{}",
                args.join(" "),
                run.code(),
                run.stdout(),
                run.stderr()
            );
            if args.contains(&"--width") {
                let wide: Vec<&str> = output
                    .lines()
                    .filter(|l| l.starts_with(['│', '┌', '╞', '└']) && l.chars().count() > 80)
                    .collect();
                assert!(wide.is_empty(), "{name}: rows over 80 columns: {wide:#?}");
            }
            let kept = golden.join(format!("{name}.{}", if json { "json.txt" } else { "txt" }));
            if bless {
                std::fs::write(&kept, &output).unwrap();
            } else if std::fs::read_to_string(&kept).ok().as_deref() != Some(output.as_str()) {
                changed.push(kept.display().to_string());
            }
        }
    }
    assert!(
        changed.is_empty(),
        "outputs differ from the kept ones (rerun with SNAPDIFF_BLESS=1 if meant, and review the diff):\n{}",
        changed.join("\n")
    );
}
