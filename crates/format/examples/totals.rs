//! Reading snapshots of any kind, and writing one as `.snap`: the format
//! crate on its own.
//!
//! ```text
//! cargo run -p snapdiff-format --example totals -- FILE... [--to OUT.snap]
//! ```
//!
//! Prints what each file holds (the producer, segments, blocks, allocated
//! and reserved bytes, trace events); with `--to`, writes the first file as
//! a `.snap`, refusing to replace one that exists.

use snapdiff_format::{Existing, read_path, units::format_size, write_path};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let to = match args.iter().position(|a| a == "--to") {
        Some(i) if i + 1 < args.len() => Some(args.drain(i..i + 2).nth(1).unwrap_or_default()),
        Some(_) => return Err("--to takes a file name".into()),
        None => None,
    };
    if args.is_empty() {
        return Err("usage: totals FILE... [--to OUT.snap]".into());
    }
    for path in &args {
        // One reader for every kind: PyTorch pickles, torch.save zips,
        // `.snap` and `.json`; the kind is told from the bytes.
        let snap = read_path(path)?;
        let totals = snap.totals();
        println!(
            "{path}: by {}, {} segments, {} blocks, {} allocated of {} reserved, {} trace events",
            snap.meta.producer,
            totals.segments,
            totals.blocks,
            format_size(totals.allocated_bytes),
            format_size(totals.reserved_bytes),
            snap.trace_len()
        );
    }
    if let Some(out) = to {
        let snap = read_path(&args[0])?;
        write_path(&out, &snap, Existing::Keep)?;
        println!("wrote {out}");
    }
    Ok(())
}
