//! Byte sizes for people: `1.5 MiB` out, `1MiB`, `512K` or `2GB` in.
//!
//! Written here rather than taken from `bytesize` or `humansize`: the
//! grammar users already type reads a bare `K`, `M`, `G` as powers of 1024
//! (as `ulimit`, `dd` and PyTorch's own messages do) and `KB`, `MB`, `GB` as
//! powers of 1000, where `bytesize` reads `K` as 1000; and tables show three
//! significant digits (`1.50 MiB`, `20.0 MiB`, `200 GiB`) so columns line
//! up, which neither crate's formatter does. Durations (`--interval`) are
//! parsed by `humantime`, whose grammar is the documented one.

use std::fmt;

const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/// Formats a byte count with a binary unit: `512 B`, `1.50 MiB`, `12.0 GiB`.
pub fn format_size(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let digits = if value < 10.0 {
        2
    } else if value < 100.0 {
        1
    } else {
        0
    };
    format!("{value:.digits$} {}", UNITS[unit])
}

/// Formats a signed byte difference: `+1.50 MiB`, `-512 B`, `0 B`.
pub fn format_delta(bytes: i64) -> String {
    match bytes {
        0 => "0 B".to_owned(),
        b if b > 0 => format!("+{}", format_size(b as u64)),
        b => format!("-{}", format_size(b.unsigned_abs())),
    }
}

/// A size that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseSizeError(String);

impl fmt::Display for ParseSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid size '{}', expected a number then an optional unit (B, KiB, MiB, GiB, TiB; \
             K, M, G, T are the same; KB, MB, GB, TB are powers of 1000)",
            self.0
        )
    }
}

impl std::error::Error for ParseSizeError {}

/// Parses a size: a number (possibly with a fraction) and an optional unit.
/// `K`, `KiB` = 1024; `KB` = 1000; likewise M, G, T.
pub fn parse_size(text: &str) -> Result<u64, ParseSizeError> {
    let err = || ParseSizeError(text.to_owned());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    if number.is_empty() {
        return Err(err());
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(err()),
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).ok_or_else(err);
    }
    let value: f64 = number.parse().map_err(|_| err())?;
    let bytes = (value * multiplier as f64).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(20 << 20), "20.0 MiB");
        assert_eq!(format_size(200 << 30), "200 GiB");
        assert_eq!(format_delta(-2048), "-2.00 KiB");
        assert_eq!(format_delta(1 << 20), "+1.00 MiB");
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1 MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
    }
}
