//! Tables with snapdiff's look, fitted to the terminal.

use std::io::Write;

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};

use super::color::strip_colors;
use crate::TextOptions;

/// A table with snapdiff's look: header underlined, no inner grid; fitted
/// to the terminal, else to `options.width`, else as wide as its text.
pub fn table<I: IntoIterator<Item = &'static str>>(options: &TextOptions, header: I) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    // Not a terminal, or one that reports no columns (some CI runners,
    // `stty cols 0`), which would squeeze every cell to a character a line.
    if t.width().is_none_or(|w| w == 0) {
        match options.width {
            Some(width) => {
                t.set_width(width);
            }
            None => {
                t.set_content_arrangement(ContentArrangement::Disabled);
            }
        }
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
        let room = usize::from(width).saturating_sub(others + 2 + 2 + 6);
        if room >= 8 {
            for row in &mut rows {
                let lines: Vec<String> = row[col].lines().map(|l| fit_line(l, room)).collect();
                row[col] = lines.join("\n");
            }
        }
    }
    for row in rows {
        t.add_row(row);
    }
}

/// `line` in `room` characters where cutting can do it: its last word (a
/// path) cut from the left; else, for `NAME  PATH` (a culprit, a frame),
/// the path on a line of its own, indented as the line is, and each of the
/// two cut from the left (`from …::a_long_test_name`), so that nothing
/// wraps in the middle of a word.
fn fit_line(line: &str, room: usize) -> String {
    let fitted = shorten_line(line, room);
    let text = line.trim_start();
    let indent = &line[..line.len() - text.len()];
    match text.rsplit_once("  ") {
        Some((name, path)) if fitted.chars().count() > room => format!(
            "{}\n{}",
            shorten_line(&format!("{indent}{name}"), room),
            shorten_line(&format!("{indent}  {path}"), room)
        ),
        _ => fitted,
    }
}

/// `line` at most `room` characters long if shortening its last word, a
/// path or a qualified name (`/` or `:` in it), from the left can do it.
fn shorten_line(line: &str, room: usize) -> String {
    let len = line.chars().count();
    // A line of one word (a long function name) is that word.
    let start = line.rfind(' ').map_or(0, |i| i + 1);
    let path = &line[start..];
    if len <= room || !path.contains(['/', ':']) {
        return line.to_owned();
    }
    let keep = path.chars().count().saturating_sub(len - room + 1);
    if keep < 8 {
        return line.to_owned();
    }
    let tail: String = path.chars().skip(path.chars().count() - keep).collect();
    format!("{}…{tail}", &line[..start])
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
