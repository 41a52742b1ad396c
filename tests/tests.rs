//! End-to-end tests of the `snapdiff` binary and the library, against the
//! real PyTorch snapshots in `../shared/fixtures/torch/` and the project's
//! own fixtures.

// Helpers: temp dirs, running the binary, locating fixtures.
mod util;

// Reading every kind of file; fidelity against CPython; bad input.
mod format;

// The newest snapshot layout: pinned host memory, labels, pools, XPU.
mod newest_format;

// Hostile and odd input: memory bombs, shared records, escapes, races.
mod hostile;

// compare, trend and summary on real snapshots with injected leaks.
mod analyze;

// peak: the highest point of a trace, by site and category.
mod peak;

// Results on generated real-shaped files, against the build before the speed work.
mod real_shaped;

// Real PyTorch traces replayed through the runtime's allocator.
mod pytorch_replay;

// The runtime's allocator follows PyTorch's rules, event by event.
mod pytorch_rules;

// Leak verdicts on jobs replayed from the real traces.
mod verdicts;

// A generated job of many ranks, and the fleet verdict on it.
pub(crate) mod fleet;
mod fleet_job;

// capture and demo.
mod capture;

// capture of real PyTorch programs through the start-up hook.
mod torch_capture;

// watch and capture --watch: leaks found while the job runs.
mod watch;

// The snapdiff library: leak assertions, from a user's point of view.
mod library;

// One limit, one exit: trend, fleet, LeakCheck and the pytest plugin.
mod limits;

// Flame graphs, folded stacks and pprof profiles, read by their tools.
mod pictures;

// HTML reports, opened in a real browser.
mod report;

// Each command's text and JSON on the real fixtures, kept as golden files.
mod golden;

// The library from a crate outside the workspace, built as users build.
mod user_crate;

// The shape of the code: circles among modules held down.
mod architecture;

// The docs against the command: every command and flag in the synopsis.
mod docs;
