//! What `snapdiff watch` says while a job runs: a line when a site starts
//! or stops leaking, the one-screen status, and the metrics a Prometheus
//! server scrapes (OpenMetrics text).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use snapdiff_analyze::Culprit;
use snapdiff_fleet::{Change, ChangeKind, Fleet, ProcessVerdict};
use snapdiff_format::visible::escaped;
use snapdiff_runs::Run;
use std::sync::atomic::AtomicU64;

use crate::text::{duration, paths_base, size};

/// A change as one line: `step 240: rank13 leaks at train.py:88 (evaluate),
/// +6.1 MiB a step, the device full in about 2.2 h; held by app.cache`.
pub fn change_line(change: &Change, full_paths: bool) -> String {
    let site = &change.suspect.site;
    let base = paths_base([site], full_paths);
    let line = escaped(&site.culprit.display_from(&base)).into_owned();
    let who = escaped(&change.process).into_owned();
    let device = if change.device > 0 {
        format!(" (device {})", change.device)
    } else {
        String::new()
    };
    let when = change
        .step
        .map_or_else(String::new, |s| format!("step {s}: "));
    match change.event {
        ChangeKind::Stopped => format!("{when}{who}{device} no longer leaks at {line}"),
        ChangeKind::Leaks => {
            let mut text = format!("{when}{who}{device} leaks at {line}, {}", rate(change));
            if let Some(s) = change.seconds_to_full.filter(|s| s.is_finite()) {
                text.push_str(&format!(", the device full in about {}", duration(s)));
            }
            if let Some(h) = change.held_by() {
                text.push_str(&format!("; held by {}", escaped(&h.owner)));
            }
            text
        }
    }
}

/// How fast a suspect grows: a step, else a second, else a checkpoint.
fn rate(change: &Change) -> String {
    let s = &change.suspect;
    match (s.growth_per_step, s.growth_per_second) {
        (Some(step), _) => format!("+{} a step", size(step.round() as u64)),
        (None, Some(second)) => format!("+{} a second", size(second.round() as u64)),
        (None, None) => format!("+{} a checkpoint", size(s.growth_per_checkpoint)),
    }
}

/// Leaking lines the status lists before it counts the rest.
const STATUS_LINES: usize = 5;

/// The one-screen status: what is followed, what was read, and the lines
/// leaking now (at most a few; all of them in the final verdict).
pub fn status_text(fleet: &Fleet, waiting: usize, full_paths: bool) -> String {
    let mut text = format!(
        "watching {} process{}: {} dump{} read ({}), {} steady, {} leaking",
        fleet.processes,
        if fleet.processes == 1 { "" } else { "es" },
        fleet.files,
        if fleet.files == 1 { "" } else { "s" },
        size(fleet.bytes),
        fleet.steady,
        fleet.leaking,
    );
    if fleet.too_few_checkpoints > 0 {
        text.push_str(&format!(", {} warming up", fleet.too_few_checkpoints));
    }
    if waiting > 0 {
        text.push_str(&format!("; {waiting} being written"));
    }
    if !fleet.unreadable.is_empty() {
        text.push_str(&format!("; {} unreadable", fleet.unreadable.len()));
    }
    let base = paths_base(fleet.leaks.iter().map(|l| &l.site), full_paths);
    for leak in fleet.leaks.iter().take(STATUS_LINES) {
        let who: Vec<String> = leak
            .members
            .iter()
            .take(4)
            .map(|m| escaped(&m.member.process).into_owned())
            .collect();
        let more = leak.members.len().saturating_sub(who.len());
        text.push_str(&format!(
            "\n  {}: {}{}",
            escaped(&leak.site.culprit.display_from(&base)),
            who.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    if fleet.leaks.len() > STATUS_LINES {
        text.push_str(&format!(
            "\n  and {} more lines",
            fleet.leaks.len() - STATUS_LINES
        ));
    }
    text
}

/// Who a series of the metrics is about.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    run: String,
    process: String,
    rank: String,
    device: String,
}

/// One line of code of one device.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SiteLabels {
    run: String,
    process: String,
    rank: String,
    device: String,
    /// `file:line`.
    line: String,
    function: String,
}

/// A device's largest lines (see [`MetricsInput::top_sites`]).
pub type TopLines<'a> = dyn Fn(&ProcessVerdict, u32) -> Vec<(Culprit, u64)> + 'a;

/// What the metrics are made of: each process's verdict and run, the
/// sites live at its last dump (by line, with their bytes), and the dumps
/// read so far.
pub struct MetricsInput<'a> {
    /// Each process's latest verdict and the run it is followed in.
    pub processes: Vec<(&'a ProcessVerdict, &'a Run)>,
    /// For each process and device, its largest lines at the last dump,
    /// largest first: the culprit (its function, file and line) and the
    /// live bytes there.
    pub top_sites: &'a TopLines<'a>,
    /// Dumps read, and files that could not be read.
    pub dumps: usize,
    /// Files that could not be read.
    pub unreadable: usize,
}

/// The metrics as OpenMetrics text (what Prometheus scrapes at
/// `/metrics`): per device its live and reserved bytes; per line (each
/// suspect, and the largest sites) its live bytes, whether it is a
/// suspect and, for suspects, its growth a step and a second; the number
/// of suspects and of dumps read.
pub fn metrics_text(input: &MetricsInput<'_>) -> String {
    let live = Family::<DeviceLabels, Gauge>::default();
    let reserved = Family::<DeviceLabels, Gauge>::default();
    let site_live = Family::<SiteLabels, Gauge>::default();
    let site_suspect = Family::<SiteLabels, Gauge>::default();
    let per_step = Family::<SiteLabels, Gauge<f64, AtomicU64>>::default();
    let per_second = Family::<SiteLabels, Gauge<f64, AtomicU64>>::default();
    let mut suspects = 0i64;
    for (verdict, run) in &input.processes {
        for d in &verdict.devices {
            let who = DeviceLabels {
                run: run_label(run),
                process: verdict.process.clone(),
                rank: snapdiff_runs::rank_of(&verdict.process)
                    .map_or_else(String::new, |r| r.to_string()),
                // A CPU job's memory (capture's recorder) is no GPU's.
                device: match d.checkpoints.last() {
                    Some(last) if last.recorded_on_cpu => "cpu".to_owned(),
                    _ => d.device.to_string(),
                },
            };
            if let Some(last) = d.checkpoints.last() {
                live.get_or_create(&who).set(gauge(last.allocated_bytes));
                reserved.get_or_create(&who).set(gauge(last.reserved_bytes));
            }
            let site = |c: &Culprit| SiteLabels {
                run: who.run.clone(),
                process: who.process.clone(),
                rank: who.rank.clone(),
                device: who.device.clone(),
                line: format!("{}:{}", c.file, c.line),
                function: c.name.clone(),
            };
            for (culprit, bytes) in (input.top_sites)(verdict, d.device) {
                let labels = site(&culprit);
                site_live.get_or_create(&labels).set(gauge(bytes));
                site_suspect.get_or_create(&labels).set(0);
            }
            for s in &d.trend.suspects {
                suspects += 1;
                let labels = site(&s.site.culprit);
                let bytes = s.series.last().copied().unwrap_or_default();
                site_live.get_or_create(&labels).set(gauge(bytes));
                site_suspect.get_or_create(&labels).set(1);
                if let Some(r) = s.growth_per_step {
                    per_step.get_or_create(&labels).set(r);
                }
                if let Some(r) = s.growth_per_second {
                    per_second.get_or_create(&labels).set(r);
                }
            }
        }
    }
    let mut registry = Registry::with_prefix("snapdiff");
    registry.register(
        "device_live_bytes",
        "Bytes allocated on the device at the process's last dump",
        live,
    );
    registry.register(
        "device_reserved_bytes",
        "Bytes the allocator reserved from the device at the last dump",
        reserved,
    );
    registry.register(
        "site_live_bytes",
        "Live bytes at a line of code at the last dump (suspects and the largest sites)",
        site_live,
    );
    registry.register(
        "site_suspect",
        "1 when the line's memory keeps growing (a suspected leak), else 0",
        site_suspect,
    );
    registry.register(
        "site_growth_bytes_per_step",
        "A suspect's growth per training step",
        per_step,
    );
    registry.register(
        "site_growth_bytes_per_second",
        "A suspect's growth per second",
        per_second,
    );
    let total = Gauge::<i64>::default();
    total.set(suspects);
    registry.register(
        "suspects",
        "Suspected leaks, over every process and device",
        total,
    );
    let dumps = Gauge::<i64>::default();
    dumps.set(gauge(input.dumps as u64));
    registry.register("dumps_read", "Dumps read so far", dumps);
    let unreadable = Gauge::<i64>::default();
    unreadable.set(gauge(input.unreadable as u64));
    registry.register(
        "unreadable_files",
        "Files that could not be read",
        unreadable,
    );
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

fn gauge(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// A run as a label: `812@node3`, `812`, or "" when unknown.
fn run_label(run: &Run) -> String {
    match (run.pid, &run.host) {
        (Some(pid), Some(host)) => format!("{pid}@{host}"),
        (Some(pid), None) => pid.to_string(),
        (None, Some(host)) => host.clone(),
        (None, None) => String::new(),
    }
}
