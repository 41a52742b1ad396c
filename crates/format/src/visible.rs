//! Text from a file made safe to show: every character that could change
//! how the text around it displays or splits is written as an escape.
//!
//! Frame names, file names and markers come from the files users read. A
//! newline in a frame name would start a forged line of folded stacks or of
//! an error; `ESC` sequences retitle or recolour a terminal; a bidi control
//! (U+202E) reverses the text after it, so `gpt.py` can read as `yp.tpg`;
//! U+2028 ends a line in JavaScript and some editors; NUL makes XML invalid.
//! Every text output passes such strings through [`escaped`] (and error
//! messages through [`quoted`]) before they reach a terminal, a page or
//! another tool's input; JSON keeps them exact, as data.

use std::borrow::Cow;

/// Whether `c` is written as an escape by [`escaped`]: the C0 and C1
/// controls (newline and tab included) and DEL, the bidirectional
/// formatting characters, and the line and paragraph separators.
pub fn is_escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with every character [`is_escaped`] written as `\xNN` (below
/// U+0100) or `\u{NNNN}`; other text is returned as it is.
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_char(&mut out, c);
    }
    Cow::Owned(out)
}

/// Appends `c` to `out`, as an escape when [`is_escaped`] says so.
pub fn push_char(out: &mut String, c: char) {
    use std::fmt::Write;
    let code = u32::from(c);
    if !is_escaped(c) {
        out.push(c);
    } else if code < 0x100 {
        let _ = write!(out, "\\x{code:02x}");
    } else {
        let _ = write!(out, "\\u{{{code:04x}}}");
    }
}

/// The most characters of a file's text an error message quotes.
pub const QUOTED_CHARS: usize = 60;

/// `text` for an error message: in double quotes, escaped, and cut to
/// [`QUOTED_CHARS`] characters with `…` when longer, so that no file can
/// make an error longer than a line or forge one.
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(QUOTED_CHARS * 2) + 2);
    out.push('"');
    for (i, c) in text.chars().enumerate() {
        if i == QUOTED_CHARS {
            out.push('…');
            break;
        }
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        push_char(&mut out, c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_bidi_and_separators_are_escaped() {
        assert_eq!(escaped("train.py"), "train.py");
        assert!(matches!(escaped("naïve ✓ 模型"), Cow::Borrowed(_)));
        assert_eq!(escaped("a\nb\tc\0"), "a\\x0ab\\x09c\\x00");
        assert_eq!(escaped("\x1b]0;x\x07\u{9b}"), "\\x1b]0;x\\x07\\x9b");
        assert_eq!(escaped("gpt\u{202e}yp.py"), "gpt\\u{202e}yp.py");
        assert_eq!(escaped("a\u{2028}b\u{2029}"), "a\\u{2028}b\\u{2029}");
        assert_eq!(escaped("\u{2066}x\u{2069}"), "\\u{2066}x\\u{2069}");
    }

    #[test]
    fn quotes_are_short_and_one_line() {
        assert_eq!(quoted("os.system"), "\"os.system\"");
        assert_eq!(quoted("a\"b\\\n"), "\"a\\\"b\\\\\\x0a\"");
        let long = "x\n".repeat(500);
        let q = quoted(&long);
        assert!(!q.contains('\n'));
        assert!(q.ends_with("…\""));
        assert!(q.chars().count() < 4 * QUOTED_CHARS);
    }
}
