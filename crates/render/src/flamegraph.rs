//! Folded stacks (`outer;...;inner bytes`, Brendan Gregg's format, which
//! inferno, speedscope and others read) and flame graphs drawn from them.

use std::io::Write;

use snapdiff_analyze::{Site, SiteBytes, SiteFrame};

/// The sites a picture draws: of one snapshot, or of two paired by site as
/// `(site, bytes before, bytes after)`.
pub enum Drawn {
    /// Live bytes by site in one snapshot.
    One(Vec<SiteBytes>),
    /// The sites of two snapshots, largest growth first.
    Diff(Vec<(SiteBytes, u64, u64)>),
}

impl Drawn {
    /// The sites of `before` and `after` paired by site, largest growth
    /// first; a site in only one of them has 0 bytes in the other.
    pub fn diff(before: Vec<SiteBytes>, after: Vec<SiteBytes>) -> Drawn {
        let mut earlier: rustc_hash::FxHashMap<_, _> =
            before.into_iter().map(|s| (s.site.key, s)).collect();
        let mut paired: Vec<(SiteBytes, u64, u64)> = Vec::new();
        for s in after {
            let was = earlier.remove(&s.site.key).map_or(0, |b| b.bytes);
            let now = s.bytes;
            paired.push((s, was, now));
        }
        paired.extend(earlier.into_values().map(|s| {
            let was = s.bytes;
            (s, was, 0)
        }));
        let growth = |p: &(SiteBytes, u64, u64)| p.2 as i64 - p.1 as i64;
        paired.sort_by(|a, b| {
            growth(b)
                .cmp(&growth(a))
                .then(a.0.site.key.cmp(&b.0.site.key))
        });
        Drawn::Diff(paired)
    }
}

/// Folded stacks: one line per site, its frames outermost first, then the
/// bytes (or the bytes before and after, for a difference).
pub fn folded_lines(drawn: &Drawn) -> Vec<String> {
    match drawn {
        Drawn::One(sites) => sites
            .iter()
            .filter(|s| s.bytes > 0)
            .map(|s| format!("{} {}", stack(&s.site), s.bytes))
            .collect(),
        Drawn::Diff(pairs) => pairs
            .iter()
            .map(|(s, before, after)| format!("{} {before} {after}", stack(&s.site)))
            .collect(),
    }
}

/// A site's frames, outermost first, `;` between them. The frames that
/// run the program above its own outermost one (a notebook kernel's and
/// IPython's, pytest's, the interpreter's start-up: dozens in a notebook)
/// are folded into one, so that the graph starts where the program does.
fn stack(site: &Site) -> String {
    if site.frames.is_empty() {
        return "(no stack recorded)".to_owned();
    }
    let outermost_first: Vec<&SiteFrame> = site.frames.iter().rev().collect();
    let runner = outermost_first
        .iter()
        .position(|f| is_program(f))
        .unwrap_or(0);
    let mut labels: Vec<String> = Vec::with_capacity(outermost_first.len());
    let folded = if runner >= 2 { runner } else { 0 };
    if folded > 0 {
        labels.push(format!("({folded} frames running the program)"));
    }
    labels.extend(outermost_first[folded..].iter().map(|f| label(f)));
    labels.join(";")
}

/// Whether `frame` is the program's own code (a culprit could be there).
fn is_program(frame: &SiteFrame) -> bool {
    let frame = snapdiff_format::Frame {
        name: frame.name.as_str().into(),
        file: frame.file.as_str().into(),
        line: frame.line,
        extra: Vec::new(),
    };
    snapdiff_analyze::classify(&frame).is_program()
}

/// A frame as the picture names it: `function (folder/file:line)`, C++
/// argument lists left out, `;` (the format's separator) made `:`, and
/// control characters escaped, so that a name from the file can neither
/// start a forged line of folded output nor make the SVG invalid XML.
fn label(frame: &SiteFrame) -> String {
    let file = frame.file.replace('\\', "/");
    // The file's last two parts: enough to tell it, short enough to read.
    let short = match file.rmatch_indices('/').nth(1) {
        Some((i, _)) => &file[i + 1..],
        None => &file,
    };
    let name = snapdiff_analyze::short_name(&frame.name);
    let text = match (short, frame.line) {
        ("" | "??", _) => name.to_owned(),
        (file, 0) => format!("{name} ({file})"),
        (file, line) => format!("{name} ({file}:{line})"),
    };
    snapdiff_format::visible::escaped(&text).replace(';', ":")
}

/// Draws `drawn` as an SVG flame graph.
pub fn write_svg(drawn: &Drawn, title: &str, out: &mut dyn Write) -> std::io::Result<()> {
    draw(
        drawn,
        title,
        inferno::flamegraph::Options::default().min_width,
        out,
    )
}

/// [`write_svg`] for a report page: frames narrower than a pixel are left
/// out, which keeps the graph of a million blocks small.
pub fn write_svg_for_page(drawn: &Drawn, title: &str, out: &mut dyn Write) -> std::io::Result<()> {
    draw(drawn, title, 1.0, out)
}

fn draw(drawn: &Drawn, title: &str, min_width: f64, out: &mut dyn Write) -> std::io::Result<()> {
    let mut options = inferno::flamegraph::Options::default();
    options.min_width = min_width;
    options.title = snapdiff_format::visible::escaped(title).into_owned();
    options.count_name = "bytes".to_owned();
    options.name_type = "Site:".to_owned();
    options.deterministic = true;
    if matches!(drawn, Drawn::Diff(_)) {
        options.subtitle =
            Some("width: bytes in AFTER; red: grew since BEFORE, blue: shrank".to_owned());
    }
    let lines = folded_lines(drawn);
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}
