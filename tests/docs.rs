//! The docs say what the command does: `docs/cli.md`'s synopsis names every
//! command and every flag that `--help` gives.

use crate::util::{root, snapdiff};

/// Flags every command has, said once above the synopsis.
const EVERYWHERE: [&str; 3] = ["--help", "--color", "--version"];

#[test]
fn the_synopsis_names_every_command_and_flag_of_the_help() {
    let docs = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let synopsis: Vec<&str> = docs
        .split("```text\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .unwrap()
        .lines()
        .collect();
    let help = snapdiff(["--help"]).expect_code(0).stdout();
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 18, "{commands:?}");
    let mut missing = Vec::new();
    for command in commands {
        // A command's lines: those starting with it, and the lines that go on
        // from them (indented).
        let mut lines = Vec::new();
        let mut mine = false;
        for line in &synopsis {
            if let Some(rest) = line.strip_prefix("snapdiff ") {
                mine = rest.split_whitespace().next() == Some(command);
            }
            if mine {
                lines.push(*line);
            }
        }
        if lines.is_empty() {
            missing.push(format!("snapdiff {command}"));
            continue;
        }
        let text = lines.join(" ");
        let flags = snapdiff([command, "--help"]).expect_code(0).stdout();
        // An option's line starts with its forms: `-o, --output <DIR>`.
        for forms in flags
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
            .map(|l| {
                l.split([' ', ','])
                    .filter(|w| !w.is_empty())
                    .map(|w| w.split('=').next().unwrap_or(w))
                    .take_while(|w| is_flag(w))
                    .collect::<Vec<&str>>()
            })
            .filter(|forms| !forms.is_empty() && !forms.iter().any(|f| EVERYWHERE.contains(f)))
        {
            let words: Vec<&str> = text
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .collect();
            if !forms.iter().any(|f| words.contains(f)) {
                missing.push(format!("snapdiff {command} {}", forms.join(", ")));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/cli.md's synopsis lacks:\n{}",
        missing.join("\n")
    );
}

/// Whether `word` is a flag: `-o`, `--max-growth`.
fn is_flag(word: &str) -> bool {
    let name = word.trim_start_matches('-');
    let dashes = word.len() - name.len();
    (dashes == 1 && name.len() == 1 || dashes == 2 && name.len() > 1)
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}
