//! The `--json` reports, schema 2 (documented in docs/cli.md).
//!
//! A report of thousands of sites would repeat each site's stack, tens to
//! hundreds of frames of which most are shared with other sites. Schema 2
//! writes each distinct frame once in a top-level `frames` table and each
//! distinct stack once in `stacks` (lists of frame indices); a site gives
//! the index of its stack. Lists of sites are cut to `--top N` (0: all),
//! with the sums of what was cut beside them.
//!
//! The analyses serialize their results as they are; this module rewrites
//! the serialized tree, so every command's report gets the same shape.

use std::io::{self, Write};

use rustc_hash::FxHashMap;
use serde::Serialize;
use serde_json::{Map, Value};

/// The version of the `--json` layout.
pub const SCHEMA: u64 = 2;

/// Arrays of sites, by the key they appear under in the analyses' output.
const SITE_LISTS: &[&str] = &["groups", "top_sites", "suspects", "sites"];

/// Writes `report` as schema-2 JSON to `out`, its site lists cut to `top`
/// entries (0: all).
pub fn write<T: Serialize>(out: &mut dyn Write, report: &T, top: usize) -> io::Result<()> {
    let value = tabled(serde_json::to_value(report).map_err(io::Error::other)?, top);
    serde_json::to_writer_pretty(&mut *out, &value)?;
    writeln!(out)
}

/// [`write()`] on one line: for a stream of JSON lines (`watch --json`).
pub fn write_line<T: Serialize>(out: &mut dyn Write, report: &T, top: usize) -> io::Result<()> {
    let value = tabled(serde_json::to_value(report).map_err(io::Error::other)?, top);
    serde_json::to_writer(&mut *out, &value)?;
    writeln!(out)
}

/// [`write()`] for a report with one long list, such as a fleet's
/// `members`: `report` serializes with `list` empty, and the list's
/// `items` are rewritten and written one at a time, so that memory holds
/// one item's tree and not the whole report's (a fleet of 10,000 ranks
/// was a tree of 200 MB for 44 MB of text). The output is the same JSON.
pub fn write_with_list<T: Serialize, I: Serialize>(
    out: &mut dyn Write,
    report: &T,
    list: &str,
    items: impl IntoIterator<Item = I>,
    top: usize,
) -> io::Result<()> {
    let mut items = items.into_iter();
    let mut tables = Tables::default();
    let Value::Object(fields) = serde_json::to_value(report).map_err(io::Error::other)? else {
        return Err(io::Error::other("a report with a list is an object"));
    };
    let mut first = true;
    let mut field = |out: &mut dyn Write, name: &str| -> io::Result<()> {
        write!(
            out,
            "{}\n  {}: ",
            if first { "{" } else { "," },
            Value::from(name)
        )?;
        first = false;
        Ok(())
    };
    field(out, "schema")?;
    write!(out, "{SCHEMA}")?;
    field(out, "version")?;
    write!(out, "{}", Value::from(env!("CARGO_PKG_VERSION")))?;
    for (name, value) in fields {
        if name == list {
            field(out, &name)?;
            let mut empty = true;
            for item in items.by_ref() {
                let item =
                    tables.rewrite(serde_json::to_value(item).map_err(io::Error::other)?, top);
                write!(out, "{}\n    ", if empty { "[" } else { "," })?;
                write_indented(out, &item, 2)?;
                empty = false;
            }
            write!(out, "{}", if empty { "[]" } else { "\n  ]" })?;
            continue;
        }
        // Each field rewritten as it is written, in order, as `tabled`
        // rewrites them: the same frame numbers, a cut list's sums after it.
        let one = Value::Object(Map::from_iter([(name, value)]));
        if let Value::Object(rewritten) = tables.rewrite(one, top) {
            for (name, value) in rewritten {
                field(out, &name)?;
                write_indented(out, &value, 1)?;
            }
        }
    }
    let frames = Value::Array(std::mem::take(&mut tables.frames));
    field(out, "frames")?;
    write_indented(out, &frames, 1)?;
    let stacks = Value::Array(tables.stacks.into_iter().map(Value::from).collect());
    field(out, "stacks")?;
    write_indented(out, &stacks, 1)?;
    writeln!(out, "\n}}")
}

/// Writes `value` pretty-printed, its lines after the first indented
/// `level` times, as it would be at that depth of a pretty-printed tree.
fn write_indented(out: &mut dyn Write, value: &Value, level: usize) -> io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    let indent = "  ".repeat(level);
    for (i, line) in text.lines().enumerate() {
        if i > 0 {
            write!(out, "\n{indent}")?;
        }
        out.write_all(line.as_bytes())?;
    }
    Ok(())
}

/// `report` in schema 2: `schema`, then its own fields with site lists cut
/// and stacks replaced by indices, then the `frames` and `stacks` tables.
fn tabled(report: Value, top: usize) -> Value {
    let mut tables = Tables::default();
    let mut out = Map::new();
    out.insert("schema".to_owned(), SCHEMA.into());
    out.insert("version".to_owned(), env!("CARGO_PKG_VERSION").into());
    match tables.rewrite(report, top) {
        Value::Object(fields) => out.extend(fields),
        other => {
            out.insert("report".to_owned(), other);
        }
    }
    out.insert("frames".to_owned(), Value::Array(tables.frames));
    out.insert(
        "stacks".to_owned(),
        Value::Array(tables.stacks.into_iter().map(Value::from).collect()),
    );
    Value::Object(out)
}

/// The frames and stacks met so far, each once.
#[derive(Default)]
struct Tables {
    frames: Vec<Value>,
    frame_ids: FxHashMap<String, usize>,
    stacks: Vec<Vec<usize>>,
    stack_ids: FxHashMap<Vec<usize>, usize>,
}

impl Tables {
    fn rewrite(&mut self, value: Value, top: usize) -> Value {
        match value {
            Value::Object(fields) => {
                let site = is_site(&fields);
                let mut out = Map::new();
                for (name, v) in fields {
                    match v {
                        Value::Array(items) if SITE_LISTS.contains(&name.as_str()) => {
                            let cut = if top == 0 { items.len() } else { top };
                            let (shown, rest) = split(items, cut);
                            let shown = shown.into_iter().map(|v| self.rewrite(v, top)).collect();
                            out.insert(name.clone(), Value::Array(shown));
                            if !rest.is_empty() {
                                out.insert(format!("{name}_not_shown"), sums(&rest));
                            }
                        }
                        Value::Array(frames) if name == "frames" && site => {
                            let stack = self.stack(frames);
                            out.insert("stack".to_owned(), stack.into());
                        }
                        v => {
                            out.insert(name, self.rewrite(v, top));
                        }
                    }
                }
                Value::Object(out)
            }
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.rewrite(v, top)).collect())
            }
            v => v,
        }
    }

    /// The index of the stack of `frames`, adding it and its frames if new.
    fn stack(&mut self, frames: Vec<Value>) -> usize {
        let ids: Vec<usize> = frames.into_iter().map(|f| self.frame(f)).collect();
        if let Some(&id) = self.stack_ids.get(&ids) {
            return id;
        }
        let id = self.stacks.len();
        self.stacks.push(ids.clone());
        self.stack_ids.insert(ids, id);
        id
    }

    fn frame(&mut self, frame: Value) -> usize {
        let text = frame.to_string();
        if let Some(&id) = self.frame_ids.get(&text) {
            return id;
        }
        let id = self.frames.len();
        self.frames.push(frame);
        self.frame_ids.insert(text, id);
        id
    }
}

/// Whether `fields` are a serialized site's (`Site` in snapdiff-analyze).
fn is_site(fields: &Map<String, Value>) -> bool {
    ["key", "culprit", "frames"]
        .iter()
        .all(|k| fields.contains_key(*k))
}

fn split(mut items: Vec<Value>, at: usize) -> (Vec<Value>, Vec<Value>) {
    let rest = items.split_off(at.min(items.len()));
    (items, rest)
}

/// How many sites were cut, and the sum of each of their numeric fields.
fn sums(rest: &[Value]) -> Value {
    let mut out = Map::new();
    out.insert("sites".to_owned(), rest.len().into());
    let mut ints: Vec<(String, i128)> = Vec::new();
    let mut floats: Vec<(String, f64)> = Vec::new();
    for item in rest {
        let Value::Object(fields) = item else {
            continue;
        };
        for (name, v) in fields {
            if let Some(n) = v.as_i64().map(i128::from).or(v.as_u64().map(i128::from)) {
                match ints.iter_mut().find(|(k, _)| k == name) {
                    Some((_, sum)) => *sum += n,
                    None => ints.push((name.clone(), n)),
                }
            } else if let Some(x) = v.as_f64() {
                match floats.iter_mut().find(|(k, _)| k == name) {
                    Some((_, sum)) => *sum += x,
                    None => floats.push((name.clone(), x)),
                }
            }
        }
    }
    for (name, sum) in ints {
        let v = i64::try_from(sum)
            .map(Value::from)
            .unwrap_or_else(|_| Value::from(sum as f64));
        out.insert(name, v);
    }
    for (name, sum) in floats {
        out.insert(name, sum.into());
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_report_written_with_its_list_apart_is_the_same_json() {
        let site = |key: &str, line: u64| {
            json!({
                "key": key,
                "culprit": {"name": "step", "file": "train.py", "line": line, "kind": "user"},
                "frames": [{"name": "step", "file": "train.py", "line": line}],
                "bytes": 8,
            })
        };
        let member = |rank: u64, line: u64| json!({"rank": rank, "suspects": [site("k", line), site("j", 9)], "notes": ["a\nb"]});
        let whole = json!({
            "leaks": [{"site": site("a", 1)}],
            "members": [member(0, 1), member(1, 2), member(2, 3)],
            "notes": ["done"],
        });
        let mut expected = Vec::new();
        write(&mut expected, &whole, 1).unwrap();
        let mut head = whole.clone();
        head["members"] = json!([]);
        let members = whole["members"].as_array().unwrap().clone();
        let mut streamed = Vec::new();
        write_with_list(&mut streamed, &head, "members", members, 1).unwrap();
        assert_eq!(
            String::from_utf8(streamed.clone()).unwrap(),
            String::from_utf8(expected).unwrap()
        );
        let mut empty = Vec::new();
        write_with_list(&mut empty, &head, "members", Vec::<Value>::new(), 1).unwrap();
        let empty: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(empty["members"], json!([]));
    }

    #[test]
    fn stacks_and_frames_are_written_once_and_lists_are_cut() {
        let f = |line| json!({"name": "step", "file": "train.py", "line": line});
        let site = |key: &str, lines: &[u64], bytes: i64| {
            json!({
                "key": key,
                "culprit": {"name": "step", "file": "train.py", "line": lines[0], "kind": "user"},
                "frames": lines.iter().map(|&l| f(l)).collect::<Vec<_>>(),
                "delta_bytes": bytes,
                "share": 0.25,
            })
        };
        let report = json!({
            "leaked_bytes": 7,
            "groups": [site("a", &[1, 2], 4), site("b", &[1, 2], 2), site("c", &[3], 1), site("d", &[2], -1)],
        });
        let out = tabled(report, 2);
        assert_eq!(out["schema"], 2);
        assert_eq!(out["frames"], json!([f(1), f(2)]));
        assert_eq!(out["stacks"], json!([[0, 1]]));
        assert_eq!(out["groups"][0]["stack"], 0);
        assert_eq!(out["groups"][1]["stack"], 0);
        assert!(out["groups"][0].get("frames").is_none());
        assert_eq!(
            out["groups_not_shown"],
            json!({"sites": 2, "delta_bytes": 0, "share": 0.5})
        );
        // --top 0: every site.
        assert_eq!(
            tabled(json!({"groups": [site("a", &[1], 1)]}), 0)["groups"][0]["stack"],
            0
        );
    }
}
