//! `--exec CMD`: a command run at each new suspect, so that a user wires
//! the alert to a chat, a pager or a job's end.
//!
//! At most [`MAX_RUNNING`] runs at once, one a line of code: a leak in code
//! every rank shares makes thousands of suspects in one poll, and a command
//! each at once would take the node's processes. Other alerts wait, one a
//! line (a newer alert for a line replaces the one waiting, and the run is
//! told how many it stands for), and start as earlier runs end.

use std::collections::VecDeque;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use snapdiff_fleet::Change;
use snapdiff_format::visible::escaped;

/// Runs of the command at once.
pub(crate) const MAX_RUNNING: usize = 8;

/// One alert: the line of code it is about, the verdict in `SNAPDIFF_*`
/// variables (text from files escaped) and as JSON for the command's stdin,
/// and how many alerts it stands for.
struct Alert {
    line: String,
    vars: Vec<(&'static str, String)>,
    json: Vec<u8>,
    alerts: usize,
}

impl Alert {
    fn of(change: &Change, text: &str) -> Alert {
        let suspect = &change.suspect;
        let number = |x: Option<f64>| x.map_or_else(String::new, |x| format!("{x:.0}"));
        let optional = |x: Option<u64>| x.map_or_else(String::new, |x| x.to_string());
        Alert {
            line: change.line.clone(),
            vars: vec![
                ("SNAPDIFF_EVENT", "leaks".to_owned()),
                ("SNAPDIFF_PROCESS", escaped(&change.process).into_owned()),
                ("SNAPDIFF_RANK", optional(change.rank.map(u64::from))),
                ("SNAPDIFF_DEVICE", change.device.to_string()),
                ("SNAPDIFF_STEP", optional(change.step)),
                ("SNAPDIFF_LINE", escaped(&change.line).into_owned()),
                ("SNAPDIFF_GROWTH_BYTES", suspect.growth_bytes.to_string()),
                ("SNAPDIFF_GROWTH_PER_STEP", number(suspect.growth_per_step)),
                (
                    "SNAPDIFF_GROWTH_PER_SECOND",
                    number(suspect.growth_per_second),
                ),
                ("SNAPDIFF_SECONDS_TO_FULL", number(change.seconds_to_full)),
                ("SNAPDIFF_MESSAGE", escaped(text).into_owned()),
            ],
            json: serde_json::to_vec(change).unwrap_or_default(),
            alerts: 1,
        }
    }
}

/// The command, its runs not yet ended, and the alerts waiting for one.
pub(crate) struct Alerts {
    command: String,
    /// Each run's line and process.
    running: Vec<(String, Child)>,
    waiting: VecDeque<Alert>,
    /// Whether the bound was said on stderr.
    said_bound: bool,
}

impl Alerts {
    pub(crate) fn new(command: String) -> Alerts {
        Alerts {
            command,
            running: Vec::new(),
            waiting: VecDeque::new(),
            said_bound: false,
        }
    }

    /// Runs the command for `change` (`text`: the change as printed), or
    /// has it wait for a run to end when [`MAX_RUNNING`] are running.
    pub(crate) fn run(&mut self, change: &Change, text: &str) {
        self.send(Alert::of(change, text));
    }

    fn send(&mut self, alert: Alert) {
        self.reap();
        if let Some(waiting) = self.waiting.iter_mut().find(|w| w.line == alert.line) {
            let alerts = waiting.alerts + alert.alerts;
            *waiting = Alert { alerts, ..alert };
            return;
        }
        self.waiting.push_back(alert);
        self.start_waiting();
    }

    /// Starts waiting alerts, oldest first, while fewer than
    /// [`MAX_RUNNING`] run, each once no run for its line is left.
    fn start_waiting(&mut self) {
        while self.running.len() < MAX_RUNNING {
            let running = &self.running;
            let Some(next) = self
                .waiting
                .iter()
                .position(|w| running.iter().all(|(line, _)| *line != w.line))
            else {
                return;
            };
            let alert = self.waiting.remove(next).expect("a waiting alert");
            self.spawn(alert);
        }
        if !self.waiting.is_empty() && !self.said_bound {
            self.said_bound = true;
            eprintln!(
                "snapdiff: --exec alerts wait for earlier runs: at most {MAX_RUNNING} at once, \
                 one a line of code, whose newest alert waits for the others"
            );
        }
    }

    /// Starts the command for `alert`, with its variables and
    /// `SNAPDIFF_ALERTS` (how many alerts it stands for), its JSON on
    /// stdin. The command runs beside the watch, never holding it up.
    fn spawn(&mut self, alert: Alert) {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&self.command)
            .envs(alert.vars)
            .env("SNAPDIFF_ALERTS", alert.alerts.to_string())
            .stdin(Stdio::piped());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!("snapdiff: cannot run --exec command: {e}");
                return;
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            let json = alert.json;
            // A thread, so that a command that never reads its stdin
            // cannot block the watch on a full pipe.
            std::thread::spawn(move || {
                let _ = stdin.write_all(&json);
                let _ = stdin.write_all(b"\n");
            });
        }
        self.running.push((alert.line, child));
    }

    /// Collects the runs that ended, saying those that failed, and starts
    /// alerts waiting for them.
    pub(crate) fn reap(&mut self) {
        self.running
            .retain_mut(|(_, child)| match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("snapdiff: --exec command ended with {status}");
                    }
                    false
                }
                Ok(None) => true,
                Err(_) => false,
            });
        self.start_waiting();
    }

    /// Waits at most `limit` for the runs not yet ended and the alerts
    /// waiting (the watch is ending): an alert sent at the last moment
    /// still arrives.
    pub(crate) fn wait(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        while !(self.running.is_empty() && self.waiting.is_empty()) && Instant::now() < until {
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
        if !self.waiting.is_empty() {
            let alerts: usize = self.waiting.iter().map(|w| w.alerts).sum();
            eprintln!(
                "snapdiff: {alerts} alert{} not sent: --exec commands still running",
                if alerts == 1 { " was" } else { "s were" }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(line: &str, rank: usize) -> Alert {
        Alert {
            line: line.to_owned(),
            vars: vec![
                ("SNAPDIFF_LINE", line.to_owned()),
                ("SNAPDIFF_RANK", rank.to_string()),
            ],
            json: b"{}".to_vec(),
            alerts: 1,
        }
    }

    #[test]
    fn two_thousand_suspects_run_at_most_the_bound_at_once_one_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        // Each run notes its start and end around a slow middle.
        let mut alerts = Alerts::new(format!(
            "echo \"start $SNAPDIFF_LINE $SNAPDIFF_ALERTS\" >> '{0}'; sleep 0.2; echo end >> '{0}'",
            log.display()
        ));
        // A leak in code every rank shares, then ten lines of one rank each.
        for rank in 0..2000 {
            alerts.send(alert("shared.py:1", rank));
        }
        for line in 0..10 {
            alerts.send(alert(&format!("own.py:{line}"), 0));
        }
        alerts.wait(Duration::from_secs(60));
        let text = std::fs::read_to_string(&log).unwrap();
        let (mut now, mut most) = (0i32, 0);
        let mut alerted = std::collections::BTreeMap::new();
        for entry in text.lines() {
            if let Some(rest) = entry.strip_prefix("start ") {
                now += 1;
                most = most.max(now);
                let (line, count) = rest.rsplit_once(' ').unwrap();
                *alerted.entry(line.to_owned()).or_insert(0) += count.parse::<usize>().unwrap();
            } else {
                now -= 1;
            }
        }
        assert!(most <= MAX_RUNNING as i32, "{most} runs at once");
        assert_eq!(now, 0, "{text}");
        // Every alert is accounted for, and each line was alerted.
        assert_eq!(alerted.remove("shared.py:1"), Some(2000));
        assert_eq!(alerted.len(), 10);
        assert!(alerted.values().all(|&n| n == 1), "{alerted:?}");
        // The shared line's 2,000 alerts took few runs.
        let runs = text
            .lines()
            .filter(|l| l.starts_with("start shared.py:1 "))
            .count();
        assert!(runs <= 2, "{runs} runs for one line");
    }
}
