//! Writes a generated job of many ranks for `snapdiff fleet`'s benchmark:
//! `cargo run --release --example make_fleet -- SOURCE RANKS STEPS DIR`,
//! SOURCE a real PyTorch snapshot with a trace (see `tests/fleet_job.rs`
//! for what the ranks do), with a `manifest.jsonl` in each node's folder
//! as `capture` writes it. Prints what a right verdict says, as JSON.

#[allow(
    dead_code,
    reason = "the tests' replay module; the generator uses part of it"
)]
#[path = "../tests/pytorch_replay.rs"]
mod pytorch_replay;

#[path = "../tests/fleet_job.rs"]
mod fleet_job;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [source, ranks, steps, dir] = args.as_slice() else {
        eprintln!("usage: make_fleet SOURCE RANKS STEPS DIR");
        std::process::exit(2);
    };
    let (Ok(ranks), Ok(steps)) = (ranks.parse(), steps.parse()) else {
        eprintln!("make_fleet: RANKS and STEPS are numbers");
        std::process::exit(2);
    };
    let truth = fleet_job::make_fleet(source.as_ref(), ranks, steps, dir.as_ref());
    write_manifests(dir.as_ref()).expect("the manifests written");
    println!(
        "{}",
        serde_json::to_string_pretty(&truth).expect("a truth as JSON")
    );
}

/// A `manifest.jsonl` in each node folder of the job at `dir`, a line per
/// dump as capture's hook writes it (its process, machine, device, step,
/// time, reason, resident memory and how long it held the job), so that
/// the benchmark reads what a captured job holds.
fn write_manifests(dir: &std::path::Path) -> std::io::Result<()> {
    for node in std::fs::read_dir(dir)? {
        let node = node?.path();
        let mut lines = String::new();
        let mut names: Vec<String> = std::fs::read_dir(&node)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        for name in names {
            let Some((rank, step)) = name
                .strip_suffix(".snap")
                .and_then(|stem| stem.strip_prefix("rank")?.split_once("-step"))
            else {
                continue;
            };
            let (Ok(rank), Ok(step)) = (rank.parse::<u64>(), step.parse::<u64>()) else {
                continue;
            };
            let line = serde_json::json!({
                "file": name,
                "rss_bytes": (3u64 << 30) + rank * 4096,
                "seconds": 0.05,
                "rank": rank,
                "pid": 10_000 + rank,
                "host": node.file_name().map(|n| n.to_string_lossy().into_owned()),
                "device": format!("cuda:{}", rank % 8),
                "step": step,
                "time": 1_700_000_000.0 + step as f64 * 10.0,
                "reason": "step",
            });
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
        std::fs::write(node.join("manifest.jsonl"), lines)?;
    }
    Ok(())
}
