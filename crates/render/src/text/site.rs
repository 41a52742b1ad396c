//! Cells naming a site: its culprit line, the frames under it, and paths
//! shown from the folder that holds the program's code.

use std::io::Write;

use snapdiff_analyze::{Culprit, CulpritKind, Recorded, Site, SiteFrame};
use snapdiff_format::visible;

use super::human::count;

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
        .filter(|s| {
            matches!(
                s.culprit.kind,
                CulpritKind::User | CulpritKind::Focus | CulpritKind::Forward
            )
        })
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
    if let Some(recorded) = recorded_text(&site.recorded) {
        cell.push_str("\n  ");
        cell.push_str(&recorded);
    }
    let below = culprit_at.map_or(0, |i| i + 1);
    for f in site.frames.iter().skip(below).take(frames) {
        cell.push_str("\n  from ");
        cell.push_str(&frame_text(f, base));
    }
    cell
}

/// What PyTorch recorded with a site's allocations, as one line
/// (`label "kv_cache", compiled region "Torch-Compiled Region: 0/1"`);
/// `None` when nothing was. The texts come from the file, so they are
/// quoted and escaped.
fn recorded_text(recorded: &Recorded) -> Option<String> {
    let parts: Vec<String> = [
        ("label", &recorded.labels),
        ("compiled region", &recorded.compiled_regions),
        ("metadata", &recorded.metadata),
    ]
    .into_iter()
    .flat_map(|(what, values)| {
        values
            .iter()
            .map(move |v| format!("{what} {}", visible::quoted(v)))
    })
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
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

#[cfg(test)]
mod tests {
    use super::*;

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
            recorded: Default::default(),
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
}
