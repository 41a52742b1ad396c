//! The text and JSON of each analysis command on each real PyTorch
//! snapshot, against the outputs kept in `tests/data/golden/`: any change
//! to what users read shows up as a diff to review.
//!
//! After a change meant to alter the output, run the tests with
//! `SNAPDIFF_BLESS=1` to rewrite the files, and read the diff before
//! committing it.

use crate::util::{root, shared_torch_fixtures, snapdiff};

/// The commands whose output is kept, each as text and as JSON.
const COMMANDS: [&str; 4] = ["summary", "trend", "peak", "steps"];

#[test]
fn outputs_on_the_real_fixtures_are_the_kept_ones() {
    let Some(files) = shared_torch_fixtures() else {
        return;
    };
    let bless = std::env::var_os("SNAPDIFF_BLESS").is_some();
    let golden = root().join("tests/data/golden");
    std::fs::create_dir_all(&golden).unwrap();
    let mut changed = Vec::new();
    for file in &files {
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        // Named as users name it, relative to the repository.
        let shown = format!("../shared/fixtures/torch/{stem}.pickle");
        for command in COMMANDS {
            for json in [false, true] {
                let mut args = vec![command, shown.as_str()];
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
                let kept = golden.join(format!(
                    "{stem}.{command}.{}",
                    if json { "json.txt" } else { "txt" }
                ));
                if bless {
                    std::fs::write(&kept, &output).unwrap();
                } else if std::fs::read_to_string(&kept).ok().as_deref() != Some(output.as_str()) {
                    changed.push(kept.display().to_string());
                }
            }
        }
    }
    assert!(
        changed.is_empty(),
        "outputs differ from the kept ones (rerun with SNAPDIFF_BLESS=1 if meant, and review the diff):\n{}",
        changed.join("\n")
    );
}
