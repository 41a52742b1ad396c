//! `snapdiff report` pages, opened in a real browser (Debian's `chromium`,
//! headless, from disk, with no network): the script runs without a console
//! message, the page shows what `--json` says, and a screenshot is saved
//! under `target/report-screenshots/` for a person to look at.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{leaking_training_job, root, snapdiff, tempdir};

/// Headless chromium, or `None` (with a line saying why) when it is not
/// installed and SNAPDIFF_REQUIRE_CHROMIUM is not set.
pub(crate) fn chromium() -> Option<&'static str> {
    let found = Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("SNAPDIFF_REQUIRE_CHROMIUM").is_none(),
            "chromium is missing, and SNAPDIFF_REQUIRE_CHROMIUM says it must be there (apt-get install chromium)"
        );
        crate::util::skip("chromium", "apt-get install chromium");
        return None;
    }
    Some("chromium")
}

/// Opens `page` in headless chromium: its DOM after the script ran, and
/// every console message. Saves a screenshot as `shot`.
pub(crate) fn open(browser: &str, page: &Path, shot: &str) -> (String, Vec<String>) {
    open_url(browser, &format!("file://{}", page.display()), shot)
}

/// [`open`] of a page's address, which may carry a fragment (`#rank=7`).
fn open_url(browser: &str, url: &str, shot: &str) -> (String, Vec<String>) {
    let url = url.to_owned();
    let flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
    ];
    let out = Command::new(browser)
        .args(flags)
        .args(["--enable-logging=stderr", "--v=0", "--dump-dom", &url])
        .output()
        .unwrap();
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect();
    let shots = root().join("target/report-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let status = Command::new(browser)
        .args(flags)
        .arg(format!("--screenshot={}", shots.join(shot).display()))
        .args(["--window-size=1280,2200", &url])
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

/// The value of attribute `name` of the first element of class `class`.
fn attribute(dom: &str, class: &str, name: &str) -> Option<String> {
    let at = dom.find(&format!("class=\"{class}\""))?;
    let tag_start = dom[..at].rfind('<')?;
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>')?];
    let value = tag.split(&format!("{name}=\"")).nth(1)?;
    Some(value[..value.find('"')?].to_owned())
}

fn report(files: &[&Path], out: &Path) -> String {
    let mut args: Vec<&std::ffi::OsStr> = vec!["report".as_ref()];
    args.extend(files.iter().map(|f| f.as_os_str()));
    args.extend(["-o".as_ref(), out.as_os_str()]);
    snapdiff(args).expect_code(0);
    let html = std::fs::read_to_string(out).unwrap();
    // Self-contained: nothing to fetch.
    for remote in [
        "src=\"http",
        "href=\"http",
        "url(http",
        "src=\"//",
        "import(",
    ] {
        assert!(!html.contains(remote), "{}: {remote}", out.display());
    }
    html
}

#[test]
fn reports_open_offline_in_a_browser_and_show_what_json_says() {
    let dir = tempdir();
    let files = leaking_training_job(&dir.path().join("job"), 40, 10);
    let last = files.last().unwrap();
    let Some(browser) = chromium() else {
        // Without a browser, the pages are still written and self-contained.
        report(&[last], &dir.path().join("one.html"));
        return;
    };

    // One trace: verdict, timeline, peak and flame graph.
    let page = dir.path().join("trace.html");
    report(&[last], &page);
    let (dom, console) = open(browser, &page, "trace.png");
    assert!(console.is_empty(), "console: {console:?}");
    assert!(dom.contains("data-ready=\"yes\""), "the script ran");
    let trend = snapdiff(["trend".as_ref(), last.as_os_str(), "--json".as_ref()]).one_trend();
    let suspect = &trend["suspects"][0];
    assert_eq!(
        attribute(&dom, "suspect", "data-growth").as_deref(),
        Some(suspect["growth_bytes"].to_string().as_str()),
        "the suspect's growth, as trend --json has it"
    );
    let model_rs = root().join("crates/train/src/model.rs");
    let line = std::fs::read_to_string(&model_rs)
        .unwrap()
        .lines()
        .position(|l| l.contains("leaks with --leak keep-activations"))
        .unwrap()
        + 1;
    assert!(
        dom.contains(&format!("forward  {}:{line}", model_rs.display())),
        "the leaking line is named"
    );
    assert!(dom.contains("id=\"timeline\""), "the timeline is drawn");
    assert!(
        dom.contains("class=\"site suspect\""),
        "the growing site is marked in it"
    );
    assert!(
        dom.contains("class=\"peak-site\""),
        "the peak's sites are listed"
    );
    assert!(
        dom.contains("<iframe class=\"flame\""),
        "the flame graph is there"
    );

    // Two files: their comparison, as compare --json has it.
    let page = dir.path().join("compare.html");
    report(&[&files[0], last], &page);
    let (dom, console) = open(browser, &page, "compare.png");
    assert!(console.is_empty(), "console: {console:?}");
    let compare = snapdiff([
        "compare".as_ref(),
        files[0].as_os_str(),
        last.as_os_str(),
        "--json".as_ref(),
    ])
    .json();
    assert_eq!(
        attribute(&dom, "group", "data-delta").as_deref(),
        Some(compare["groups"][0]["delta_bytes"].to_string().as_str())
    );

    // Several snapshots: their trend.
    let page = dir.path().join("snapshots.html");
    let all: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    report(&all, &page);
    let (dom, console) = open(browser, &page, "snapshots.png");
    assert!(console.is_empty(), "console: {console:?}");
    assert!(dom.contains("1 site keeps growing"), "{dom}");
}

#[test]
fn a_file_cannot_run_script_in_or_blank_a_report() {
    // A file name holding the page's data placeholder and a tag, frames
    // named `<!--<script>`, `</script>`, NUL, ESC and U+2028.
    let dir = tempdir();
    let (a, b) = crate::hostile::forging_snapshots(dir.path());
    let page = dir.path().join("hostile.html");
    report(&[&a, &b], &page);
    let html = std::fs::read_to_string(&page).unwrap();
    let data = html
        .split("<script id=\"data\" type=\"application/json\">")
        .nth(1)
        .unwrap();
    let data = &data[..data.find("</script>").unwrap()];
    for raw in ["<", ">", "&", "\u{2028}"] {
        assert!(!data.contains(raw), "{raw:?} raw in the page's data");
    }
    // The flame graph's SVG is XML a strict parser reads.
    let svg_base64 = html.split("data:image/svg+xml;base64,").nth(1).unwrap();
    let svg_base64 = &svg_base64[..svg_base64.find('"').unwrap()];
    crate::util::python_script(
        "import base64, sys, xml.dom.minidom\n\
         xml.dom.minidom.parseString(base64.b64decode(sys.argv[1]))",
        &[svg_base64],
    );
    let Some(browser) = chromium() else { return };
    let (dom, console) = open(browser, &page, "hostile.png");
    assert!(console.is_empty(), "console: {console:?}");
    assert!(
        dom.contains("data-ready=\"yes\""),
        "the script ran on its data"
    );
    assert!(
        dom.contains("<title>snapdiff report</title>"),
        "no script of the file's ran"
    );
    assert!(!dom.contains("<img"), "the file's tag stayed text");
    assert!(
        dom.contains("{{DATA}}&lt;img src=x"),
        "the file is named as it is"
    );
    assert!(dom.contains("class=\"group\""), "the comparison is shown");
}

#[test]
fn a_folder_of_several_processes_shows_each_verdict_and_the_leaking_one() {
    // A steady process and a leaking one captured into one folder, as the
    // ranks of a job are; the steady one's files come first by name.
    let dir = tempdir();
    let folder = dir.path().join("ranks");
    snapdiff([
        "capture",
        "-o",
        folder.to_str().unwrap(),
        "--every",
        "10",
        "--no-report",
        "--",
        env!("CARGO_BIN_EXE_snapdiff"),
        "train",
        "--steps",
        "40",
        "--log-every",
        "0",
    ])
    .expect_code(0);
    let steady: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "snap"))
        .collect();
    let mut leaking = leaking_training_job(&folder, 40, 10);
    leaking.retain(|p| !steady.contains(p));
    let trend = snapdiff(
        ["trend".as_ref(), "--json".as_ref()]
            .into_iter()
            .chain(leaking.iter().map(|p| p.as_os_str())),
    )
    .one_trend();
    let page = dir.path().join("ranks.html");
    let html = report(&[&folder], &page);
    assert!(
        html.contains("\"processes\":["),
        "each process's verdict is in the page"
    );
    let Some(browser) = chromium() else { return };
    let (dom, console) = open(browser, &page, "processes.png");
    assert!(console.is_empty(), "console: {console:?}");
    assert!(
        dom.contains("1 of 2 processes keep growing"),
        "never one process's all-clear for a folder of several: {dom}"
    );
    assert_eq!(dom.matches("class=\"process leak\"").count(), 1);
    assert_eq!(dom.matches("class=\"process\"").count(), 1);
    assert_eq!(
        attribute(&dom, "suspect", "data-growth").as_deref(),
        Some(trend["suspects"][0]["growth_bytes"].to_string().as_str()),
        "the leaking process is the one shown, as trend --json of its files has it"
    );
}

#[test]
fn too_few_checkpoints_are_no_verdict_in_the_page_and_the_text() {
    let dir = tempdir();
    let files = leaking_training_job(&dir.path().join("job"), 30, 10);
    assert_eq!(files.len(), 3, "{files:?}");
    let all: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let mut args = vec!["trend".as_ref()];
    args.extend(all.iter().map(|p| p.as_os_str()));
    let text = snapdiff(&args).expect_code(0).stdout();
    assert!(text.contains("no verdict"), "{text}");
    args.push("--json".as_ref());
    assert!(snapdiff(&args).one_trend()["no_verdict"].is_string());
    let page = dir.path().join("few.html");
    report(&all, &page);
    let Some(browser) = chromium() else { return };
    let (dom, console) = open(browser, &page, "few.png");
    assert!(console.is_empty(), "console: {console:?}");
    let headline = dom.split("id=\"verdict-text\">").nth(1).unwrap_or_default();
    let headline = &headline[..headline.find('<').unwrap_or(0)];
    assert_eq!(headline, "No verdict: see the notes below.");
    assert!(dom.contains("class=\"verdict none\""), "not green: {dom}");
}

/// A trace that records no times (as torch_npu writes them, here the demo
/// job's dump as a pickle with its times taken out by CPython) is drawn
/// in the order of its events, and the page says nothing is per second.
#[test]
fn a_trace_without_times_is_drawn_by_event_order_and_says_so() {
    let dir = tempdir();
    let files = leaking_training_job(&dir.path().join("job"), 40, 10);
    let pickle = dir.path().join("timed.pickle");
    let timeless = dir.path().join("timeless.pickle");
    snapdiff([
        "convert".as_ref(),
        files.last().unwrap().as_os_str(),
        pickle.as_os_str(),
    ])
    .expect_code(0);
    let strip = "import pickle, sys\n\
        s = pickle.load(open(sys.argv[1], 'rb'))\n\
        [e.pop('time_us', None) for t in s['device_traces'] for e in t]\n\
        pickle.dump(s, open(sys.argv[2], 'wb'), protocol=4)\n";
    let Ok(status) = std::process::Command::new("python3")
        .args(["-c", strip])
        .arg(&pickle)
        .arg(&timeless)
        .status()
    else {
        crate::util::skip("python3", "apt-get install python3");
        return;
    };
    assert!(status.success());
    let page = dir.path().join("timeless.html");
    let html = report(&[&timeless], &page);
    assert!(html.contains("\"timed\":false"), "the page knows");
    let Some(browser) = chromium() else { return };
    let (dom, console) = open(browser, &page, "timeless.png");
    assert!(console.is_empty(), "console: {console:?}");
    assert!(dom.contains("id=\"timeline\""), "the timeline is drawn");
    assert!(
        dom.contains("in the order of the trace's events: it records no times"),
        "{dom}"
    );
}

#[test]
fn pinned_host_growth_is_said_in_the_page_not_an_all_clear() {
    let dir = tempdir();
    let folder = crate::util::fixture("torch-format").join("pinned-cache");
    let page = dir.path().join("pinned.html");
    report(&[folder.as_path()], &page);
    let Some(browser) = chromium() else { return };
    let (dom, console) = open(browser, &page, "pinned.png");
    assert!(console.is_empty(), "console: {console:?}");
    let text_of = |id: &str| {
        let at = dom
            .split(&format!("id=\"{id}\">"))
            .nth(1)
            .unwrap_or_default();
        at[..at.find('<').unwrap_or(0)].to_owned()
    };
    assert_eq!(
        text_of("verdict-text"),
        "No site's device memory keeps growing, but pinned host memory does (below)."
    );
    assert_eq!(
        text_of("pinned-host-text"),
        "Pinned host memory keeps growing (host RAM, not the device's): 43.0 MiB → 167 MiB \
         after warm-up, rising at 9 of 9 checkpoints; in use 12.0 MiB → 12.0 MiB; cache \
         155 MiB in 25 free blocks of 5 sizes. The growth is free blocks the cache keeps, not \
         memory in use."
    );
}

#[test]
fn a_fleet_page_of_1024_ranks_shows_the_verdict_a_heat_map_and_each_ranks_report() {
    let Some(source) = crate::util::shared_torch("cs336-medium-128-inference.pickle") else {
        return;
    };
    let dir = tempdir();
    let job = dir.path().join("job");
    let truth = crate::fleet_job::make_fleet(&source, 1024, 10, &job);
    let page = dir.path().join("fleet.html");
    let run = snapdiff([
        "report".as_ref(),
        "--fleet".as_ref(),
        job.as_os_str(),
        "-o".as_ref(),
        page.as_os_str(),
    ] as [&std::ffi::OsStr; 5]);
    run.expect_code(0);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.len() < 1 << 20,
        "a page of {} bytes for 1,024 ranks",
        html.len()
    );
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    let Some(browser) = chromium() else { return };
    // Opened at a leaking rank's own report.
    let leaking: Vec<u32> = truth
        .leaks
        .iter()
        .flat_map(|l| l.ranks.iter().map(|(r, _)| *r))
        .collect();
    let shown = leaking[0];
    let url = format!("file://{}#rank={shown}", page.display());
    let (dom, console) = open_url(browser, &url, "fleet.png");
    assert!(console.is_empty(), "console: {console:?}");
    assert!(
        dom.contains(&format!("1024 ranks read from {} snapshots", truth.files))
            && dom.contains(&format!("{} leaking", leaking.len())),
        "{}",
        &dom[..dom.len().min(3000)]
    );
    for leak in &truth.leaks {
        let ranks: Vec<String> = leak.ranks.iter().map(|(r, _)| r.to_string()).collect();
        assert!(
            dom.contains(&format!(
                "class=\"fleet-leak\" data-ranks=\"{}\"",
                ranks.join(",")
            )),
            "leaking ranks {ranks:?} at {}",
            leak.culprit.display()
        );
    }
    assert_eq!(
        attribute(&dom, "fleet-imbalance", "data-ranks").as_deref(),
        Some("0"),
        "rank 0's imbalance"
    );
    assert_eq!(
        attribute(&dom, "heatmap", "data-rows").as_deref(),
        Some("1024")
    );
    assert_eq!(
        attribute(&dom, "heatmap", "data-columns").as_deref(),
        Some("10")
    );
    let panel = dom
        .split("id=\"rank-panel\"")
        .nth(1)
        .expect("the rank's report");
    assert!(
        panel.starts_with(&format!(" data-process=\"rank{shown}\"")),
        "{}",
        &panel[..panel.len().min(500)]
    );
    let culprit = &truth
        .leaks
        .iter()
        .find(|l| l.ranks.iter().any(|(r, _)| *r == shown))
        .unwrap()
        .culprit;
    assert!(
        panel.contains("class=\"suspect\"") && panel.contains(&culprit.name),
        "rank {shown}'s report names its leak, {}",
        culprit.display()
    );
}
