//! `snapdiff report`: one self-contained HTML page (data, script and styles
//! inside; nothing fetched, so it opens from disk on an air-gapped cluster).
//!
//! The data is aggregated here so the page stays small on huge files: the
//! timeline has at most [`POINTS`] points and a few sites, tables hold the
//! top sites, and the flame graph drops frames narrower than a pixel. The
//! page draws it with a few hundred lines of plain JavaScript and SVG
//! (`report.js`): no charting library to vendor, audit or update.

use std::path::PathBuf;

use serde_json::{Value, json};
use snapdiff_analyze::peak::{PeakOptions, peak};
use snapdiff_analyze::profile::{Moment, live_by_site};
use snapdiff_analyze::timeline::timeline;
use snapdiff_analyze::{CompareOptions, StackKeys, compare};
use snapdiff_analyze::{CulpritRules, TrendOptions, trend_trace};
use snapdiff_format::{Action, Parts};

use crate::pictures::{Drawn, folded};

/// Points of the timeline.
const POINTS: usize = 1500;
/// Sites stacked in the timeline, besides the suspects.
const TIMELINE_SITES: usize = 8;
/// Rows of the peak's and the comparison's site tables.
const TABLE_ROWS: usize = 25;

const PAGE: &str = include_str!("page.html");
const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");

/// The report of `files`, as one HTML page. One file is read once, for its
/// trend, timeline, peak and flame graph alike.
pub(crate) fn page(files: &[PathBuf]) -> anyhow::Result<String> {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut data = json!({ "files": names });
    // Two files are a comparison; three and more have a trend (one file's
    // is taken below, from the snapshot read there).
    let mut trend = (files.len() > 2)
        .then(|| crate::cmd::trend::trend_of(files))
        .flatten();
    let mut live = None;
    if let [before, after] = files {
        let read = |p| crate::render::read_parts(p, Parts::WithoutEvents);
        let (a, b) = (read(before)?, read(after)?);
        let mut cmp = compare(&a, &b, &CompareOptions::default());
        cmp.groups.truncate(TABLE_ROWS);
        data["compare"] = serde_json::to_value(&cmp)?;
    }
    if let [file] = files {
        let snap = crate::render::read(file)?;
        trend = trend_trace(&snap, &TrendOptions::default()).ok();
        let trend = trend.as_ref();
        live = Some(
            live_by_site(&snap, &CulpritRules::default(), Moment::End)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?,
        );
        let found = peak(&snap, &PeakOptions::default());
        if let Some(mut p) = found.devices.into_iter().next() {
            let keys = StackKeys::new(&snap);
            // The sites drawn: the largest at the peak, and those that keep
            // growing; both come described.
            let mut drawn: Vec<&snapdiff_analyze::Site> = p
                .sites
                .iter()
                .map(|s| &s.site)
                .take(TIMELINE_SITES)
                .collect();
            for suspect in trend.iter().flat_map(|t| &t.suspects) {
                if !drawn.iter().any(|s| s.key == suspect.site.key) {
                    drawn.push(&suspect.site);
                }
            }
            let is_suspect =
                |key| trend.is_some_and(|t| t.suspects.iter().any(|s| s.site.key == key));
            let trace = snap.traces.iter().find(|t| {
                t.device == p.device && t.events.iter().any(|e| e.action == Action::Alloc)
            });
            if let Some(trace) = trace {
                let sites: Vec<_> = drawn.iter().map(|s| s.key).collect();
                let t = timeline(&snap, &keys, trace, &sites, POINTS);
                let described: Vec<Value> = drawn
                    .iter()
                    .zip(&t.sites)
                    .map(|(site, (_, values))| {
                        json!({
                            "label": site.culprit.display(),
                            "stack": site.frames.iter().map(|f| format!("{}  {}:{}", f.name, f.file, f.line)).collect::<Vec<_>>().join("\n"),
                            "suspect": is_suspect(site.key),
                            "values": values,
                        })
                    })
                    .collect();
                data["timeline"] = json!({
                    "device": t.device,
                    "events": t.events,
                    "allocated": t.allocated,
                    "sites": described,
                });
            }
            p.sites.truncate(TABLE_ROWS);
            data["peak"] = serde_json::to_value(&p)?;
        }
        crate::render::release([snap]);
    }
    data["trend"] = serde_json::to_value(&trend)?;
    let last = files.last().expect("one file at least");
    let drawn = match live {
        Some(sites) => Drawn::One(sites),
        None => crate::pictures::sites_of(std::slice::from_ref(last), false, Moment::End)?,
    };
    let flame = flamegraph(&drawn, last)?;
    let title = "snapdiff report";
    Ok(PAGE
        .replace("{{TITLE}}", title)
        .replace("{{STYLE}}", STYLE)
        .replace("{{FILES}}", &escape(&names.join(", ")))
        .replace("{{FLAMEGRAPH}}", &flame)
        .replace("{{SCRIPT}}", SCRIPT)
        // Inside <script>, only `</` could end the element early.
        .replace(
            "{{DATA}}",
            &serde_json::to_string(&data)?.replace("</", "<\\/"),
        ))
}

/// The flame graph of live memory in `file` when it was taken, as a frame
/// of the page holding the SVG as a `data:` address: its own document, so
/// that inferno's script for zooming and searching runs as it does in a
/// file of its own, and nothing is fetched.
fn flamegraph(drawn: &Drawn, file: &std::path::Path) -> anyhow::Result<String> {
    if matches!(drawn, Drawn::One(sites) if sites.is_empty()) {
        return Ok(String::new());
    }
    let mut svg = Vec::new();
    folded::flamegraph_for_page(
        drawn,
        &format!("Live memory by stack: {}", file.display()),
        &mut svg,
    )?;
    use base64::Engine;
    // The frame as tall as the graph (inferno gives its height in pixels).
    let text = String::from_utf8_lossy(&svg[..svg.len().min(4096)]);
    let height = text
        .split_once("<svg")
        .and_then(|(_, tag)| tag.split_once(" height=\""))
        .and_then(|(_, rest)| rest.split('"').next()?.parse::<u32>().ok())
        .unwrap_or(640);
    Ok(format!(
        "<h2>Flame graph of live memory ({})</h2>\n<iframe class=\"flame\" title=\"flame graph\" \
         style=\"height: {}px\" src=\"data:image/svg+xml;base64,{}\"></iframe>",
        escape(&file.display().to_string()),
        height + 4,
        base64::engine::general_purpose::STANDARD.encode(&svg)
    ))
}

/// `text` with HTML's special characters escaped, for text and attributes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
