//! Red for growth, green for shrinking, and nothing else: the only escape
//! sequences snapdiff writes.

use super::human::delta;

/// The style of growth: red.
const GROWTH: anstyle::Style = anstyle::AnsiColor::Red.on_default();
/// The style of shrinking: green.
const SHRINK: anstyle::Style = anstyle::AnsiColor::Green.on_default();

/// `text`, red when `color` (memory that grew).
pub fn grew(text: String, color: bool) -> String {
    paint(text, GROWTH, color)
}

/// `text`, green when `color` (memory that shrank).
pub fn shrank(text: String, color: bool) -> String {
    paint(text, SHRINK, color)
}

/// A signed byte difference (`+1.00 MiB`), red when it grew and green
/// when it shrank, if `color`.
pub fn delta_colored(bytes: i64, color: bool) -> String {
    match bytes {
        b if b > 0 => grew(delta(b), color),
        b if b < 0 => shrank(delta(b), color),
        b => delta(b),
    }
}

fn paint(text: String, style: anstyle::Style, color: bool) -> String {
    if color {
        format!("{}{text}{}", style.render(), style.render_reset())
    } else {
        text
    }
}

/// The only escape sequences [`TerminalText::with_colors`] lets through:
/// those [`grew`] and [`shrank`] write.
pub(super) fn color_codes() -> &'static [String; 3] {
    static CODES: std::sync::OnceLock<[String; 3]> = std::sync::OnceLock::new();
    CODES.get_or_init(|| {
        [
            GROWTH.render().to_string(),
            SHRINK.render().to_string(),
            GROWTH.render_reset().to_string(),
        ]
    })
}

/// `text` without the colour codes of [`grew`] and [`shrank`], to measure it.
pub(super) fn strip_colors(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\u{1b}') {
        return text.into();
    }
    let mut out = text.to_owned();
    for code in color_codes() {
        out = out.replace(code.as_str(), "");
    }
    out.into()
}
