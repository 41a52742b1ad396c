//! `snapdiff flamegraph FILE -o OUT`.

use anyhow::bail;
use snapdiff_analyze::LiveMoment;

use crate::args::FlamegraphArgs;
use crate::exit::Exit;
use snapdiff_render::flamegraph::{Drawn, folded_lines, write_svg};

use crate::pictures;

/// The top-level entry point for `snapdiff flamegraph`.
pub(crate) fn run(
    FlamegraphArgs {
        picture: args,
        folded: as_folded,
    }: FlamegraphArgs,
) -> anyhow::Result<Exit> {
    let moment = args.at.unwrap_or(LiveMoment::End);
    let drawn = pictures::sites_of(&args.files, args.diff, moment)?;
    let empty = match &drawn {
        Drawn::One(sites) => sites.iter().all(|s| s.bytes == 0),
        Drawn::Diff(pairs) => pairs.is_empty(),
    };
    if empty {
        bail!(
            "{}: nothing live to draw at that moment",
            args.files[0].display()
        );
    }
    let names: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    let title = if args.diff {
        format!(
            "Growth of live memory by stack: {} to {}",
            names[0], names[1]
        )
    } else {
        format!("Live memory by stack: {}", names[0])
    };
    crate::output::write_output(&args.output, args.force, |out| {
        if as_folded {
            for line in folded_lines(&drawn) {
                writeln!(out, "{line}")?;
            }
            Ok(())
        } else {
            write_svg(&drawn, &title, out)
        }
    })?;
    Ok(Exit::Clean)
}
