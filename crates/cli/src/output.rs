//! Where commands write: text reports on stdout, pictures and pages to
//! files.

use std::io::Write;
use std::path::Path;

use anyhow::bail;
use snapdiff_format::Existing;
use snapdiff_render::text::TerminalText;

/// When to colour text reports (`--color`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ColorWhen {
    /// On a terminal that supports it, as NO_COLOR and CLICOLOR_FORCE say.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Whether text reports are coloured, decided once from `--color` by
/// [`choose_colors`].
static COLORS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Decides whether text reports on stdout are coloured: `--color always` or
/// `never`, or for `auto` what anstream decides from the terminal, NO_COLOR,
/// CLICOLOR and CLICOLOR_FORCE.
pub(crate) fn choose_colors(when: ColorWhen) {
    let on = match when {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto => {
            anstream::AutoStream::choice(&std::io::stdout()) != anstream::ColorChoice::Never
        }
    };
    let _ = COLORS.set(on);
}

/// Whether text reports are coloured (see [`choose_colors`]).
pub(crate) fn colors() -> bool {
    COLORS.get().copied().unwrap_or(false)
}

/// Standard output for text reports, with control characters escaped; see
/// [`TerminalText`]. (`--json` output goes to plain stdout: JSON escapes
/// them itself and must stay exact.)
pub(crate) fn text_out() -> TerminalText<std::io::StdoutLock<'static>> {
    let stdout = std::io::stdout().lock();
    if colors() {
        TerminalText::with_colors(stdout)
    } else {
        TerminalText::new(stdout)
    }
}

/// A path given on the command line as text reports show it: with newlines
/// and other controls escaped, so that a file's name cannot forge a line.
pub(crate) fn shown(path: &Path) -> String {
    snapdiff_format::visible::escaped(&path.display().to_string()).into_owned()
}

/// `paths` as a shell takes them, for a command line to copy: each a
/// quoted word where it must be; past the first four, `...`.
pub(crate) fn shell_paths(paths: &[std::path::PathBuf]) -> String {
    const SHOWN: usize = 4;
    let mut words: Vec<String> = (paths.iter().take(SHOWN))
        .map(|p| snapdiff_render::fleet::shell_word(&p.to_string_lossy()))
        .collect();
    if paths.len() > SHOWN {
        words.push("...".to_owned());
    }
    words.join(" ")
}

/// Prints `report` as `--json` on stdout, its site lists cut to `top`.
pub(crate) fn print_json<T: serde::Serialize>(report: &T, top: usize) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    snapdiff_render::json::write(&mut out, report, top)?;
    out.flush()
}

/// [`print_json`] for a report whose `list` is given apart, as `items`
/// (see `snapdiff_render::json::write_with_list`).
pub(crate) fn print_json_with_list<T: serde::Serialize, I: serde::Serialize>(
    report: &T,
    list: &str,
    items: impl IntoIterator<Item = I>,
    top: usize,
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    snapdiff_render::json::write_with_list(&mut out, report, list, items, top)?;
    out.flush()
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
