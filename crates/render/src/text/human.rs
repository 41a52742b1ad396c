//! Numbers for people: sizes, counts, sparklines and durations.

pub use snapdiff_format::units::{format_delta as delta, format_size as size};

/// A count for people, thousands apart: `1,048,576`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// A series of byte counts as a sparkline of at most 24 characters (long
/// series are shown by the maximum of each stretch).
pub fn sparkline(series: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    const WIDTH: usize = 24;
    let points: Vec<u64> = if series.len() <= WIDTH {
        series.to_vec()
    } else {
        (0..WIDTH)
            .map(|i| {
                let (a, b) = (i * series.len() / WIDTH, (i + 1) * series.len() / WIDTH);
                series[a..b.max(a + 1)].iter().copied().max().unwrap_or(0)
            })
            .collect()
    };
    let (lo, hi) = (
        points.iter().copied().min().unwrap_or(0),
        points.iter().copied().max().unwrap_or(0),
    );
    points
        .iter()
        .map(|&v| {
            if hi == lo {
                BARS[0]
            } else {
                BARS[((v - lo) as f64 / (hi - lo) as f64 * 7.0).round() as usize]
            }
        })
        .collect()
}

/// A duration in seconds for people: `16 ms`, `45 s`, `12 min`, `3.5 h`,
/// `2.1 days`.
///
/// An estimate in one unit, rounded; `humantime::format_duration` writes
/// every unit down to nanoseconds (`3h 29m 51s 208ms`), which a
/// time-to-full estimate has no precision for.
pub fn duration(seconds: f64) -> String {
    let ms = seconds * 1000.0;
    if ms < 9.95 {
        format!("{ms:.1} ms")
    } else if ms < 99.5 {
        format!("{ms:.0} ms")
    } else if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else if seconds < 90.0 {
        format!("{seconds:.0} s")
    } else if seconds < 90.0 * 60.0 {
        format!("{:.0} min", seconds / 60.0)
    } else if seconds < 48.0 * 3600.0 {
        format!("{:.1} h", seconds / 3600.0)
    } else {
        format!("{:.1} days", seconds / 86400.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_048_576), "1,048,576");
    }

    #[test]
    fn durations_under_a_tenth_of_a_second_are_in_milliseconds() {
        assert_eq!(duration(0.0), "0.0 ms");
        assert_eq!(duration(0.0004), "0.4 ms");
        assert_eq!(duration(0.016), "16 ms");
        assert_eq!(duration(0.0996), "0.1 s");
        assert_eq!(duration(3.25), "3.2 s");
        assert_eq!(duration(45.0), "45 s");
        assert_eq!(duration(720.0), "12 min");
    }
}
