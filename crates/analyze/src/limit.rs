//! The one rule of "over the limit": what a verdict may keep before it
//! fails a gate. Every command's `--max-growth`, the Rust `LeakCheck` and
//! the pytest plugin (which passes its text through) decide by it.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use snapdiff_format::units::{format_size, parse_size};

use crate::trend::Trend;

/// What a limit counts of a verdict's suspects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    /// Their growth in all, after warm-up.
    #[default]
    All,
    /// Their growth a training step (a checkpoint, where steps are
    /// unknown).
    Step,
    /// Their growth a checkpoint.
    Checkpoint,
}

/// At most `bytes` kept after warm-up, in all or a step or a checkpoint:
/// `1MiB`, `256B/step`, `4KiB/checkpoint` as text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Limit {
    /// The most that may be kept.
    pub bytes: u64,
    /// What counts against it.
    pub per: Per,
}

/// A verdict over its limit: what was kept, as the limit counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Over {
    /// The limit.
    pub limit: Limit,
    /// What the suspects kept, as it counts.
    pub kept: u64,
}

impl Limit {
    /// At most `bytes` in all after warm-up.
    pub fn in_all(bytes: u64) -> Limit {
        Limit {
            bytes,
            per: Per::All,
        }
    }

    /// What `trend`'s suspects kept, as this limit counts: their growth in
    /// all, or added up a step (a checkpoint where steps are unknown), or
    /// a checkpoint.
    pub fn kept(&self, trend: &Trend) -> u64 {
        let each = trend.suspects.iter();
        match self.per {
            Per::All => trend.suspected_bytes,
            Per::Step => each
                .map(|s| (s.growth_per_step).map_or(s.growth_per_checkpoint, |b| b.round() as u64))
                .fold(0, u64::saturating_add),
            Per::Checkpoint => each
                .map(|s| s.growth_per_checkpoint)
                .fold(0, u64::saturating_add),
        }
    }

    /// Whether `trend` keeps more than this limit allows, and how much.
    /// A verdict of no suspects (among them "no verdict") is never over.
    pub fn over(&self, trend: &Trend) -> Option<Over> {
        let kept = self.kept(trend);
        (kept > self.bytes).then_some(Over { limit: *self, kept })
    }
}

impl Limit {
    /// `bytes` as this limit counts them: `8.00 KiB a step`.
    pub fn amount(&self, bytes: u64) -> String {
        let per = match self.per {
            Per::All => "",
            Per::Step => " a step",
            Per::Checkpoint => " a checkpoint",
        };
        format!("{}{per}", format_size(bytes))
    }
}

impl fmt::Display for Limit {
    /// `1.00 MiB`, `256 B a step`, `4.00 KiB a checkpoint`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.amount(self.bytes))
    }
}

impl fmt::Display for Over {
    /// `8.00 KiB a step kept after warm-up, over the 256 B a step allowed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} kept after warm-up, over the {} allowed",
            self.limit.amount(self.kept),
            self.limit
        )
    }
}

/// A limit's verdict on a trend, as `--json` gives it beside the trend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gate {
    /// The limit, in words: `256 B a step`.
    pub limit: String,
    /// What it counts.
    pub per: Per,
    /// The most that may be kept.
    pub bytes: u64,
    /// What the suspects kept, as it counts.
    pub kept: u64,
    /// Whether that is over the limit (the command then exits with 1).
    pub over: bool,
    /// In words: `16.00 KiB a step kept after warm-up, over the 1.00 KiB
    /// a step allowed`, or what was kept within it.
    pub said: String,
}

impl Limit {
    /// This limit's verdict on `trend`.
    pub fn gate(&self, trend: &Trend) -> Gate {
        let kept = self.kept(trend);
        let said = match self.over(trend) {
            Some(over) => over.to_string(),
            None => format!(
                "{} kept after warm-up, within the {} allowed",
                self.amount(kept),
                self
            ),
        };
        Gate {
            limit: self.to_string(),
            per: self.per,
            bytes: self.bytes,
            kept,
            over: kept > self.bytes,
            said,
        }
    }
}

/// Why a limit's text is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid limit '{0}', expected a size such as 1MiB, 256B/step or 4KiB/checkpoint")]
pub struct ParseLimitError(String);

impl FromStr for Limit {
    type Err = ParseLimitError;

    /// `1MiB` (in all), `256B/step` or `256B a step`, `4KiB/checkpoint`.
    fn from_str(text: &str) -> Result<Limit, ParseLimitError> {
        let err = || ParseLimitError(text.to_owned());
        let t = text.trim();
        let (size, per) = match t.split_once('/').or_else(|| t.split_once(" a ")) {
            Some((size, per)) => match per.trim() {
                "step" => (size, Per::Step),
                "checkpoint" => (size, Per::Checkpoint),
                _ => return Err(err()),
            },
            None => (t, Per::All),
        };
        let bytes = parse_size(size.trim()).map_err(|_| err())?;
        Ok(Limit { bytes, per })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_written_and_say_themselves() {
        let read = |t: &str| t.parse::<Limit>().unwrap();
        assert_eq!(read("1MiB"), Limit::in_all(1 << 20));
        assert_eq!(
            read("256B/step"),
            Limit {
                bytes: 256,
                per: Per::Step
            }
        );
        assert_eq!(read("256 B a step"), read("256B/step"));
        assert_eq!(read("4KiB/checkpoint").per, Per::Checkpoint);
        assert!("1MiB/epoch".parse::<Limit>().is_err());
        assert!("lots".parse::<Limit>().is_err());
        assert_eq!(read("256B/step").to_string(), "256 B a step");
        assert_eq!(read("1MiB").to_string(), "1.00 MiB");
    }
}
