//! `snapdiff watch` and `capture --watch`: leaks found while the job runs.
//! Real PyTorch jobs on the CPU (an alert before the job's last step,
//! `/metrics` scraped and parsed by Prometheus's own client, a steady job,
//! eight gloo ranks with one leaking, `--fail-fast`), and dumps that
//! arrive in pieces, from the built-in training job.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::torch_capture::{capture_args, leak_line, torch_ready, wait_bounded};
use crate::util::{leaking_training_job, root, tempdir};

const SNAPDIFF: &str = env!("CARGO_BIN_EXE_snapdiff");

/// A running snapdiff whose stderr is collected as it comes (so that the
/// metrics address can be read while it runs).
struct Running {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Running {
    fn start(args: Vec<std::ffi::OsString>) -> Running {
        let mut child = Command::new(SNAPDIFF)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let collected = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                collected
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        Running { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The address `--metrics` said it serves at.
    fn metrics_url(&self) -> String {
        let mut url = None;
        wait_until("the metrics address on stderr", || {
            url = self
                .stderr()
                .lines()
                .find_map(|l| l.strip_prefix("snapdiff: metrics at ").map(str::to_owned));
            url.is_some()
        });
        url.unwrap()
    }

    /// Waits (at most two minutes) for the end: exit code, stdout, stderr.
    fn finish(self) -> (i32, String, String) {
        let stderr = Arc::clone(&self.stderr);
        let output = wait_bounded(self.child);
        std::thread::sleep(Duration::from_millis(100)); // the reader's last bytes
        let err = stderr.lock().unwrap().clone();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            err,
        )
    }
}

/// Waits for `ready()` at most two minutes, failing with `what`.
fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        assert!(Instant::now() < deadline, "no {what} within two minutes");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `/metrics` as Prometheus's own Python client parses it: the content
/// type and the samples.
fn scrape(url: &str) -> Value {
    let output = Command::new("python3")
        .arg(root().join("tests/support/scrape_metrics.py"))
        .arg(url)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "scraping {url}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The samples named `name` whose labels hold `line` (a `file:line`
/// ending), or all of them without `line`.
fn samples<'a>(scraped: &'a Value, name: &str, line: Option<&str>) -> Vec<&'a Value> {
    scraped["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == name)
        .filter(|s| line.is_none_or(|l| s["labels"]["line"].as_str().unwrap().ends_with(l)))
        .collect()
}

/// A job under `capture --watch --metrics --exec EXEC` (a dump every 2
/// steps, polled every 200 ms), writing its step to `dir/progress` and,
/// after its last step (or `--wait-at`'s), waiting for `dir/go`; `job`
/// adds the training script's own flags.
fn watched_job(dir: &Path, exec: &str, job: &[&str]) -> Running {
    let (progress, go) = (dir.join("progress"), dir.join("go"));
    let (progress, go) = (progress.display().to_string(), go.display().to_string());
    let mut script = vec![
        "--device",
        "cpu",
        "--progress",
        &progress,
        "--wait-for",
        &go,
    ];
    script.extend_from_slice(job);
    let flags = [
        "--every",
        "2",
        "--watch",
        "--poll",
        "200ms",
        "--metrics",
        "127.0.0.1:0",
        "--exec",
        exec,
    ];
    Running::start(capture_args(&dir.join("out"), &flags, &script))
}

fn quoted(path: &Path) -> String {
    format!("'{}'", path.display())
}

#[test]
fn capture_watch_alerts_before_the_last_step_names_the_line_and_serves_it_as_metrics() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let (progress, go) = (dir.path().join("progress"), dir.path().join("go"));
    let (alert, alert_step) = (dir.path().join("alert.json"), dir.path().join("alert-step"));
    // The alert records the job's step when it came, and its JSON.
    let exec = format!(
        "cp {p} {s}; cat > {a}.part && mv {a}.part {a}",
        p = quoted(&progress),
        s = quoted(&alert_step),
        a = quoted(&alert)
    );
    let job = watched_job(
        dir.path(),
        &exec,
        // It waits after step 40 until `go`: the alert must come while
        // the job still has 20 steps to run, however busy the machine.
        &[
            "--steps",
            "60",
            "--leak",
            "cache-dict",
            "--leak-from",
            "20",
            "--wait-at",
            "40",
        ],
    );
    let url = job.metrics_url();
    wait_until("alert", || alert.exists());
    let step: u64 = std::fs::read_to_string(&alert_step)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        step <= 40,
        "the alert came at the job's step {step}, not while it waited at step 40 of 60"
    );
    let line = format!("torch_train.py:{}", leak_line("cache-dict"));
    let change: Value = serde_json::from_slice(&std::fs::read(&alert).unwrap()).unwrap();
    assert_eq!(change["event"], "leaks");
    assert!(
        change["line"].as_str().unwrap().ends_with(&line),
        "{change}"
    );
    assert!(change["suspect"]["growth_per_step"].as_f64().unwrap() > 0.0);

    let scraped = scrape(&url);
    assert!(
        scraped["content_type"]
            .as_str()
            .unwrap()
            .starts_with("application/openmetrics-text"),
        "{}",
        scraped["content_type"]
    );
    let suspect = samples(&scraped, "snapdiff_site_suspect", Some(&line));
    assert_eq!(suspect.len(), 1, "{scraped}");
    assert_eq!(suspect[0]["value"], 1.0);
    assert_eq!(suspect[0]["labels"]["function"], "train");
    // A CPU job (capture's recorder): its device is the CPU, not GPU 0.
    assert_eq!(suspect[0]["labels"]["device"], "cpu", "{scraped}");
    let growth = samples(&scraped, "snapdiff_site_growth_bytes_per_step", Some(&line));
    assert!(growth[0]["value"].as_f64().unwrap() > 0.0, "{scraped}");
    assert_eq!(
        samples(&scraped, "snapdiff_suspects", None)[0]["value"],
        1.0
    );

    std::fs::write(&go, "").unwrap();
    let (code, _, stderr) = job.finish();
    assert_eq!(code, 0, "{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" leaks at "))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].ends_with(&format!(
        "{line}, +{}",
        said[0].rsplit(", +").next().unwrap()
    )));
}

#[test]
fn a_steady_job_raises_no_alert_and_its_metrics_say_no_suspect() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let (progress, go) = (dir.path().join("progress"), dir.path().join("go"));
    let alert = dir.path().join("alert");
    let exec = format!("touch {}", quoted(&alert));
    let job = watched_job(dir.path(), &exec, &["--steps", "40"]);
    let url = job.metrics_url();
    wait_until("last step", || {
        std::fs::read_to_string(&progress).is_ok_and(|s| s.trim() == "40")
    });
    // Every dump of the 40 steps read: the 20 step dumps.
    wait_until("the dumps read", || {
        samples(&scrape(&url), "snapdiff_dumps_read", None)[0]["value"]
            .as_f64()
            .unwrap()
            >= 20.0
    });
    let scraped = scrape(&url);
    assert_eq!(
        samples(&scraped, "snapdiff_suspects", None)[0]["value"],
        0.0
    );
    assert!(
        samples(&scraped, "snapdiff_site_suspect", None)
            .iter()
            .all(|s| s["value"] == 0.0),
        "{scraped}"
    );
    assert!(!samples(&scraped, "snapdiff_device_live_bytes", None).is_empty());
    std::fs::write(&go, "").unwrap();
    let (code, _, stderr) = job.finish();
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains(" leaks at "), "{stderr}");
    assert!(!alert.exists(), "--exec ran for a steady job");
}

#[test]
fn watch_of_eight_gloo_ranks_raises_one_alert_naming_the_leaking_rank() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    let alerts = dir.path().join("alerts.jsonl");
    let rendezvous = format!("file://{}", dir.path().join("rendezvous").display());
    // The watch starts first, before the folder exists.
    let exec = format!("cat >> {}", quoted(&alerts));
    let watch = Running::start(
        [
            "watch".as_ref(),
            out.as_os_str(),
            "--poll".as_ref(),
            "300ms".as_ref(),
            "--no-status".as_ref(),
            "--exec".as_ref(),
            exec.as_ref(),
        ]
        .map(std::ffi::OsStr::to_owned)
        .to_vec(),
    );
    // And a second one, as JSON lines: its changes, then the verdict.
    let as_json = Running::start(
        [
            "watch".as_ref(),
            out.as_os_str(),
            "--json".as_ref(),
            "--poll".as_ref(),
            "300ms".as_ref(),
            "--no-status".as_ref(),
        ]
        .map(std::ffi::OsStr::to_owned)
        .to_vec(),
    );
    let job = Running::start(capture_args(
        &out,
        &["--every", "2", "--no-report"],
        &[
            "--ranks",
            "8",
            "--gloo",
            &rendezvous,
            "--steps",
            "30",
            "--leak",
            "cache-dict",
            "--leak-rank",
            "5",
            "--device",
            "cpu",
        ],
    ));
    let (code, _, stderr) = job.finish();
    assert_eq!(code, 0, "{stderr}");
    // The watch ends by itself once every rank wrote its exit dump.
    let (code, stdout, stderr) = watch.finish();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let said: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" leaks at "))
        .collect();
    assert_eq!(said.len(), 1, "{stdout}");
    assert!(said[0].contains("rank5 leaks at"), "{stdout}");
    let sent = std::fs::read_to_string(&alerts).unwrap();
    let sent: Vec<Value> = sent
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["process"], "rank5");
    assert_eq!(sent[0]["rank"], 5);
    assert!(
        stdout.contains("8 ranks read from ") && stdout.contains(": 7 steady, 1 leaking"),
        "{stdout}"
    );
    let (code, stdout, stderr) = as_json.finish();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (verdict, changes) = lines.split_last().unwrap();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0]["event"], "leaks");
    assert_eq!(changes[0]["process"], "rank5");
    assert_eq!(
        (verdict["processes"].as_u64(), verdict["leaking"].as_u64()),
        (Some(8), Some(1))
    );
}

#[test]
fn fail_fast_ends_the_captured_job_at_the_first_suspect() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let (out, progress) = (dir.path().join("out"), dir.path().join("progress"));
    let progress_arg = progress.display().to_string();
    let never = dir.path().join("never").display().to_string();
    let job = Running::start(capture_args(
        &out,
        &[
            "--every",
            "2",
            "--fail-fast",
            "--poll",
            "200ms",
            "--no-report",
        ],
        &[
            "--steps",
            "400",
            "--leak",
            "cache-dict",
            "--leak-from",
            "10",
            "--device",
            "cpu",
            "--step-seconds",
            "0.02",
            "--progress",
            &progress_arg,
            // It waits after step 200 for a file never written (2 minutes at
            // most): --fail-fast must end it by then, however busy the machine.
            "--wait-at",
            "200",
            "--wait-for",
            &never,
        ],
    ));
    let (code, _, stderr) = job.finish();
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("(--fail-fast): the job was ended"),
        "{stderr}"
    );
    let step: u64 = std::fs::read_to_string(&progress)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        step <= 200,
        "the job ran past its wait at step 200 (step {step})"
    );
    // Ended by SIGTERM as a scheduler would: its exit dump was written.
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.contains("-exit")), "{names:?}");
}

#[test]
fn dumps_that_arrive_in_pieces_are_read_once_each_when_whole() {
    let made = tempdir();
    let files = leaking_training_job(made.path(), 40, 4);
    assert!(files.len() >= 10, "{files:?}");
    let dir = tempdir();
    let watched = dir.path().join("job");
    let watch = Running::start(
        [
            "watch".as_ref(),
            watched.as_os_str(),
            "--poll".as_ref(),
            "100ms".as_ref(),
            "--no-status".as_ref(),
        ]
        .map(std::ffi::OsStr::to_owned)
        .to_vec(),
    );
    std::thread::sleep(Duration::from_millis(300)); // the folder is waited for
    std::fs::create_dir(&watched).unwrap();
    for (n, file) in files.iter().enumerate() {
        let bytes = std::fs::read(file).unwrap();
        let to = watched.join(file.file_name().unwrap());
        if n % 2 == 0 {
            // Written in place in two pieces, with polls between them.
            let mut f = std::fs::File::create(&to).unwrap();
            f.write_all(&bytes[..bytes.len() / 2]).unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(450));
            f.write_all(&bytes[bytes.len() / 2..]).unwrap();
        } else {
            // Written under another name and renamed into place.
            let hidden = watched.join(format!(".{n}.tmp"));
            std::fs::write(&hidden, &bytes).unwrap();
            std::fs::rename(&hidden, &to).unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill only sends a signal.
    unsafe { libc::kill(watch.child.id() as i32, libc::SIGINT) };
    let (code, stdout, stderr) = watch.finish();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("1 rank read from {} snapshots", files.len())),
        "{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("could not be read"), "{stdout}");
    assert!(stdout.contains("1 leaking"), "{stdout}");
    // The leak was said as it was found, before the final verdict.
    assert!(stdout.lines().any(|l| l.contains(" leaks at ")), "{stdout}");
    assert!(!stderr.contains("cannot"), "{stderr}");
}

#[test]
fn a_dump_written_in_six_pieces_with_long_pauses_is_read_whole() {
    // A slow file system: each dump written in place in six pieces, each
    // pause longer than two polls. Before, the second failed read gave
    // the dump up for good (all lost, no verdict).
    let made = tempdir();
    let files = leaking_training_job(made.path(), 24, 4);
    let dir = tempdir();
    let watched = dir.path().join("job");
    std::fs::create_dir(&watched).unwrap();
    let watch = Running::start(
        [
            "watch".as_ref(),
            watched.as_os_str(),
            "--poll".as_ref(),
            "50ms".as_ref(),
            "--no-status".as_ref(),
        ]
        .map(std::ffi::OsStr::to_owned)
        .to_vec(),
    );
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let mut f = std::fs::File::create(watched.join(file.file_name().unwrap())).unwrap();
        for piece in bytes.chunks(bytes.len().div_ceil(6)) {
            f.write_all(piece).unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(150));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill only sends a signal.
    unsafe { libc::kill(watch.child.id() as i32, libc::SIGINT) };
    let (code, stdout, stderr) = watch.finish();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("1 rank read from {} snapshots", files.len())),
        "{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("could not be read"), "{stdout}");
    assert!(!stderr.contains("cannot"), "{stderr}");
}

#[test]
fn capture_watch_judges_only_its_own_jobs_dumps() {
    // A Rust job (the built-in trainer, dumping at once from its first
    // steps) captured with --watch into a folder holding an earlier,
    // leaking run: only the new run is judged.
    let dir = tempdir();
    let out = dir.path().join("out");
    leaking_training_job(&out, 40, 4);
    let watched = |leak: &str| {
        crate::util::snapdiff([
            "capture",
            "-o",
            out.to_str().unwrap(),
            "--every",
            "4",
            "--watch",
            "--poll",
            "100ms",
            "--no-report",
            "--",
            SNAPDIFF,
            "train",
            "--steps",
            "40",
            "--leak",
            leak,
            "--log-every",
            "0",
        ])
    };
    let steady = watched("none");
    steady.expect_code(0);
    assert!(
        !steady.stderr().contains(" leaks at "),
        "{}",
        steady.stderr()
    );
    let leaking = watched("keep-activations");
    leaking.expect_code(0);
    let said: Vec<String> = leaking
        .stderr()
        .lines()
        .filter(|l| l.contains(" leaks at "))
        .map(str::to_owned)
        .collect();
    assert_eq!(said.len(), 1, "{}", leaking.stderr());
    assert!(said[0].contains("model.rs:"), "{said:?}");
}

#[test]
fn what_holds_no_dumps_is_refused_or_says_no_verdict_never_an_all_clear() {
    let dir = tempdir();
    let job = dir.path().join("job");
    leaking_training_job(&job, 12, 4);
    let tables = dir.path().join("tables");
    crate::util::snapdiff([
        "export".as_ref(),
        job.as_os_str(),
        "-o".as_ref(),
        tables.as_os_str(),
    ] as [&std::ffi::OsStr; 4])
    .expect_code(0);
    // Site tables would be waited on forever: refused with one line.
    let run =
        crate::util::snapdiff(["watch".as_ref(), tables.as_os_str()] as [&std::ffi::OsStr; 2]);
    run.expect_code(2);
    assert!(
        run.stderr().contains("holds site tables"),
        "{}",
        run.stderr()
    );
    // A folder nothing was written into, interrupted: no verdict, exit 3.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let watch = Running::start(
        [
            "watch".as_ref(),
            empty.as_os_str(),
            "--poll".as_ref(),
            "100ms".as_ref(),
        ]
        .map(std::ffi::OsStr::to_owned)
        .to_vec(),
    );
    // SIGINT is sent once the watch catches it (its bit in SigCgt).
    wait_until("the watch's SIGINT handler", || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", watch.child.id()));
        status.is_ok_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & (1 << (libc::SIGINT - 1)) != 0)
        })
    });
    // SAFETY: kill only sends a signal.
    unsafe { libc::kill(watch.child.id() as i32, libc::SIGINT) };
    let (code, stdout, stderr) = watch.finish();
    assert_eq!(code, 3, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("no dump was read while watching"),
        "{stderr}"
    );
    assert!(!stdout.contains("steady"), "{stdout}");
    // A path that does not exist (yet, or a typo) is waited for, saying so.
    let typo = dir.path().join("typo");
    let mut watch = Running::start(
        ["watch".as_ref(), typo.as_os_str()]
            .map(std::ffi::OsStr::to_owned)
            .to_vec(),
    );
    wait_until("the missing path said", || {
        watch
            .stderr()
            .contains("typo: does not exist yet; waiting for it")
    });
    watch.child.kill().unwrap();
    watch.child.wait().unwrap();
}

/// The process's value of a `/proc/PID/status` field (`Threads`, `VmHWM`
/// in kB).
fn proc_status(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// Lets this test process open a thousand sockets and more.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max.min(8192);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

#[test]
fn a_thousand_idle_connections_and_a_1_gib_request_line_cannot_harm_the_job() {
    if !torch_ready() {
        return;
    }
    raise_open_files_limit();
    let dir = tempdir();
    let progress = dir.path().join("progress");
    let job = watched_job(dir.path(), "true", &["--steps", "40", "--wait-at", "20"]);
    let url = job.metrics_url();
    let addr = url
        .strip_prefix("http://")
        .and_then(|u| u.strip_suffix("/metrics"))
        .unwrap()
        .to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "{url}");
    wait_until("step 20", || {
        std::fs::read_to_string(&progress).is_ok_and(|s| s.trim() == "20")
    });
    let idle: Vec<std::net::TcpStream> = (0..1000)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // A request line that never ends, sent until the server closes it.
    let endless = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            let chunk = vec![b'a'; 1 << 20];
            let mut sent = stream.write(b"GET /").unwrap();
            for _ in 0..1024 {
                match stream.write_all(&chunk) {
                    Ok(()) => sent += chunk.len(),
                    Err(_) => break,
                }
            }
            sent
        })
    };
    let sent = endless.join().unwrap();
    assert!(sent < 1 << 30, "the server read a request line of 1 GiB");
    // The connections cost capture no thread and no memory to speak of
    // (before: a thread each, and the whole request line).
    let capture = job.child.id();
    let threads = proc_status(capture, "Threads");
    assert!(threads < 32, "capture runs {threads} threads");
    let peak_kb = proc_status(capture, "VmHWM");
    assert!(peak_kb < 256 * 1024, "capture's peak memory: {peak_kb} kB");
    // Scrapes are still answered, and the job trains to its end.
    let scraped = scrape(&url);
    assert!(!samples(&scraped, "snapdiff_suspects", None).is_empty());
    std::fs::write(dir.path().join("go"), "").unwrap();
    let (code, _, stderr) = job.finish();
    drop(idle);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read_to_string(&progress).unwrap().trim(), "40");
}

#[test]
fn watch_of_a_folder_used_again_follows_the_new_run_not_the_old_verdict() {
    if !torch_ready() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    // The folder's first run: steady, and ended.
    crate::torch_capture::capture(&out, &["--every", "2", "--no-report"], &["--steps", "20"])
        .expect_code(0);
    let mut watch = Running::start(
        [
            "watch".as_ref(),
            out.as_os_str(),
            "--poll".as_ref(),
            "200ms".as_ref(),
            "--no-status".as_ref(),
        ]
        .map(std::ffi::OsStr::to_owned)
        .to_vec(),
    );
    // Before, the watch ended here at once with the old run's "0 leaking".
    wait_until("the old run passed over", || {
        watch
            .stderr()
            .contains("that had ended before the watch began")
    });
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        watch.child.try_wait().unwrap().is_none(),
        "{}",
        watch.stderr()
    );
    // The new run leaks; the watch follows it to its end.
    crate::torch_capture::capture(
        &out,
        &["--every", "2", "--no-report"],
        &["--steps", "30", "--leak", "cache-dict"],
    )
    .expect_code(0);
    let (code, stdout, stderr) = watch.finish();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let line = format!("torch_train.py:{}", leak_line("cache-dict"));
    assert!(
        stdout.contains(" leaks at ") && stdout.contains(&line),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("1 leaking"), "{stdout}");
}

#[test]
fn two_runs_in_sibling_folders_without_manifests_are_followed_apart() {
    let dir = tempdir();
    let (job, files) = crate::util::sibling_runs(dir.path());
    let alerts = dir.path().join("alerts.jsonl");
    let exec = format!("cat >> {}", quoted(&alerts));
    let watch = Running::start(
        [
            "watch".as_ref(),
            job.as_os_str(),
            "--poll".as_ref(),
            "100ms".as_ref(),
            "--no-status".as_ref(),
            "--exec".as_ref(),
            exec.as_ref(),
        ]
        .map(std::ffi::OsStr::to_owned)
        .to_vec(),
    );
    wait_until("an alert for run A", || {
        std::fs::read_to_string(&alerts).is_ok_and(|a| a.contains("rank1@runA"))
    });
    // SAFETY: kill only sends a signal.
    unsafe { libc::kill(watch.child.id() as i32, libc::SIGINT) };
    let (code, stdout, stderr) = watch.finish();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("2 ranks read from {} snapshots", files.len()))
            && stdout.contains("1 steady, 1 leaking"),
        "{stdout}\n{stderr}"
    );
    let alerts = std::fs::read_to_string(&alerts).unwrap();
    assert!(!alerts.contains("rank1@runB"), "{alerts}");
}

#[test]
fn a_rank_of_one_file_is_judged_by_its_trace_when_the_watch_ends() {
    let dir = tempdir();
    let Some((job, files)) = crate::fleet::ranks_of_one_file(dir.path()) else {
        return crate::util::skip("one-file ranks", "../shared/fixtures/torch is not here");
    };
    let watch = Running::start(
        [
            "watch".as_ref(),
            job.as_os_str(),
            "--json".as_ref(),
            "--poll".as_ref(),
            "100ms".as_ref(),
            "--no-status".as_ref(),
            "--metrics".as_ref(),
            "127.0.0.1:0".as_ref(),
        ]
        .map(std::ffi::OsStr::to_owned)
        .to_vec(),
    );
    let url = watch.metrics_url();
    wait_until("the three dumps read", || {
        samples(&scrape(&url), "snapdiff_dumps_read", None)[0]["value"].as_f64() == Some(3.0)
    });
    // SAFETY: kill only sends a signal.
    unsafe { libc::kill(watch.child.id() as i32, libc::SIGINT) };
    let (code, stdout, stderr) = watch.finish();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let verdict: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(verdict["leaking"], 2, "{stdout}");
    let trend = crate::util::snapdiff(["trend".as_ref(), "--json".as_ref(), files[0].as_os_str()])
        .one_trend();
    assert_eq!(
        verdict["members"][0]["suspected_bytes"],
        trend["suspected_bytes"]
    );
    // Each leaking line was said as it was found.
    let said = stdout
        .lines()
        .filter(|l| l.starts_with(r#"{"event":"leaks""#));
    assert_eq!(said.count(), 2, "{stdout}");
}
