//! `--exec CMD`: a command run at each new suspect, so that a user wires
//! the alert to a chat, a pager or a job's end.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use snapdiff_fleet::Change;

/// The command, and its runs not yet ended.
pub(crate) struct Alerts {
    command: String,
    running: Vec<Child>,
}

impl Alerts {
    pub(crate) fn new(command: String) -> Alerts {
        Alerts {
            command,
            running: Vec::new(),
        }
    }

    /// Starts the command for `change` (`line`: the change as text): the
    /// verdict in SNAPDIFF_* variables and as JSON on its stdin. The
    /// command runs beside the watch, never holding it up.
    pub(crate) fn run(&mut self, change: &Change, line: &str) {
        self.reap();
        let suspect = &change.suspect;
        let number = |x: Option<f64>| x.map_or_else(String::new, |x| format!("{x:.0}"));
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&self.command)
            .env("SNAPDIFF_EVENT", "leaks")
            .env("SNAPDIFF_PROCESS", &change.process)
            .env(
                "SNAPDIFF_RANK",
                change.rank.map_or_else(String::new, |r| r.to_string()),
            )
            .env("SNAPDIFF_DEVICE", change.device.to_string())
            .env(
                "SNAPDIFF_STEP",
                change.step.map_or_else(String::new, |s| s.to_string()),
            )
            .env("SNAPDIFF_LINE", &change.line)
            .env("SNAPDIFF_GROWTH_BYTES", suspect.growth_bytes.to_string())
            .env("SNAPDIFF_GROWTH_PER_STEP", number(suspect.growth_per_step))
            .env(
                "SNAPDIFF_GROWTH_PER_SECOND",
                number(suspect.growth_per_second),
            )
            .env("SNAPDIFF_SECONDS_TO_FULL", number(change.seconds_to_full))
            .env("SNAPDIFF_MESSAGE", line)
            .stdin(Stdio::piped());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!("snapdiff: cannot run --exec command: {e}");
                return;
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            let json = serde_json::to_vec(change).unwrap_or_default();
            // A thread, so that a command that never reads its stdin
            // cannot block the watch on a full pipe.
            std::thread::spawn(move || {
                let _ = stdin.write_all(&json);
                let _ = stdin.write_all(b"\n");
            });
        }
        self.running.push(child);
    }

    /// Collects the runs that ended, saying those that failed.
    pub(crate) fn reap(&mut self) {
        self.running.retain_mut(|child| match child.try_wait() {
            Ok(Some(status)) => {
                if !status.success() {
                    eprintln!("snapdiff: --exec command ended with {status}");
                }
                false
            }
            Ok(None) => true,
            Err(_) => false,
        });
    }

    /// Waits at most `limit` for the runs not yet ended (the watch is
    /// ending): an alert sent at the last moment still arrives.
    pub(crate) fn wait(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        while !self.running.is_empty() && Instant::now() < until {
            self.reap();
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.running.is_empty() {
            eprintln!(
                "snapdiff: {} --exec command{} still running, left to run on",
                self.running.len(),
                if self.running.len() == 1 {
                    " is"
                } else {
                    "s are"
                }
            );
        }
    }
}
