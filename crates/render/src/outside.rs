//! Memory outside what the snapshots record, as text: said only when it
//! keeps growing, since a job can run out of memory while every recorded
//! site holds still.

use std::io::{self, Write};

use snapdiff_analyze::Outside;
use snapdiff_analyze::outside::OutsideGrowth;

use crate::text::{grew, size};

/// The lines of `outside` that keep growing, one each.
pub fn lines(outside: &Outside, color: bool) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(device) = outside.device.as_ref().filter(|g| g.outside.grows) {
        lines.push(format!(
            "device memory in use grew {} while the allocator's reserved went {} -> {}: the \
             growth is outside PyTorch's allocator (NCCL, cuBLAS workspaces, another library's \
             CUDA memory){}",
            measured(device, color),
            size(device.recorded_bytes.0),
            size(device.recorded_bytes.1),
            rate(device)
        ));
    }
    if let Some(process) = outside.process.as_ref().filter(|g| g.outside.grows) {
        lines.push(if outside.recorded_on_cpu {
            format!(
                "the process's resident memory grew {} while the memory recorded went {} -> {}: \
                 the growth is outside what snapdiff records (numpy arrays, Python objects, \
                 another library's memory){}",
                measured(process, color),
                size(process.recorded_bytes.0),
                size(process.recorded_bytes.1),
                rate(process)
            )
        } else {
            format!(
                "the process's resident memory (host RAM) grew {}, which the device's snapshots \
                 do not record (CPU tensors, Python objects, data loading){}",
                measured(process, color),
                rate(process)
            )
        });
    }
    lines
}

/// `trend`'s lines for `outside`.
pub(crate) fn write_trend(outside: &Outside, color: bool, out: &mut dyn Write) -> io::Result<()> {
    for line in lines(outside, color) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// "1.2 GiB after warm-up (300 MiB -> 1.5 GiB)".
fn measured(g: &OutsideGrowth, color: bool) -> String {
    format!(
        "{} after warm-up ({} -> {})",
        grew(size(g.outside.growth_bytes.max(0) as u64), color),
        size(g.measured_bytes.0),
        size(g.measured_bytes.1)
    )
}

/// ", rising at 9 of 9 checkpoints, 32.0 MiB a step".
fn rate(g: &OutsideGrowth) -> String {
    let mut text = format!(
        ", rising at {} of {} checkpoints",
        g.outside.rises, g.outside.checkpoints
    );
    if let Some(rate) = g.outside.growth_per_step {
        text += &format!(", {} a step", size(rate.max(0.0).round() as u64));
    }
    text
}
