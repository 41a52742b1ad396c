//! Private pools left behind, as text: one line each under `compare` and
//! `trend`.

use std::io::{self, Write};

use snapdiff_analyze::IdlePool;

use crate::text::size;

/// A line for each of `pools`.
pub(crate) fn write_idle(pools: &[IdlePool], out: &mut dyn Write) -> io::Result<()> {
    for p in pools {
        writeln!(
            out,
            "private pool ({}, {}) on device {}: {} reserved in {} segment{}, nothing in use in \
             {} snapshots: a CUDA graph capture that failed or was dropped keeps it (the shared \
             pools cannot use it)",
            p.pool_id.0,
            p.pool_id.1,
            p.device,
            size(p.reserved_bytes),
            p.segments,
            if p.segments == 1 { "" } else { "s" },
            p.snapshots
        )?;
    }
    Ok(())
}
