//! A whole job's verdict as text: one screen for any number of ranks.

use snapdiff_format::DeviceName;
use std::io::{self, Write};

use snapdiff_fleet::{Fleet, Member, MemberGrowth};

use crate::TextOptions;
use crate::text::{count, grew, paths_base, size};

/// Findings shown of each kind; the rest are counted, and all are in JSON.
const SHOWN: usize = 8;
/// Ranks listed by name in one finding before the rest are counted.
const NAMED_RANKS: usize = 12;

/// `fleet` as `snapdiff fleet` prints it: what was read, the leaking lines
/// with the ranks they leak on, the imbalance between ranks, and where to
/// look next: `fleet --rank R PATHS`, `paths` being the paths read as a
/// shell takes them. At most about 40 lines, however many ranks.
pub fn write_text(
    fleet: &Fleet,
    paths: &str,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let devices_apart = fleet.devices > fleet.processes;
    let read = if fleet.files > 0 {
        format!(
            " from {} snapshot{} ({})",
            count(fleet.files as u64),
            plural(fleet.files),
            size(fleet.bytes)
        )
    } else {
        " from site tables".to_owned()
    };
    writeln!(
        out,
        "{} rank{} read{read}: {} steady, {} leaking{}",
        count(fleet.processes as u64),
        plural(fleet.processes),
        count(fleet.steady as u64),
        count(fleet.leaking as u64),
        match fleet.too_few_checkpoints {
            0 => String::new(),
            n => format!(", {} with too few checkpoints to judge", count(n as u64)),
        }
    )?;
    if !fleet.unreadable.is_empty() {
        let n = fleet.unreadable.len();
        writeln!(
            out,
            "{} file{} could not be read and {} left out:",
            count(n as u64),
            plural(n),
            if n == 1 { "is" } else { "are" }
        )?;
        for u in fleet.unreadable.iter().take(3) {
            writeln!(out, "  {}", one_line(&u.error, 160))?;
        }
        if n > 3 {
            writeln!(out, "  and {} more (all in --json)", count(n as u64 - 3))?;
        }
    }
    let base = paths_base(
        fleet
            .leaks
            .iter()
            .map(|l| &l.site)
            .chain(fleet.imbalance.iter().map(|i| &i.site)),
        options.full_paths,
    );
    let total = fleet.processes;
    if fleet.leaks.is_empty() && fleet.too_few_checkpoints == fleet.processes {
        writeln!(
            out,
            "\nno verdict: no rank has checkpoints enough to judge (warm-up and 3 more dumps \
             each, or one file whose trace shows its iterations); each rank's notes say why \
             (--json)"
        )?;
    } else if fleet.leaks.is_empty() {
        writeln!(out, "\nno rank's memory keeps growing at any line")?;
    } else {
        writeln!(out, "\nleaking lines (memory that keeps growing):")?;
        for leak in fleet.leaks.iter().take(SHOWN) {
            let members: Vec<&Member> = leak.members.iter().map(|m| &m.member).collect();
            let line = format!(
                "  {} ({} of {}): {}, {}",
                ranks_text(&members, devices_apart),
                count(members.len() as u64),
                count(total as u64),
                leak.site.culprit.display_from(&base),
                growth_text(&leak.members),
            );
            writeln!(out, "{}", grew(line, options.color))?;
            if let Some(h) = leak.held_by.first() {
                let what = match &h.container {
                    Some(c) => format!("{} (a {c})", h.owner),
                    None => h.owner.clone(),
                };
                let rate = match h.blocks_per_step {
                    Some(r) if r > 0.0 => format!(
                        ", +{r:.0} block{} a step",
                        if r.round() == 1.0 { "" } else { "s" }
                    ),
                    _ => String::new(),
                };
                writeln!(
                    out,
                    "      held by {}{rate}",
                    snapdiff_format::visible::escaped(&what)
                )?;
            }
        }
        if fleet.leaks.len() > SHOWN {
            writeln!(
                out,
                "  and {} more lines (all in --json)",
                count((fleet.leaks.len() - SHOWN) as u64)
            )?;
        }
    }
    write_outside(fleet, devices_apart, options, out)?;
    if !fleet.imbalance.is_empty() {
        let step = fleet.imbalance[0]
            .step
            .map_or("at the last checkpoint".to_owned(), |s| {
                format!("at step {s}")
            });
        writeln!(
            out,
            "\nimbalance {step} (ranks holding far more than the median rank; not growth):"
        )?;
        for found in fleet.imbalance.iter().take(SHOWN) {
            let members: Vec<&Member> = found.members.iter().map(|m| &m.member).collect();
            let (least, most) = min_max(found.members.iter().map(|m| m.excess_bytes));
            let excess = if least == most {
                size(least)
            } else {
                format!("{} to {}", size(least), size(most))
            };
            writeln!(
                out,
                "  {} hold{} {excess} more than the median ({}) at {}",
                ranks_text(&members, devices_apart),
                if members.len() == 1 { "s" } else { "" },
                size(found.median_bytes),
                found.site.culprit.display_from(&base),
            )?;
        }
        if fleet.imbalance.len() > SHOWN {
            writeln!(
                out,
                "  and {} more sites (all in --json)",
                count((fleet.imbalance.len() - SHOWN) as u64)
            )?;
        }
    }
    for note in fleet.notes.iter().take(3) {
        // A note may name processes from the files: escaped.
        writeln!(out, "\nnote: {}", snapdiff_format::visible::escaped(note))?;
    }
    if let Some(first) = fleet.leaks.first().and_then(|l| l.members.first()) {
        writeln!(
            out,
            "\none rank's full report: snapdiff fleet --rank {} {paths}",
            first
                .member
                .rank
                .map_or_else(|| shell_word(&first.member.process), |r| r.to_string())
        )?;
    }
    Ok(())
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `text` cut to `max` characters, on one line.
fn one_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_owned(),
    }
}

fn min_max(values: impl Iterator<Item = u64>) -> (u64, u64) {
    values.fold((u64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// How fast a line grows on its ranks: "+64.0 MiB a step each", or a range
/// when the ranks differ.
fn growth_text(members: &[MemberGrowth]) -> String {
    let per_step: Option<Vec<f64>> = members.iter().map(|m| m.growth_per_step).collect();
    let (values, unit): (Vec<u64>, &str) = match per_step {
        Some(v) => (v.iter().map(|x| x.round() as u64).collect(), "a step"),
        None => (
            members.iter().map(|m| m.growth_per_checkpoint).collect(),
            "a checkpoint",
        ),
    };
    let (least, most) = min_max(values.into_iter());
    let each = if members.len() > 1 { " each" } else { "" };
    if size(least) == size(most) {
        format!("+{} {unit}{each}", size(least))
    } else {
        format!("+{} to {} {unit}", size(least), size(most))
    }
}

/// Members as a short list: "ranks 0-15, 93" (with devices when ranks have
/// several), the first [`NAMED_RANKS`] runs named and the rest counted.
fn ranks_text(members: &[&Member], devices_apart: bool) -> String {
    let ranked = members.iter().all(|m| m.rank.is_some()) && !devices_apart;
    if !ranked {
        let names: Vec<String> = members
            .iter()
            .take(NAMED_RANKS)
            .map(|m| {
                // A name from a table is the file's text: escaped.
                let who = m.rank.map_or_else(
                    || snapdiff_format::visible::escaped(&m.process).into_owned(),
                    |r| format!("rank {r}"),
                );
                if devices_apart {
                    format!("{who} {}", DeviceName(m.device))
                } else {
                    who
                }
            })
            .collect();
        let more = members.len().saturating_sub(NAMED_RANKS);
        let mut text = names.join(", ");
        if more > 0 {
            text.push_str(&format!(" and {} more", count(more as u64)));
        }
        return text;
    }
    let mut ranks: Vec<u32> = members.iter().filter_map(|m| m.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for r in ranks.iter().copied() {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .take(NAMED_RANKS)
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    let mut text = format!(
        "rank{} {}",
        if ranks.len() == 1 { "" } else { "s" },
        shown.join(", ")
    );
    if runs.len() > NAMED_RANKS {
        let rest: u32 = runs[NAMED_RANKS..].iter().map(|(a, b)| b - a + 1).sum();
        text.push_str(&format!(" and {} more", count(u64::from(rest))));
    }
    text
}

/// The ranks whose memory outside the recorded sites keeps growing (their
/// RSS, their device's use beyond the allocator), each with its first
/// such line, as `trend` words it.
fn write_outside(
    fleet: &Fleet,
    devices_apart: bool,
    options: &TextOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let growing: Vec<(&Member, Vec<String>)> = fleet
        .members
        .iter()
        .filter_map(|m| {
            let lines = crate::outside::lines(m.outside.as_ref()?, options.color);
            (!lines.is_empty()).then_some((&m.member, lines))
        })
        .collect();
    if growing.is_empty() {
        return Ok(());
    }
    let members: Vec<&Member> = growing.iter().map(|(m, _)| *m).collect();
    writeln!(
        out,
        "\nmemory outside the recorded sites keeps growing on {} ({} of {}):",
        ranks_text(&members, devices_apart),
        count(members.len() as u64),
        count(fleet.processes as u64),
    )?;
    for (member, lines) in growing.iter().take(SHOWN) {
        writeln!(
            out,
            "  {}: {}",
            ranks_text(&[*member], devices_apart),
            lines[0]
        )?;
    }
    if growing.len() > SHOWN {
        writeln!(
            out,
            "  and {} more (all in --json)",
            count((growing.len() - SHOWN) as u64)
        )?;
    }
    Ok(())
}

/// `text` as one word of a POSIX shell's command line: as it is when it
/// holds only characters a shell leaves alone, else in single quotes;
/// control characters escaped, so that nothing from a file reaches the
/// terminal as is.
pub fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        return text.to_owned();
    }
    let quoted = format!("'{}'", text.replace('\'', r"'\''"));
    snapdiff_format::visible::escaped(&quoted).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(rank: u32) -> Member {
        Member {
            rank: Some(rank),
            process: format!("rank{rank}"),
            device: 0,
        }
    }

    #[test]
    fn rank_lists_are_runs() {
        let members: Vec<Member> = [0, 1, 2, 3, 7, 93].into_iter().map(member).collect();
        let refs: Vec<&Member> = members.iter().collect();
        assert_eq!(ranks_text(&refs, false), "ranks 0-3, 7, 93");
        let members: Vec<Member> = (0..40).map(|r| member(r * 2)).collect();
        let refs: Vec<&Member> = members.iter().collect();
        assert_eq!(
            ranks_text(&refs, false),
            "ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22 and 28 more"
        );
    }
}
