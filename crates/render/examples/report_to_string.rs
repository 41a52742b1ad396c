//! snapdiff's reports written anywhere: the text of `snapdiff compare`, its
//! `--json`, and a flame graph, each to a writer of your choosing.
//!
//! ```text
//! cargo run -p snapdiff-render --example report_to_string -- BEFORE AFTER OUT.svg
//! ```
//!
//! Prints the comparison as text, then the size of its JSON, and writes a
//! flame graph of the live memory in AFTER to OUT.svg.

use snapdiff_analyze::{CompareOptions, CulpritRules, LiveMoment, compare, live_by_site};
use snapdiff_render::flamegraph::{Drawn, write_svg};
use snapdiff_render::{TextOptions, json};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [before, after, svg] = &args[..] else {
        return Err("usage: report_to_string BEFORE AFTER OUT.svg".into());
    };
    let (a, b) = (
        snapdiff_format::read_path(before)?,
        snapdiff_format::read_path(after)?,
    );
    let cmp = compare(&a, &b, &CompareOptions::default());

    // Text, as `snapdiff compare` prints it, into a String.
    let mut text = Vec::new();
    let options = TextOptions {
        top: 5,
        frames: 2,
        ..TextOptions::default()
    };
    snapdiff_render::compare::write_text(&cmp, before, after, &options, &mut text)?;
    print!("{}", String::from_utf8(text)?);

    // The same as `--json` (schema 2), all sites.
    let mut as_json = Vec::new();
    json::write(&mut as_json, &cmp, 0)?;
    println!("as JSON: {} bytes", as_json.len());

    // A flame graph of what AFTER holds live, to a file.
    let sites = live_by_site(&b, &CulpritRules::default(), LiveMoment::End)?;
    let mut file = std::io::BufWriter::new(std::fs::File::create(svg)?);
    write_svg(&Drawn::One(sites), "Live memory by stack", &mut file)?;
    println!("wrote {svg}");
    Ok(())
}
