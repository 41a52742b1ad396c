//! `snapdiff pprof FILE -o OUT`.

use snapdiff_analyze::LiveMoment;

use crate::args::PprofArgs;
use crate::exit::Exit;
use crate::pictures;

/// The top-level entry point for `snapdiff pprof`.
pub(crate) fn run(PprofArgs { picture: args }: PprofArgs) -> anyhow::Result<Exit> {
    let moment = args.at.unwrap_or(LiveMoment::End);
    let drawn = pictures::sites_of(&args.files, args.diff, moment)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    crate::output::write_output(&args.output, args.force, |out| {
        snapdiff_render::pprof::write(&drawn, now, out)
    })?;
    Ok(Exit::Clean)
}
