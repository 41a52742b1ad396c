//! Pinned host memory as text: its own lines under a report, never mixed
//! into the devices' figures, and its cache said for what it is.

use std::io::{self, Write};

use snapdiff_analyze::PinnedHost;
use snapdiff_analyze::pinned_host::{PinnedHostChange, PinnedHostTrend};

use crate::text::{delta_colored, grew, size};

/// What the pinned host cache holds, when it holds anything: "pinned host
/// cache: 155 MiB in 25 free blocks of 5 sizes (...)".
pub fn cache_line(host: &PinnedHost) -> Option<String> {
    (host.cached_blocks > 0).then(|| {
        format!(
            "pinned host cache: {} in {} free block{} of {} size{} (PyTorch keeps them; \
             `pinned_max_cached_size_mb` caps it)",
            size(host.cached_bytes),
            host.cached_blocks,
            if host.cached_blocks == 1 { "" } else { "s" },
            host.cached_sizes,
            if host.cached_sizes == 1 { "" } else { "s" },
        )
    })
}

/// One snapshot's pinned host memory, for `summary`.
pub(crate) fn write_one(host: &PinnedHost, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "pinned host memory (host RAM, not in the device figures above): {} pinned, {} in use \
         in {} block{}",
        size(host.reserved_bytes),
        size(host.in_use_bytes),
        host.in_use_blocks,
        if host.in_use_blocks == 1 { "" } else { "s" },
    )?;
    if let Some(line) = cache_line(host) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Pinned host memory between two snapshots, for `compare`.
pub(crate) fn write_change(
    change: &PinnedHostChange,
    color: bool,
    out: &mut dyn Write,
) -> io::Result<()> {
    let (a, b) = (&change.before, &change.after);
    writeln!(
        out,
        "pinned host memory (host RAM, not the device's) {} -> {} ({}), in use {} -> {} ({})",
        size(a.reserved_bytes),
        size(b.reserved_bytes),
        delta_colored(b.reserved_bytes as i64 - a.reserved_bytes as i64, color),
        size(a.in_use_bytes),
        size(b.in_use_bytes),
        delta_colored(b.in_use_bytes as i64 - a.in_use_bytes as i64, color),
    )?;
    if b.cached_bytes > a.cached_bytes
        && let Some(line) = cache_line(b)
    {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Pinned host memory over a run, for `trend`: its verdict when it keeps
/// growing, one line when it does not.
pub(crate) fn write_trend(
    trend: &PinnedHostTrend,
    color: bool,
    out: &mut dyn Write,
) -> io::Result<()> {
    let (a, b) = (&trend.first, &trend.last);
    if !trend.rising.grows {
        return writeln!(
            out,
            "pinned host memory (host RAM, not the device's) does not keep growing: {} pinned at \
             the end, {} in use",
            size(b.reserved_bytes),
            size(b.in_use_bytes)
        );
    }
    write!(
        out,
        "pinned host memory keeps growing (host RAM, not the device's): {} -> {} after warm-up, \
         rising at {} of {} checkpoints",
        size(a.reserved_bytes),
        grew(size(b.reserved_bytes), color),
        trend.rising.rises,
        trend.rising.checkpoints
    )?;
    if let Some(rate) = trend.rising.growth_per_step {
        write!(out, ", {} a step", size(rate.round() as u64))?;
    }
    writeln!(out)?;
    let in_use_growth = b.in_use_bytes.saturating_sub(a.in_use_bytes);
    let cache_growth = b.cached_bytes.saturating_sub(a.cached_bytes);
    writeln!(
        out,
        "  in use {} -> {}{}",
        size(a.in_use_bytes),
        size(b.in_use_bytes),
        if in_use_growth > cache_growth {
            ": pinned tensors kept alive"
        } else {
            ""
        }
    )?;
    if let Some(line) = cache_line(b) {
        let what = if cache_growth >= in_use_growth {
            ": the growth is free blocks the cache keeps, not memory in use"
        } else {
            ""
        };
        writeln!(out, "  {line}{what}")?;
    }
    Ok(())
}
