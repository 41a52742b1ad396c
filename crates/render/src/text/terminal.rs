//! The writer that keeps a file's control characters off the terminal.

use std::io::Write;

use snapdiff_format::visible;

use super::color::color_codes;

/// A writer that passes text on with every character that could change how
/// a terminal shows it escaped (see [`snapdiff_format::visible`]), but
/// newlines and tabs.
///
/// Frame names, file names and markers come from the files users read, and
/// a file can hold `ESC ] 0 ;` (retitle the terminal), colour codes, a
/// carriage return that overwrites a line of the report with fake output,
/// or a bidi control that shows a line reversed. snapdiff's own text has no
/// such characters but newlines, so escaping at the sink covers every
/// table, note and header at once. Input is UTF-8 (Rust strings); one
/// character's bytes may arrive in two writes.
pub struct TerminalText<W: Write> {
    inner: W,
    /// Whether snapdiff's own colour codes pass (see [`TerminalText::with_colors`]).
    colors: bool,
    /// The first bytes of a character that the last write ended within.
    pending: Vec<u8>,
}

impl<W: Write> TerminalText<W> {
    /// A writer escaping every escape sequence, snapdiff's colours too.
    pub fn new(inner: W) -> TerminalText<W> {
        TerminalText {
            inner,
            colors: false,
            pending: Vec::new(),
        }
    }

    /// A writer like [`new`](TerminalText::new) that lets through the
    /// colour codes of [`grew`](super::grew) and [`shrank`](super::shrank)
    /// and their reset, and no other escape sequence. A file's own text
    /// could hold those same codes too: all they can do is colour text red
    /// or green.
    pub fn with_colors(inner: W) -> TerminalText<W> {
        TerminalText {
            colors: true,
            ..TerminalText::new(inner)
        }
    }

    /// Writes `buf`, escaped, but for a character cut off at its end, which
    /// is kept for the next write.
    fn write_escaped(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let mut plain_from = 0;
        let mut i = 0;
        while i < buf.len() {
            let b = buf[i];
            if b == 0x1b
                && self.colors
                && let Some(code) = color_codes()
                    .iter()
                    .find(|code| buf[i..].starts_with(code.as_bytes()))
            {
                i += code.len();
                continue;
            }
            let width = match b {
                0xc0..=0xdf => 2,
                0xe0..=0xef => 3,
                0xf0..=0xf7 => 4,
                _ => 1,
            };
            if i + width > buf.len() {
                self.inner.write_all(&buf[plain_from..i])?;
                self.pending = buf[i..].to_vec();
                return Ok(());
            }
            let (width, escaped) = match std::str::from_utf8(&buf[i..i + width]) {
                Ok(c) => {
                    let c = c
                        .chars()
                        .next()
                        .filter(|&c| c != '\n' && c != '\t' && visible::is_escaped(c));
                    (width, c)
                }
                // Not UTF-8 (never from a Rust string): passed on as it is.
                Err(_) => (1, None),
            };
            if let Some(c) = escaped {
                self.inner.write_all(&buf[plain_from..i])?;
                let mut text = String::new();
                visible::push_char(&mut text, c);
                self.inner.write_all(text.as_bytes())?;
                plain_from = i + width;
            }
            i += width;
        }
        self.inner.write_all(&buf[plain_from..])
    }
}

impl<W: Write> Write for TerminalText<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.pending.is_empty() {
            self.write_escaped(buf)?;
        } else {
            let mut joined = std::mem::take(&mut self.pending);
            joined.extend_from_slice(buf);
            self.write_escaped(&joined)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let cut_off = std::mem::take(&mut self.pending);
        self.inner.write_all(&cut_off)?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::grew;

    fn through_terminal_text(pieces: &[&[u8]]) -> String {
        let mut out = TerminalText::new(Vec::new());
        for p in pieces {
            out.write_all(p).unwrap();
        }
        out.flush().unwrap();
        String::from_utf8(out.inner).unwrap()
    }

    #[test]
    fn with_colors_only_snapdiffs_colour_codes_pass() {
        let mut out = TerminalText::with_colors(Vec::new());
        let text = format!(
            "{} \u{1b}]0;x\u{7} \u{1b}[2J",
            grew("+1 B".to_owned(), true)
        );
        out.write_all(text.as_bytes()).unwrap();
        assert_eq!(
            String::from_utf8(out.inner).unwrap(),
            "\u{1b}[31m+1 B\u{1b}[0m \\x1b]0;x\\x07 \\x1b[2J"
        );
        assert_eq!(grew("+1 B".to_owned(), false), "+1 B");
    }

    #[test]
    fn control_characters_are_escaped_and_text_is_kept() {
        let hostile = "a\u{1b}]0;pwned\u{7}b\r\nc\td\u{9b}31m é ü\u{7f} gpt\u{202e}yp.py\u{2028}模";
        let expected =
            "a\\x1b]0;pwned\\x07b\\x0d\nc\td\\x9b31m é ü\\x7f gpt\\u{202e}yp.py\\u{2028}模";
        assert_eq!(through_terminal_text(&[hostile.as_bytes()]), expected);
        // Split at every byte, so a character arrives in two writes.
        let bytes = hostile.as_bytes();
        for cut in 0..bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(through_terminal_text(&[a, b]), expected, "cut at {cut}");
        }
    }
}
