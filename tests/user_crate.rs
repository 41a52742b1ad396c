//! The library as a user's crate gets it: a crate outside this workspace
//! (`tests/user-crate`), built with cargo's defaults and so without the
//! workspace's forced frame pointers, records the right stacks and names
//! the leaking line.

use std::path::Path;
use std::process::Command;

use crate::util::tempdir;

/// The line of `tests/user-crate/src/main.rs` that holds `marker`.
fn line_in_program(marker: &str) -> usize {
    let source = std::fs::read_to_string("tests/user-crate/src/main.rs").unwrap();
    source.lines().position(|l| l.contains(marker)).unwrap() + 1
}

#[test]
fn a_users_crate_without_frame_pointers_finds_the_leaking_line() {
    let repo = std::env::current_dir().unwrap();
    let dir = tempdir();
    let crate_dir = dir.path();
    for file in ["Cargo.toml", "src/main.rs"] {
        let to = crate_dir.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        let text = std::fs::read_to_string(Path::new("tests/user-crate").join(file)).unwrap();
        std::fs::write(&to, text.replace("REPO", repo.to_str().unwrap())).unwrap();
    }
    // The workspace's versions, so that nothing new is resolved.
    std::fs::copy("Cargo.lock", crate_dir.join("Cargo.lock")).unwrap();
    // Built outside the repository, as a user's crate is: no
    // .cargo/config.toml of ours applies, whatever RUSTFLAGS cargo test had.
    let out = Command::new(env!("CARGO"))
        .args(["run", "--quiet"])
        .current_dir(crate_dir)
        .env("CARGO_TARGET_DIR", repo.join("target/user-crate-test"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    // The program's own build has no frame pointers: the runtime unwinds
    // from the call-frame tables.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    assert_eq!(lines[0], "stacks by Cfi", "{stdout}");
    // Four steps after warm-up, one 64 KiB buffer each.
    assert_eq!(lines[1], "leaked 262144 in 4 blocks", "{stdout}");
    let leak = line_in_program("// KEEPS A BUFFER");
    let main_rs = crate_dir.join("src/main.rs");
    assert_eq!(
        lines[2],
        format!(
            "culprit snapdiff_user_crate::train_step {}:{leak}",
            main_rs.display()
        ),
        "{stdout}"
    );
    // The whole stack, from the leaking line out to the program's start.
    let frames: Vec<&str> = lines[3..]
        .iter()
        .map(|l| l.trim_start_matches("frame "))
        .collect();
    assert!(
        frames[0].starts_with("snapdiff_user_crate::train_step "),
        "{stdout}"
    );
    let call = line_in_program("train_step(&a, &mut kept);");
    assert_eq!(
        frames[1],
        format!("snapdiff_user_crate::main {}:{call}", main_rs.display()),
        "{stdout}"
    );
    assert!(
        frames.iter().any(|f| f.starts_with("std::rt::lang_start ")),
        "{stdout}"
    );

    // A leak test needs no Parquet: the library builds without Arrow, which
    // only the command (its `fleet` and `export`) turns on.
    let tree = Command::new(env!("CARGO"))
        .args(["tree", "-e", "normal", "--prefix", "none"])
        .current_dir(crate_dir)
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&tree.stdout);
    assert!(tree.contains("snapdiff-render"), "{tree}");
    for heavy in ["arrow", "parquet", "snapdiff-fleet"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(heavy)),
            "the library pulls in {heavy}:\n{tree}"
        );
    }
}
