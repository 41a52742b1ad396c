//! Which lines of code hold more memory in one snapshot than in another,
//! and which keep growing over several: the analyses on their own.
//!
//! ```text
//! cargo run -p snapdiff-analyze --example what_grew -- BEFORE AFTER [MORE...]
//! ```
//!
//! With two files, prints the sites that grew, each named by its culprit
//! (the innermost frame of the program's own code). With three or more,
//! also the sites whose floor keeps rising: the trend verdict.

use snapdiff_analyze::{CompareOptions, NamedSnapshot, TrendOptions, compare, trend_named};
use snapdiff_format::{read_path, units::format_size};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.len() < 2 {
        return Err("usage: what_grew BEFORE AFTER [MORE...]".into());
    }
    let snaps = paths.iter().map(read_path).collect::<Result<Vec<_>, _>>()?;

    let cmp = compare(
        &snaps[0],
        &snaps[snaps.len() - 1],
        &CompareOptions::default(),
    );
    println!(
        "{} more live memory after than before",
        format_size(cmp.leaked_bytes)
    );
    for g in cmp.groups.iter().filter(|g| g.delta_bytes > 0).take(5) {
        println!(
            "  +{}  {}",
            format_size(g.delta_bytes as u64),
            g.site.culprit.display()
        );
    }

    if snaps.len() >= 3 {
        // Named by file: snapshots that record neither step nor time are
        // put in the order of their names, numbers as numbers.
        let named: Vec<NamedSnapshot<'_>> = paths
            .iter()
            .zip(&snaps)
            .map(|(name, snapshot)| NamedSnapshot { name, snapshot })
            .collect();
        let trend = trend_named(&named, &TrendOptions::default());
        println!("{} sites keep growing", trend.suspects.len());
        for s in &trend.suspects {
            println!(
                "  +{}  {}",
                format_size(s.growth_bytes),
                s.site.culprit.display()
            );
        }
    }
    Ok(())
}
