//! Where commands write: text reports on stdout, pictures and pages to
//! files.

use std::io::Write;
use std::path::Path;

use anyhow::bail;
use snapdiff_format::Existing;
use snapdiff_render::text::TerminalText;

/// Standard output for text reports, with control characters escaped; see
/// [`TerminalText`]. (`--json` output goes to plain stdout: JSON escapes
/// them itself and must stay exact.)
pub(crate) fn text_out() -> TerminalText<std::io::StdoutLock<'static>> {
    TerminalText::new(std::io::stdout().lock())
}

/// Prints `report` as `--json` on stdout, its site lists cut to `top`.
pub(crate) fn print_json<T: serde::Serialize>(report: &T, top: usize) -> std::io::Result<()> {
    snapdiff_render::json::write(&mut std::io::stdout().lock(), report, top)
}

/// Writes `output` through `encode`, atomically, refusing to replace an
/// existing file unless `force`; `-` is standard output.
pub(crate) fn write_output(
    output: &Path,
    force: bool,
    encode: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    if output == Path::new("-") {
        let mut out = std::io::stdout().lock();
        encode(&mut out)?;
        out.flush()?;
        return Ok(());
    }
    if output.exists() && !force {
        bail!(
            "{}: already exists; pass --force to replace it",
            output.display()
        );
    }
    let existing = if force {
        Existing::Replace
    } else {
        Existing::Keep
    };
    snapdiff_format::write_atomically(output, existing, |out| {
        encode(out).map_err(|e| snapdiff_format::Error::io("cannot write", e))
    })?;
    Ok(())
}
