//! `snapdiff convert IN OUT`.

use anyhow::bail;
use snapdiff_format::Existing;

use crate::args::ConvertArgs;
use crate::exit::Exit;

/// The top-level entry point for `snapdiff convert`.
pub(crate) fn run(args: ConvertArgs) -> anyhow::Result<Exit> {
    let ext = args.output.extension().and_then(|e| e.to_str());
    if !matches!(ext, Some("snap" | "json" | "pickle" | "pkl")) {
        bail!(
            "{}: cannot tell the output format: name it .snap, .json or .pickle",
            args.output.display()
        );
    }
    if args.output.exists() && !args.force {
        bail!(
            "{}: already exists; pass --force to replace it",
            args.output.display()
        );
    }
    let mut snap = crate::input::read(&args.input)?;
    // Readers keep frames in first-seen order; sorted, they compress far better.
    snap.sort_frames();
    // Checked again as the file is put in place: two runs racing to one
    // output cannot both succeed without --force.
    let existing = if args.force {
        Existing::Replace
    } else {
        Existing::Keep
    };
    snapdiff_format::write_path(&args.output, &snap, existing).map_err(|e| {
        let exists = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AlreadyExists);
        if exists {
            anyhow::anyhow!(
                "{}: already exists; pass --force to replace it",
                args.output.display()
            )
        } else {
            e.into()
        }
    })?;
    Ok(Exit::Clean)
}
