//! The HTML report: one self-contained page (data, script and styles
//! inside; nothing fetched, so it opens from disk on an air-gapped cluster).
//!
//! The page's data is kept small on huge files by whoever fills [`Page`]:
//! the timeline has a bounded number of points and a few sites, tables hold
//! the top sites, and the flame graph drops frames narrower than a pixel.
//! The page draws it with a few hundred lines of plain JavaScript and SVG
//! (`report.js`): no charting library to vendor, audit or update.

use std::io::{self, Write};

use serde_json::{Value, json};
use snapdiff_analyze::baseline::{Baseline, Check, Tolerance, side_by_side};
use snapdiff_analyze::peak::DevicePeak;
use snapdiff_analyze::{Comparison, Site, Timeline, Trend};

use snapdiff_format::visible::escaped;

use crate::flamegraph::{Drawn, write_svg_for_page};

const PAGE: &str = include_str!("page.html");
const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");

/// What a report page shows; every part is optional.
#[derive(Default)]
pub struct Page<'a> {
    /// The files the report is of, as given.
    pub files: Vec<String>,
    /// The verdict: suspects with their evidence (of the process shown,
    /// when the files come from several).
    pub trend: Option<&'a Trend>,
    /// When the files come from several processes: each one's name and
    /// verdict, the one `trend` is of first.
    pub processes: Vec<(&'a str, &'a Trend)>,
    /// The comparison of two files.
    pub compare: Option<&'a Comparison>,
    /// The peak of one file's first device.
    pub peak: Option<&'a DevicePeak>,
    /// Live memory over the trace, with the sites its rows are of, in order.
    pub timeline: Option<(&'a Timeline, Vec<&'a Site>)>,
    /// Live memory by stack, with the file it is of.
    pub flame: Option<(&'a Drawn, &'a str)>,
    /// The run checked against a baseline file (`report --baseline`).
    pub baseline: Option<BaselinePage<'a>>,
}

/// A run beside its baseline: the peak by site and by category, before
/// and after, and what the check said.
pub struct BaselinePage<'a> {
    /// The baseline file, as given.
    pub file: &'a str,
    /// The baseline it holds.
    pub before: &'a Baseline,
    /// The run's, made as `snapdiff baseline` makes it.
    pub now: &'a Baseline,
    /// The check of `now` against `before`.
    pub check: &'a Check,
    /// The tolerance it was checked at.
    pub tolerance: Tolerance,
}

/// Sites of the baseline's table on the page: the largest changes.
const BASELINE_ROWS: usize = 25;

/// The page's data for `b`.
fn baseline_data(b: &BaselinePage<'_>) -> io::Result<Value> {
    let pairs = side_by_side(b.before, b.now);
    // Each device's peak by category, before and after, largest first.
    let mut categories: std::collections::BTreeMap<(u32, String), (u64, u64)> =
        std::collections::BTreeMap::new();
    for p in &pairs {
        let category = to_value(p.category)?
            .as_str()
            .unwrap_or("unknown")
            .to_owned();
        let e = categories.entry((p.device, category)).or_default();
        e.0 += p.before;
        e.1 += p.now;
    }
    let mut categories: Vec<Value> = categories
        .into_iter()
        .map(|((device, category), (before, now))| {
            json!({ "device": device, "category": category, "before": before, "now": now })
        })
        .collect();
    categories.sort_by_key(|c| std::cmp::Reverse(c["now"].as_u64().max(c["before"].as_u64())));
    let devices: Vec<Value> = b
        .now
        .devices
        .iter()
        .map(|n| {
            let before = b.before.devices.iter().find(|d| d.device == n.device);
            json!({
                "device": n.device,
                "allocated_before": before.map(|d| d.peak_allocated),
                "allocated_now": n.peak_allocated,
                "reserved_before": before.map(|d| d.peak_reserved),
                "reserved_now": n.peak_reserved,
            })
        })
        .collect();
    let moved = pairs.iter().filter(|p| !p.was.is_empty()).count();
    Ok(json!({
        "file": b.file,
        "tolerance": { "share": b.tolerance.share, "bytes": b.tolerance.bytes },
        "over": b.check.over,
        "devices": devices,
        "categories": categories,
        "moved": moved,
        "more_sites": pairs.len().saturating_sub(BASELINE_ROWS),
        "sites": pairs.into_iter().take(BASELINE_ROWS).collect::<Vec<_>>(),
    }))
}

/// `value` as JSON for the page's data.
fn to_value(value: impl serde::Serialize) -> io::Result<Value> {
    serde_json::to_value(value).map_err(io::Error::other)
}

/// Writes `page` as one HTML document.
pub fn write_page(page: &Page<'_>, out: &mut dyn Write) -> io::Result<()> {
    let mut data = json!({ "files": page.files });
    if let Some(cmp) = page.compare {
        data["compare"] = to_value(cmp)?;
    }
    data["trend"] = to_value(page.trend)?;
    // Growth outside the recorded memory, as the text report words it.
    if let Some(outside) = page.trend.and_then(|t| t.outside.as_ref()) {
        data["outside_lines"] = to_value(crate::outside::lines(outside, false))?;
    }
    if !page.processes.is_empty() {
        let rows: Vec<Value> = page
            .processes
            .iter()
            .map(|(name, t)| {
                json!({
                    "name": name,
                    "checkpoints": t.checkpoints,
                    "no_verdict": t.no_verdict.is_some(),
                    "suspects": t.suspects.len(),
                    "suspected_bytes": t.suspected_bytes,
                    "top": t.suspects.first(),
                })
            })
            .collect();
        data["processes"] = Value::Array(rows);
    }
    if let Some(peak) = page.peak {
        data["peak"] = to_value(peak)?;
    }
    if let Some(b) = &page.baseline {
        data["baseline"] = baseline_data(b)?;
    }
    if let Some((t, drawn)) = &page.timeline {
        let is_suspect = |site: &Site| {
            page.trend
                .is_some_and(|t| t.suspects.iter().any(|s| s.site.key == site.key))
        };
        let described: Vec<Value> = drawn
            .iter()
            .zip(&t.sites)
            .map(|(site, (_, values))| {
                let stack: Vec<String> = site
                    .frames
                    .iter()
                    .map(|f| {
                        let (name, file) = (escaped(&f.name), escaped(&f.file));
                        format!("{name}  {file}:{}", f.line)
                    })
                    .collect();
                json!({
                    "label": site.culprit.display(),
                    "stack": stack.join("\n"),
                    "suspect": is_suspect(site),
                    "values": values,
                })
            })
            .collect();
        data["timeline"] = json!({
            "device": t.device,
            "events": t.events,
            // Whether the trace records times: the axis is event order
            // either way, and the page says which it has.
            "timed": t.time_us.iter().any(Option::is_some),
            "allocated": t.allocated,
            "sites": described,
        });
    }
    let flame = match page.flame {
        Some((drawn, file)) => flamegraph(drawn, file)?,
        None => String::new(),
    };
    let data = script_json(&serde_json::to_string(&data).map_err(io::Error::other)?);
    let files = escape(&page.files.join(", "));
    let html = fill(PAGE, |name| match name {
        "TITLE" => "snapdiff report",
        "STYLE" => STYLE,
        "FILES" => files.as_str(),
        "FLAMEGRAPH" => flame.as_str(),
        "SCRIPT" => SCRIPT,
        "DATA" => data.as_str(),
        _ => unreachable!("page.html has no placeholder {name}"),
    });
    out.write_all(html.as_bytes())
}

/// Writes the page of a whole job (`snapdiff report --fleet`): the
/// verdict, the leaking lines and imbalanced ranks, a heat map of every
/// rank's live memory over its checkpoints, and each rank's own report a
/// click away (or at `#rank=N`). `files`: the paths it was read from.
#[cfg(feature = "fleet")]
pub fn write_fleet_page(
    fleet: &snapdiff_fleet::Fleet,
    files: &[String],
    out: &mut dyn Write,
) -> io::Result<()> {
    let ranks: Vec<Value> = fleet
        .members
        .iter()
        .map(|m| {
            json!({
                "process": m.member.process,
                "rank": m.member.rank,
                "device": m.member.device,
                "verdict": m.verdict,
                "steps": m.checkpoints.iter().map(|c| c.step).collect::<Vec<_>>(),
                "allocated": m.checkpoints.iter().map(|c| c.allocated_bytes).collect::<Vec<_>>(),
                "suspected_bytes": m.suspected_bytes,
                "suspects": m.suspects,
                "notes": m.notes,
            })
        })
        .collect();
    let data = json!({
        "files": files,
        "fleet": {
            "processes": fleet.processes,
            "steady": fleet.steady,
            "leaking": fleet.leaking,
            "too_few_checkpoints": fleet.too_few_checkpoints,
            "files": fleet.files,
            "bytes": fleet.bytes,
            "unreadable": fleet.unreadable,
            "leaks": fleet.leaks,
            "imbalance": fleet.imbalance,
            "notes": fleet.notes,
            "ranks": ranks,
        },
    });
    let data = script_json(&serde_json::to_string(&data).map_err(io::Error::other)?);
    let files = escape(&files.join(", "));
    let html = fill(PAGE, |name| match name {
        "TITLE" => "snapdiff fleet report",
        "STYLE" => STYLE,
        "FILES" => files.as_str(),
        "FLAMEGRAPH" => "",
        "SCRIPT" => SCRIPT,
        "DATA" => data.as_str(),
        _ => unreachable!("page.html has no placeholder {name}"),
    });
    out.write_all(html.as_bytes())
}

/// `template` with each `{{NAME}}` replaced by `value(NAME)`, in one pass:
/// a value is never searched for placeholders, so text from a file (a file
/// name holding `{{DATA}}`) stays text. Each value must already be escaped
/// for where it lands.
fn fill<'a>(template: &str, value: impl Fn(&str) -> &'a str) -> String {
    let mut out = String::with_capacity(template.len() + 4096);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start + 2..].find("}}") else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(value(&rest[start + 2..start + 2 + len]));
        rest = &rest[start + 2 + len + 2..];
    }
    out.push_str(rest);
    out
}

/// JSON text made safe inside a `<script>` element: `<`, `>` and `&`
/// written as `\u003c`, `\u003e` and `\u0026` (so neither `</script>` nor
/// `<!--` can end or change the element), and U+2028 and U+2029 as escapes
/// too (line ends to older JavaScript). These characters occur only inside
/// JSON strings, where the escapes mean the same characters.
fn script_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + 64);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The flame graph of live memory in `file` when it was taken, as a frame
/// of the page holding the SVG as a `data:` address: its own document, so
/// that inferno's script for zooming and searching runs as it does in a
/// file of its own, and nothing is fetched.
fn flamegraph(drawn: &Drawn, file: &str) -> io::Result<String> {
    if matches!(drawn, Drawn::One(sites) if sites.is_empty()) {
        return Ok(String::new());
    }
    let mut svg = Vec::new();
    write_svg_for_page(drawn, &format!("Live memory by stack: {file}"), &mut svg)?;
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
        escape(file),
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
