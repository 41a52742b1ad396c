//! The pieces of every text report: tables with snapdiff's look, cells
//! naming a site, sizes, counts, sparklines and durations for people, and a
//! writer that keeps a file's control characters off the terminal.

use std::io::Write;

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};
use snapdiff_analyze::{Culprit, CulpritKind, Site, SiteFrame};
use snapdiff_format::visible;

pub use snapdiff_format::units::{format_delta as delta, format_size as size};

/// A table with snapdiff's look: header underlined, no inner grid.
pub fn table<I: IntoIterator<Item = &'static str>>(header: I) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    // A terminal that reports no columns (some CI runners, `stty cols 0`)
    // would squeeze every cell to one character a line: its width is
    // unknown, so the table is not fitted to it.
    if t.width() == Some(0) {
        t.set_content_arrangement(ContentArrangement::Disabled);
    }
    t
}

/// Adds `rows` to `t`, with the paths in column `col` (the culprit's)
/// shortened from the left (`…/core/interactiveshell.py:3577`) when the
/// terminal is too narrow for them: the end of a path tells files apart,
/// and a path wrapped mid-word reads as two.
pub fn add_rows(t: &mut Table, mut rows: Vec<Vec<String>>, col: usize) {
    if let Some(width) = t.width().filter(|&w| w > 0) {
        let columns = rows.first().map_or(0, Vec::len);
        let header: Vec<usize> = t
            .header()
            .map(|h| h.cell_iter().map(|c| c.content().chars().count()).collect())
            .unwrap_or_default();
        let widest = |c: usize| {
            rows.iter()
                .flat_map(|r| r[c].lines())
                .map(|l| strip_colors(l).chars().count())
                .chain(header.get(c).copied())
                .max()
                .unwrap_or(0)
        };
        // Each column is its text and a space either side; the table adds
        // a border either side.
        let others: usize = (0..columns)
            .filter(|&c| c != col)
            .map(|c| widest(c) + 2)
            .sum();
        // A few characters spare: comfy-table keeps some for itself.
        let room = usize::from(width).saturating_sub(others + 2 + 2 + 4);
        if room >= 24 {
            for row in &mut rows {
                let lines: Vec<String> = row[col].lines().map(|l| shorten_line(l, room)).collect();
                row[col] = lines.join("\n");
            }
        }
    }
    for row in rows {
        t.add_row(row);
    }
}

/// `line` at most `room` characters long if shortening its last word, a
/// path, from the left can do it.
fn shorten_line(line: &str, room: usize) -> String {
    let len = line.chars().count();
    let Some(start) = line.rfind(' ').map(|i| i + 1) else {
        return line.to_owned();
    };
    let path = &line[start..];
    if len <= room || !path.contains('/') {
        return line.to_owned();
    }
    let keep = path.chars().count().saturating_sub(len - room + 1);
    if keep < 8 {
        return line.to_owned();
    }
    let tail: String = path.chars().skip(path.chars().count() - keep).collect();
    format!("{}…{tail}", &line[..start])
}

/// `text` without the colour codes of [`grew`] and [`shrank`], to measure it.
fn strip_colors(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\u{1b}') {
        return text.into();
    }
    let mut out = text.to_owned();
    for code in color_codes() {
        out = out.replace(code.as_str(), "");
    }
    out.into()
}

/// Writes table `t` under its title, a line saying what its rows are.
pub fn write_table(out: &mut dyn Write, title: &str, t: &Table) -> std::io::Result<()> {
    writeln!(out, "{title}")?;
    writeln!(out, "{t}")
}

/// Right-aligns the given columns (numbers read better that way).
pub fn align_right(t: &mut Table, columns: &[usize]) {
    for &c in columns {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
}

/// The folder a table's paths are shown from: the one holding every
/// culprit of the program's own code among `sites` (or the working
/// directory when it holds them all); empty with `--full-paths`.
pub fn paths_base<'a>(sites: impl IntoIterator<Item = &'a Site>, full_paths: bool) -> String {
    if full_paths {
        return String::new();
    }
    let cwd = std::env::current_dir().ok();
    let files = sites
        .into_iter()
        .filter(|s| matches!(s.culprit.kind, CulpritKind::User | CulpritKind::Focus))
        .map(|s| s.culprit.file.as_str())
        .filter(|f| f.starts_with('/') || f.starts_with('\\') || f.get(1..3) == Some(":\\"));
    snapdiff_analyze::common_base(files, cwd.as_deref().and_then(|p| p.to_str()))
}

/// The line under a table saying which folder its paths are shown from.
pub fn paths_note(out: &mut dyn Write, base: &str) -> std::io::Result<()> {
    if base.is_empty() {
        return Ok(());
    }
    let base = visible::escaped(base);
    writeln!(out, "paths from {base} (--full-paths shows them whole)")
}

/// [`site_cell`] for a site some of whose blocks were allocated before
/// recording began: when it has no stack, that is the reason, and the cell
/// says so.
pub fn site_cell_before(site: &Site, before_recording: bool, frames: usize, base: &str) -> String {
    if before_recording && site.culprit.kind == CulpritKind::NoStack {
        "(allocated before recording began)".to_owned()
    } else {
        site_cell(site, frames, base)
    }
}

/// A site for a table cell: its culprit, and `frames` more frames of its
/// stack, with paths shown from `base` (see [`paths_base`]). A row that
/// stands for several stacks with the same culprit line says so.
pub fn site_cell(site: &Site, frames: usize, base: &str) -> String {
    let mut cell = site.culprit.display_from(base);
    if site.culprit.kind == CulpritKind::Fallback {
        cell.push_str("  (no frame of your code)");
    }
    if site.stacks > 1 {
        cell.push_str(&format!(
            "\n  ({} call paths to this line)",
            count(site.stacks.into())
        ));
    }
    let culprit_at = site.frames.iter().position(|f| {
        f.name == site.culprit.name && f.file == site.culprit.file && f.line == site.culprit.line
    });
    // The compiled graph the culprit line called, when the memory was
    // allocated in torch.compile's generated code: its frame as context.
    if let Some(generated) = site.frames[..culprit_at.unwrap_or(0)]
        .iter()
        .find(|f| snapdiff_analyze::is_generated_file(&f.file))
    {
        cell.push_str("\n  in compiled code ");
        cell.push_str(&frame_text(generated, base));
    }
    let below = culprit_at.map_or(0, |i| i + 1);
    for f in site.frames.iter().skip(below).take(frames) {
        cell.push_str("\n  from ");
        cell.push_str(&frame_text(f, base));
    }
    cell
}

/// A frame as `function file:line`, its path shown from `base`.
fn frame_text(f: &SiteFrame, base: &str) -> String {
    Culprit {
        name: f.name.clone(),
        file: f.file.clone(),
        line: f.line,
        kind: CulpritKind::User,
    }
    .display_from(base)
}

/// For rows of whole stacks (`--by stack`), what tells apart rows whose
/// culprit is the same line: for each of `sites`, the first frame (innermost
/// first) where its stack differs from another shown row's with the same
/// culprit, as a line to add to its cell; `None` for a row whose culprit no
/// other row shares.
pub fn where_stacks_differ(sites: &[&Site], base: &str) -> Vec<Option<String>> {
    fn line(s: &Site) -> (CulpritKind, &str, &str, u32) {
        let c = &s.culprit;
        (c.kind, &c.name, &c.file, c.line)
    }
    use std::collections::HashMap;
    // Rows by culprit line; then, for each line shared by several rows, how
    // many of them have each frame at each depth: a row differs from
    // another at depth `i` when fewer than all of them share its frame
    // there. One pass over the frames, however many rows share a line.
    let mut by_line: HashMap<_, Vec<&Site>> = HashMap::new();
    for site in sites {
        by_line.entry(line(site)).or_default().push(site);
    }
    let mut counts: HashMap<_, Vec<HashMap<Option<&SiteFrame>, usize>>> = HashMap::new();
    for (key, rows) in &by_line {
        if rows.len() < 2 {
            continue;
        }
        let depth = rows.iter().map(|r| r.frames.len()).max().unwrap_or(0);
        let mut at_depth: Vec<HashMap<Option<&SiteFrame>, usize>> = vec![HashMap::new(); depth];
        for row in rows {
            for (i, seen) in at_depth.iter_mut().enumerate() {
                *seen.entry(row.frames.get(i)).or_default() += 1;
            }
        }
        counts.insert(*key, at_depth);
    }
    sites
        .iter()
        .map(|site| {
            let line = line(site);
            let at_depth = counts.get(&line)?;
            let rows = by_line[&line].len();
            let at = (0..site.frames.len()).find(|&i| at_depth[i][&site.frames.get(i)] < rows)?;
            Some(format!("\n  via {}", frame_text(&site.frames[at], base)))
        })
        .collect()
}

/// The style of growth: red.
const GROWTH: anstyle::Style = anstyle::AnsiColor::Red.on_default();
/// The style of shrinking: green.
const SHRINK: anstyle::Style = anstyle::AnsiColor::Green.on_default();

/// `text`, red when `color` (memory that grew).
pub fn grew(text: String, color: bool) -> String {
    paint(text, GROWTH, color)
}

/// `text`, green when `color` (memory that shrank).
pub fn shrank(text: String, color: bool) -> String {
    paint(text, SHRINK, color)
}

/// A signed byte difference (`+1.00 MiB`), red when it grew and green
/// when it shrank, if `color`.
pub fn delta_colored(bytes: i64, color: bool) -> String {
    match bytes {
        b if b > 0 => grew(delta(b), color),
        b if b < 0 => shrank(delta(b), color),
        b => delta(b),
    }
}

fn paint(text: String, style: anstyle::Style, color: bool) -> String {
    if color {
        format!("{}{text}{}", style.render(), style.render_reset())
    } else {
        text
    }
}

/// The only escape sequences [`TerminalText::with_colors`] lets through:
/// those [`grew`] and [`shrank`] write.
fn color_codes() -> &'static [String; 3] {
    static CODES: std::sync::OnceLock<[String; 3]> = std::sync::OnceLock::new();
    CODES.get_or_init(|| {
        [
            GROWTH.render().to_string(),
            SHRINK.render().to_string(),
            GROWTH.render_reset().to_string(),
        ]
    })
}

/// A count for people, thousands apart: `1,048,576`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// A series of byte counts as a sparkline of at most 24 characters (long
/// series are shown by the maximum of each stretch).
pub fn sparkline(series: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    const WIDTH: usize = 24;
    let points: Vec<u64> = if series.len() <= WIDTH {
        series.to_vec()
    } else {
        (0..WIDTH)
            .map(|i| {
                let (a, b) = (i * series.len() / WIDTH, (i + 1) * series.len() / WIDTH);
                series[a..b.max(a + 1)].iter().copied().max().unwrap_or(0)
            })
            .collect()
    };
    let (lo, hi) = (
        points.iter().copied().min().unwrap_or(0),
        points.iter().copied().max().unwrap_or(0),
    );
    points
        .iter()
        .map(|&v| {
            if hi == lo {
                BARS[0]
            } else {
                BARS[((v - lo) as f64 / (hi - lo) as f64 * 7.0).round() as usize]
            }
        })
        .collect()
}

/// A duration in seconds for people: `45 s`, `12 min`, `3.5 h`, `2.1 days`.
///
/// An estimate in one unit, rounded; `humantime::format_duration` writes
/// every unit down to nanoseconds (`3h 29m 51s 208ms`), which a
/// time-to-full estimate has no precision for.
pub fn duration(seconds: f64) -> String {
    if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else if seconds < 90.0 {
        format!("{seconds:.0} s")
    } else if seconds < 90.0 * 60.0 {
        format!("{:.0} min", seconds / 60.0)
    } else if seconds < 48.0 * 3600.0 {
        format!("{:.1} h", seconds / 3600.0)
    } else {
        format!("{:.1} days", seconds / 86400.0)
    }
}

/// A writer that passes text on with every character that could change how
/// a terminal shows it escaped (see [`snapdiff_format::visible`]), but
/// newlines and tabs.
///
/// Frame names, file names and markers come from the files users read, and
/// a file can hold `ESC ] 0 ;` (retitle the terminal), colour codes, a
/// carriage return that overwrites a line of the report with fake output,
/// or a bidi control that shows a line reversed. snapdiff's own text has no
/// such characters but newlines, so escaping at the sink covers every
/// table, note and header at once. Input is UTF-8 (Rust strings); one
/// character's bytes may arrive in two writes.
pub struct TerminalText<W: Write> {
    inner: W,
    /// Whether snapdiff's own colour codes pass (see [`TerminalText::with_colors`]).
    colors: bool,
    /// The first bytes of a character that the last write ended within.
    pending: Vec<u8>,
}

impl<W: Write> TerminalText<W> {
    /// A writer escaping every escape sequence, snapdiff's colours too.
    pub fn new(inner: W) -> TerminalText<W> {
        TerminalText {
            inner,
            colors: false,
            pending: Vec::new(),
        }
    }

    /// A writer like [`new`](TerminalText::new) that lets through the
    /// colour codes of [`grew`] and [`shrank`] and their reset, and no other
    /// escape sequence. A file's own text could hold those same codes too:
    /// all they can do is colour text red or green.
    pub fn with_colors(inner: W) -> TerminalText<W> {
        TerminalText {
            colors: true,
            ..TerminalText::new(inner)
        }
    }

    /// Writes `buf`, escaped, but for a character cut off at its end, which
    /// is kept for the next write.
    fn write_escaped(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let mut plain_from = 0;
        let mut i = 0;
        while i < buf.len() {
            let b = buf[i];
            if b == 0x1b
                && self.colors
                && let Some(code) = color_codes()
                    .iter()
                    .find(|code| buf[i..].starts_with(code.as_bytes()))
            {
                i += code.len();
                continue;
            }
            let width = match b {
                0xc0..=0xdf => 2,
                0xe0..=0xef => 3,
                0xf0..=0xf7 => 4,
                _ => 1,
            };
            if i + width > buf.len() {
                self.inner.write_all(&buf[plain_from..i])?;
                self.pending = buf[i..].to_vec();
                return Ok(());
            }
            let (width, escaped) = match std::str::from_utf8(&buf[i..i + width]) {
                Ok(c) => {
                    let c = c
                        .chars()
                        .next()
                        .filter(|&c| c != '\n' && c != '\t' && visible::is_escaped(c));
                    (width, c)
                }
                // Not UTF-8 (never from a Rust string): passed on as it is.
                Err(_) => (1, None),
            };
            if let Some(c) = escaped {
                self.inner.write_all(&buf[plain_from..i])?;
                let mut text = String::new();
                visible::push_char(&mut text, c);
                self.inner.write_all(text.as_bytes())?;
                plain_from = i + width;
            }
            i += width;
        }
        self.inner.write_all(&buf[plain_from..])
    }
}

impl<W: Write> Write for TerminalText<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.pending.is_empty() {
            self.write_escaped(buf)?;
        } else {
            let mut joined = std::mem::take(&mut self.pending);
            joined.extend_from_slice(buf);
            self.write_escaped(&joined)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let cut_off = std::mem::take(&mut self.pending);
        self.inner.write_all(&cut_off)?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(super::count(0), "0");
        assert_eq!(super::count(999), "999");
        assert_eq!(super::count(1000), "1,000");
        assert_eq!(super::count(1_048_576), "1,048,576");
    }

    use super::*;

    fn through_terminal_text(pieces: &[&[u8]]) -> String {
        let mut out = TerminalText::new(Vec::new());
        for p in pieces {
            out.write_all(p).unwrap();
        }
        out.flush().unwrap();
        String::from_utf8(out.inner).unwrap()
    }

    #[test]
    fn rows_with_one_culprit_line_show_where_their_stacks_differ() {
        use snapdiff_analyze::StackKey;
        let frame = |name: &str, line| SiteFrame {
            name: name.to_owned(),
            file: "/w/m.py".to_owned(),
            line,
        };
        let site = |key: u64, frames: Vec<SiteFrame>| Site {
            key: StackKey(key),
            culprit: Culprit {
                name: "f".to_owned(),
                file: "/w/m.py".to_owned(),
                line: 1,
                kind: CulpritKind::User,
            },
            frames,
            stacks: 1,
        };
        let a = site(1, vec![frame("f", 1), frame("g", 10), frame("main", 5)]);
        let b = site(2, vec![frame("f", 1), frame("h", 20), frame("main", 5)]);
        let mut c = site(3, vec![frame("k", 7)]);
        c.culprit.line = 7;
        let via = where_stacks_differ(&[&a, &b, &c], "");
        assert_eq!(via[0].as_deref(), Some("\n  via g  /w/m.py:10"));
        assert_eq!(via[1].as_deref(), Some("\n  via h  /w/m.py:20"));
        assert_eq!(via[2], None, "no other row has its line");
    }

    #[test]
    fn long_paths_are_shortened_from_the_left() {
        let line =
            "from run_code  /root/miniconda3/envs/py3.10/lib/IPython/core/interactiveshell.py:3577";
        let short = shorten_line(line, 50);
        assert_eq!(short.chars().count(), 50);
        assert!(short.starts_with("from run_code  …"), "{short}");
        assert!(short.ends_with("/core/interactiveshell.py:3577"), "{short}");
        assert_eq!(shorten_line(line, 200), line);
        assert_eq!(
            shorten_line("(no stack recorded)", 5),
            "(no stack recorded)"
        );
    }

    #[test]
    fn with_colors_only_snapdiffs_colour_codes_pass() {
        let mut out = TerminalText::with_colors(Vec::new());
        let text = format!(
            "{} \u{1b}]0;x\u{7} \u{1b}[2J",
            grew("+1 B".to_owned(), true)
        );
        out.write_all(text.as_bytes()).unwrap();
        assert_eq!(
            String::from_utf8(out.inner).unwrap(),
            "\u{1b}[31m+1 B\u{1b}[0m \\x1b]0;x\\x07 \\x1b[2J"
        );
        assert_eq!(grew("+1 B".to_owned(), false), "+1 B");
    }

    #[test]
    fn control_characters_are_escaped_and_text_is_kept() {
        let hostile = "a\u{1b}]0;pwned\u{7}b\r\nc\td\u{9b}31m é ü\u{7f} gpt\u{202e}yp.py\u{2028}模";
        let expected =
            "a\\x1b]0;pwned\\x07b\\x0d\nc\td\\x9b31m é ü\\x7f gpt\\u{202e}yp.py\\u{2028}模";
        assert_eq!(through_terminal_text(&[hostile.as_bytes()]), expected);
        // Split at every byte, so a character arrives in two writes.
        let bytes = hostile.as_bytes();
        for cut in 0..bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(through_terminal_text(&[a, b]), expected, "cut at {cut}");
        }
    }
}
