//! `snapdiff report FILE... -o report.html`: reads and analyses the files,
//! and has `snapdiff_render::html` draw the page.

use anyhow::Context;
use snapdiff_analyze::baseline::{Tolerance, check};
use snapdiff_analyze::peak::DevicePeak;
use snapdiff_analyze::{
    CompareOptions, CulpritRules, LiveMoment, PeakOptions, Site, StackKeys, Timeline, Trend,
    TrendOptions, compare, live_by_site, peak, timeline, trend_trace,
};
use snapdiff_format::{Action, Parts};
use snapdiff_render::flamegraph::Drawn;
use snapdiff_render::html::{BaselinePage, Page, write_page};

use snapdiff_fleet::Rows;

use crate::args::ReportPageArgs;
use crate::exit::Exit;

/// Points of the timeline.
const POINTS: usize = 1500;
/// Sites stacked in the timeline, besides the suspects.
const TIMELINE_SITES: usize = 8;
/// Rows of the peak's and the comparison's site tables.
const TABLE_ROWS: usize = 25;

/// The top-level entry point for `snapdiff report`.
pub(crate) fn run(args: ReportPageArgs) -> anyhow::Result<Exit> {
    if args.fleet {
        return fleet_page(&args);
    }
    // A folder stands for the snapshots in it, as for `trend`.
    let files = &crate::input::snapshot_files(&args.files)?;
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    // Files of several processes: each is judged, and the page shows the
    // one whose memory grows most (leaking first, then those without a
    // verdict), with every process's verdict above it.
    let mut options = TrendOptions::default();
    options.warmup = args.warmup;
    let mut processes = if files.len() > 1 {
        crate::judging::files::trends_of(files, &options)
    } else {
        Vec::new()
    };
    processes.sort_by_key(|p| {
        let t = &p.trend;
        (
            t.suspects.is_empty(),
            t.no_verdict.is_none(),
            std::cmp::Reverse(t.suspected_bytes),
        )
    });
    let several = processes.len() > 1;
    // Two files of one process are a comparison; three and more have a
    // trend (one file's is taken below, from the snapshot read there).
    let shown = (several || files.len() > 2)
        .then(|| processes.first())
        .flatten();
    let mut trend = shown.map(|p| p.trend.clone());
    let mut cmp = None;
    if let ([before, after], false) = (&files[..], several) {
        let read = |p| crate::input::read_parts(p, Parts::WithoutEvents);
        let (a, b) = (read(before)?, read(after)?);
        let mut c = compare(&a, &b, &CompareOptions::default());
        c.groups.truncate(TABLE_ROWS);
        let traced = !a.traces.is_empty() && !b.traces.is_empty();
        crate::input::release([a, b]);
        if c.runs.count == 2 && traced {
            // Two runs' peaks, from their traces, as `compare` gives them.
            let read = |p| crate::input::read_parts(p, Parts::All);
            let (a, b) = (read(before)?, read(after)?);
            c.peaks_from(&a, &b);
            crate::input::release([a, b]);
        }
        cmp = Some(c);
    }
    let (mut live, mut device_peak, mut drawn_timeline) = (None, None, None);
    if let [file] = &files[..] {
        let snap = crate::input::read(file)?;
        // The trend and the peak each replay the trace: side by side.
        let (trace_trend, (live_sites, first_peak)) = rayon::join(
            || trend_trace(&snap, &options).ok(),
            || {
                let live = live_by_site(&snap, &CulpritRules::default(), LiveMoment::End);
                let first_peak = peak(&snap, &PeakOptions::default())
                    .devices
                    .into_iter()
                    .next();
                (live, first_peak)
            },
        );
        trend = trace_trend;
        live = Some(live_sites.map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?);
        if let Some(mut p) = first_peak {
            drawn_timeline = timeline_of(&snap, &p, trend.as_ref());
            p.sites.truncate(TABLE_ROWS);
            device_peak = Some(p);
        }
        crate::input::release([snap]);
    }
    let last = shown.map_or_else(|| files.last().expect("one file at least"), |p| &p.last);
    let flame = match live {
        Some(sites) => Drawn::One(sites),
        None => crate::pictures::sites_of(std::slice::from_ref(last), false, LiveMoment::End)?,
    };
    let empty = matches!(&flame, Drawn::One(sites) if sites.is_empty());
    let last_name = last.display().to_string();
    // Beside a baseline: the run's own, made and checked as `check` does.
    let against = match &args.baseline {
        Some(path) => {
            let before = crate::cmd::check::read_baseline(path)?;
            let (now, _) = crate::judging::files::baseline_of(files.clone(), &options);
            let now = now.context("no snapshot could be read")?;
            let checked = check(&before, &now, Tolerance::default());
            Some((crate::output::shown(path).to_string(), before, now, checked))
        }
        None => None,
    };
    let page = Page {
        files: names,
        trend: trend.as_ref(),
        compare: cmp.as_ref(),
        peak: device_peak.as_ref(),
        timeline: drawn_timeline
            .as_ref()
            .map(|(t, sites)| (t, sites.iter().collect())),
        flame: (!empty).then_some((&flame, last_name.as_str())),
        baseline: against
            .as_ref()
            .map(|(file, before, now, check)| BaselinePage {
                file,
                before,
                now,
                check,
                tolerance: Tolerance::default(),
            }),
        processes: if several {
            processes
                .iter()
                .map(|p| (p.process.as_str(), &p.trend))
                .collect()
        } else {
            Vec::new()
        },
    };
    crate::output::write_output(&args.output, args.force, |out| write_page(&page, out))?;
    Ok(Exit::Clean)
}

/// `report --fleet`: the job judged as `fleet` judges it, drawn as one page.
fn fleet_page(args: &ReportPageArgs) -> anyhow::Result<Exit> {
    let mut trend = TrendOptions::default();
    trend.warmup = args.warmup;
    let threads = crate::args::ThreadArgs { threads: None };
    let (fleet, _) =
        crate::judging::fleet::judge_fleet(&args.files, trend, &threads, Rows::All, None)?;
    let exit = if fleet.unreadable.is_empty() {
        Exit::Clean
    } else {
        Exit::Error
    };
    let names: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    crate::output::write_output(&args.output, args.force, |out| {
        snapdiff_render::html::write_fleet_page(&fleet, &names, out)
    })?;
    Ok(exit)
}

/// Live memory over the trace of the peak's device, for the largest sites
/// at the peak and those that keep growing, with those sites.
fn timeline_of(
    snap: &snapdiff_format::Snapshot,
    p: &DevicePeak,
    trend: Option<&Trend>,
) -> Option<(Timeline, Vec<Site>)> {
    let trace = snap
        .traces
        .iter()
        .find(|t| t.device == p.device && t.events.iter().any(|e| e.action == Action::Alloc))?;
    let mut drawn: Vec<Site> = p
        .sites
        .iter()
        .map(|s| s.site.clone())
        .take(TIMELINE_SITES)
        .collect();
    for suspect in trend.iter().flat_map(|t| &t.suspects) {
        if !drawn.iter().any(|s| s.key == suspect.site.key) {
            drawn.push(suspect.site.clone());
        }
    }
    let keys = StackKeys::new(snap);
    let sites: Vec<_> = drawn.iter().map(|s| s.key).collect();
    Some((timeline(snap, &keys, trace, &sites, POINTS), drawn))
}
