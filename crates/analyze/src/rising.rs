//! Whether one figure keeps rising over a run of checkpoints: the rule for
//! memory judged apart from the sites (pinned host memory, memory outside
//! the recorded allocator), where there is no floor of blocks to follow,
//! only a total.

use serde::Serialize;

/// A total over the checkpoints after warm-up, judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rising {
    /// Checkpoints after warm-up at which it rose.
    pub rises: usize,
    /// Checkpoints after warm-up.
    pub checkpoints: usize,
    /// Its growth from the end of warm-up to the last checkpoint.
    pub growth_bytes: i64,
    /// Growth a step, when the checkpoints record their step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth_per_step: Option<f64>,
    /// Whether it keeps growing: it grew by at least the least growth
    /// asked for, rising at three checkpoints or more after warm-up,
    /// one of them in the second half of the run (what filled once, early,
    /// and then held does not keep growing).
    pub grows: bool,
}

/// The least number of rises after warm-up for a total to keep growing.
pub(crate) const MIN_RISES: usize = 3;

impl Rising {
    /// Judges `series` (a total at each checkpoint, with its step), the
    /// first `warmup` checkpoints left out, against `min_growth` bytes.
    pub(crate) fn of(series: &[(u64, Option<u64>)], warmup: usize, min_growth: u64) -> Rising {
        if series.is_empty() {
            return Rising::default();
        }
        let judged = &series[warmup.min(series.len() - 1)..];
        let last = judged.len() - 1;
        let rose_at: Vec<usize> = (1..judged.len())
            .filter(|&i| judged[i].0 > judged[i - 1].0)
            .collect();
        let growth_bytes = judged[last].0 as i64 - judged[0].0 as i64;
        let growth_per_step = match (judged[0].1, judged[last].1) {
            (Some(a), Some(b)) if b > a => Some(growth_bytes as f64 / (b - a) as f64),
            _ => None,
        };
        Rising {
            rises: rose_at.len(),
            checkpoints: last,
            growth_bytes,
            growth_per_step,
            grows: growth_bytes >= min_growth as i64
                && rose_at.len() >= MIN_RISES
                && rose_at.iter().any(|&i| 2 * i > last),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn series(mib: &[u64], step: u64) -> Vec<(u64, Option<u64>)> {
        (mib.iter().enumerate())
            .map(|(i, &m)| (m * MIB, Some(i as u64 * step)))
            .collect()
    }

    #[test]
    fn what_fills_early_and_holds_does_not_keep_growing() {
        let r = Rising::of(&series(&[4, 8, 16, 20, 20, 20, 20, 20, 20, 20], 1), 1, MIB);
        assert_eq!((r.rises, r.checkpoints), (2, 8));
        assert!(!r.grows);
    }

    #[test]
    fn rising_through_the_run_keeps_growing() {
        let r = Rising::of(&series(&[4, 8, 8, 12, 12, 16, 16, 20, 20, 24], 10), 1, MIB);
        assert_eq!(r.rises, 4);
        assert!(r.grows);
        assert_eq!(r.growth_per_step, Some((16 * MIB) as f64 / 80.0));
    }

    #[test]
    fn growth_under_the_least_asked_for_is_not_growing() {
        let r = Rising::of(&series(&[4, 5, 6, 7, 8, 9], 1), 1, 64 * MIB);
        assert_eq!(r.rises, 4);
        assert!(!r.grows);
    }

    #[test]
    fn rises_only_early_are_not_growing() {
        let r = Rising::of(&series(&[0, 10, 20, 30, 30, 30, 30, 30, 30], 1), 0, MIB);
        assert!(!r.grows);
    }
}
