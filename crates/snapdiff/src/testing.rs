//! Leak assertions for tests.
//!
//! [`LeakCheck`] watches an [`Allocator`](crate::Allocator) during a test:
//! it takes a snapshot when it begins, one at each [`LeakCheck::step`], and
//! one when it finishes, and judges them as `snapdiff trend` and the pytest
//! plugin do: a site leaks when its memory keeps growing after warm-up (the
//! floor rule: the least it holds from each checkpoint on rises again and
//! again), and the check fails when the suspects kept more than the
//! [`Limit`] (`--max-growth`'s: in all, a step or a checkpoint). That rule
//! needs warm-up and three checkpoints more; with fewer there is no
//! verdict, and the check fails saying so.
//!
//! [`LeakOptions::strict`] is the stricter rule, for checks of a step or
//! two: every site that holds more at the end than at the end of warm-up
//! fails it, one-time allocations included (activations that come and go
//! still do not count). [`assert_no_leaks_between`] judges two snapshot
//! files from any producer, PyTorch pickles included, by it.

use std::fmt;
use std::path::{Path, PathBuf};

use regex::Regex;
use snapdiff_analyze::{
    Change, Culprit, CulpritRules, GroupDiff, Limit, Site, SiteFrame, StackKey, Suspect,
    TrendOptions, kept_since, trend_snapshots,
};
use snapdiff_format::Snapshot;
use snapdiff_render::TextOptions;

/// How much growth to allow and which sites to leave out of a check.
///
/// ```
/// use snapdiff::testing::LeakOptions;
/// let options = LeakOptions::new().max_growth(1 << 20).ignore("warm_cache");
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct LeakOptions {
    limit: Limit,
    strict: bool,
    ignore: Vec<Regex>,
    only: Vec<Regex>,
}

impl Default for LeakOptions {
    fn default() -> Self {
        LeakOptions {
            limit: Limit::in_all(0),
            strict: false,
            ignore: Vec::new(),
            only: Vec::new(),
        }
    }
}

/// Compiles a pattern given to [`LeakOptions`], panicking with a clear
/// message when it is not a regular expression (a mistake in the test).
fn pattern(text: &str) -> Regex {
    Regex::new(text).unwrap_or_else(|e| panic!("snapdiff: invalid pattern {text:?}: {e}"))
}

impl LeakOptions {
    /// No allowance, nothing left out.
    ///
    /// ```
    /// let options = snapdiff::testing::LeakOptions::new();
    /// # let _ = options;
    /// ```
    pub fn new() -> LeakOptions {
        LeakOptions::default()
    }

    /// Passes when the sites together kept at most `bytes` more after
    /// warm-up than at its end: the limit that is `--max-growth` for the
    /// command and `max_growth` for the pytest plugin.
    ///
    /// ```
    /// let options = snapdiff::testing::LeakOptions::new().max_growth(4096);
    /// # let _ = options;
    /// ```
    pub fn max_growth(self, bytes: u64) -> LeakOptions {
        self.limit(Limit::in_all(bytes))
    }

    /// Passes when the sites kept at most `limit`: in all, a step or a
    /// checkpoint, as `--max-growth LIMIT` reads it (`"256B/step"`).
    ///
    /// ```
    /// let limit = "256B/step".parse().unwrap();
    /// let options = snapdiff::testing::LeakOptions::new().limit(limit);
    /// # let _ = options;
    /// ```
    pub fn limit(mut self, limit: Limit) -> LeakOptions {
        self.limit = limit;
        self
    }

    /// Judges by the strict rule (see the [module documentation](self)):
    /// every site holding more at the end than at the end of warm-up
    /// counts, growing once or again and again; a check of two checkpoints
    /// has a verdict. The limit counts in all.
    ///
    /// ```
    /// let options = snapdiff::testing::LeakOptions::new().strict();
    /// # let _ = options;
    /// ```
    pub fn strict(mut self) -> LeakOptions {
        self.strict = true;
        self
    }

    /// The earlier name of [`max_growth`](LeakOptions::max_growth).
    pub fn allow_bytes(self, bytes: u64) -> LeakOptions {
        self.max_growth(bytes)
    }

    /// Leaves out sites with a frame matching `pattern`, a regular expression
    /// matched against `function file:line`.
    ///
    /// # Panics
    ///
    /// When `pattern` is not a valid regular expression.
    ///
    /// ```
    /// let options = snapdiff::testing::LeakOptions::new().ignore(r"cache\.rs");
    /// # let _ = options;
    /// ```
    pub fn ignore(mut self, pattern_text: &str) -> LeakOptions {
        self.ignore.push(pattern(pattern_text));
        self
    }

    /// Keeps only sites with a frame matching `pattern` (`function file:line`).
    ///
    /// # Panics
    ///
    /// When `pattern` is not a valid regular expression.
    ///
    /// ```
    /// let options = snapdiff::testing::LeakOptions::new().only("train_step");
    /// # let _ = options;
    /// ```
    pub fn only(mut self, pattern_text: &str) -> LeakOptions {
        self.only.push(pattern(pattern_text));
        self
    }

    fn keeps(&self, site: &Site) -> bool {
        let texts: Vec<String> = site
            .frames
            .iter()
            .map(|f| format!("{} {}:{}", f.name, f.file, f.line))
            .collect();
        let any = |res: &[Regex]| res.iter().any(|re| texts.iter().any(|t| re.is_match(t)));
        !any(&self.ignore) && (self.only.is_empty() || any(&self.only))
    }
}

/// A site that kept memory.
#[derive(Clone, Debug)]
pub struct LeakGroup {
    /// The site's memory at the end of warm-up and at the end, as the floors
    /// of its live bytes and blocks: the row a failure message shows.
    diff: GroupDiff,
}

impl LeakGroup {
    /// The frame of your code to look at.
    ///
    /// ```
    /// # use snapdiff::testing::*;
    /// # let report = LeakReport::between(&[snapdiff::Snapshot::default(), snapdiff::Snapshot::default()], 0, &LeakOptions::new());
    /// for g in report.groups() {
    ///     println!("{}", g.culprit().display());
    /// }
    /// ```
    pub fn culprit(&self) -> &Culprit {
        &self.diff.site.culprit
    }

    /// The site's stack without allocator and interpreter frames, innermost first.
    ///
    /// ```
    /// # use snapdiff::testing::*;
    /// # let report = LeakReport::between(&[snapdiff::Snapshot::default(), snapdiff::Snapshot::default()], 0, &LeakOptions::new());
    /// for g in report.groups() {
    ///     assert!(!g.frames().is_empty() || g.culprit().name.is_empty());
    /// }
    /// ```
    pub fn frames(&self) -> &[SiteFrame] {
        &self.diff.site.frames
    }

    /// Bytes the site kept.
    ///
    /// ```
    /// # use snapdiff::testing::*;
    /// # let report = LeakReport::between(&[snapdiff::Snapshot::default(), snapdiff::Snapshot::default()], 0, &LeakOptions::new());
    /// let total: u64 = report.groups().iter().map(|g| g.delta_bytes()).sum();
    /// assert_eq!(total, report.leaked_bytes());
    /// ```
    pub fn delta_bytes(&self) -> u64 {
        self.diff.delta_bytes.unsigned_abs()
    }

    /// Blocks the site kept.
    ///
    /// ```
    /// # use snapdiff::testing::*;
    /// # let report = LeakReport::between(&[snapdiff::Snapshot::default(), snapdiff::Snapshot::default()], 0, &LeakOptions::new());
    /// assert!(report.groups().iter().all(|g| g.blocks() > 0));
    /// ```
    pub fn blocks(&self) -> u64 {
        self.diff
            .blocks_after
            .saturating_sub(self.diff.blocks_before)
    }

    /// The site's stack key.
    ///
    /// ```
    /// # use snapdiff::testing::*;
    /// # let report = LeakReport::between(&[snapdiff::Snapshot::default(), snapdiff::Snapshot::default()], 0, &LeakOptions::new());
    /// for g in report.groups() {
    ///     println!("{}", g.key());
    /// }
    /// ```
    pub fn key(&self) -> StackKey {
        self.diff.site.key
    }
}

/// The outcome of a leak check: the sites that kept memory, most first.
///
/// Its `Display` is the report a failed assertion prints.
#[derive(Clone, Debug)]
pub struct LeakReport {
    groups: Vec<LeakGroup>,
    limit: Limit,
    /// What the sites kept, as the limit counts it.
    kept: u64,
    /// Why there is no verdict (too few checkpoints for the floor rule).
    no_verdict: Option<String>,
    checkpoints: usize,
    /// The two snapshots compared, when written to files.
    files: Option<(PathBuf, PathBuf)>,
}

impl LeakReport {
    /// The report over checkpoints `points` (oldest first), the first
    /// `warmup` of them after the first being warm-up.
    ///
    /// ```
    /// use snapdiff::testing::{LeakOptions, LeakReport};
    /// let same = vec![snapdiff::Snapshot::default(); 4];
    /// assert!(LeakReport::between(&same, 1, &LeakOptions::new()).is_clean());
    /// ```
    pub fn between(points: &[Snapshot], warmup: usize, options: &LeakOptions) -> LeakReport {
        let mut report = LeakReport {
            groups: Vec::new(),
            limit: options.limit,
            kept: 0,
            no_verdict: None,
            checkpoints: points.len(),
            files: None,
        };
        if options.strict {
            let rules = CulpritRules::default();
            let kept = kept_since(points, warmup, &rules, |site| options.keeps(site));
            report.kept = kept.iter().map(|d| d.delta_bytes.unsigned_abs()).sum();
            report.limit.per = snapdiff_analyze::Per::All;
            report.groups = kept.into_iter().map(|diff| LeakGroup { diff }).collect();
            return report;
        }
        let mut trend_options = TrendOptions::default();
        trend_options.warmup = warmup;
        let mut trend = trend_snapshots(points, &trend_options);
        trend.suspects.retain(|s| options.keeps(&s.site));
        trend.suspected_bytes = trend.suspects.iter().map(|s| s.growth_bytes).sum();
        report.kept = options.limit.kept(&trend);
        report.no_verdict = trend.no_verdict.take();
        report.groups = (trend.suspects.iter())
            .map(|s| LeakGroup {
                diff: kept_row(s, trend.warmup),
            })
            .collect();
        report
    }

    /// Bytes kept by all sites together.
    ///
    /// ```
    /// # use snapdiff::testing::*;
    /// # let report = LeakReport::between(&[snapdiff::Snapshot::default(), snapdiff::Snapshot::default()], 0, &LeakOptions::new());
    /// assert!(report.leaked_bytes() <= 1 << 20);
    /// ```
    pub fn leaked_bytes(&self) -> u64 {
        self.groups.iter().map(|g| g.delta_bytes()).sum()
    }

    /// What the sites kept as the limit counts it: [`leaked_bytes`](Self::leaked_bytes)
    /// for a limit in all, or their growth a step or a checkpoint.
    pub fn kept(&self) -> u64 {
        self.kept
    }

    /// Why the check has no verdict, when it has none: too few checkpoints
    /// for the floor rule (see the [module documentation](self)).
    pub fn no_verdict(&self) -> Option<&str> {
        self.no_verdict.as_deref()
    }

    /// The sites that kept memory, most first.
    ///
    /// ```
    /// # use snapdiff::testing::*;
    /// # let report = LeakReport::between(&[snapdiff::Snapshot::default(), snapdiff::Snapshot::default()], 0, &LeakOptions::new());
    /// assert!(report.groups().is_empty());
    /// ```
    pub fn groups(&self) -> &[LeakGroup] {
        &self.groups
    }

    /// Whether there is a verdict and at most the allowed bytes leaked.
    ///
    /// ```
    /// # use snapdiff::testing::*;
    /// # let report = LeakReport::between(&[snapdiff::Snapshot::default(), snapdiff::Snapshot::default()], 0, &LeakOptions::new().strict());
    /// assert!(report.is_clean());
    /// ```
    pub fn is_clean(&self) -> bool {
        self.no_verdict.is_none() && self.kept <= self.limit.bytes
    }
}

impl fmt::Display for LeakReport {
    /// The sites as `snapdiff compare` shows them, through the same
    /// renderer: before is the end of warm-up, after the end, and each
    /// site's bytes are the least it held from that checkpoint on.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.groups.len();
        if let Some(why) = &self.no_verdict {
            return write!(
                f,
                "snapdiff: no verdict: {why}; take more steps, or judge by the strict rule \
                 (LeakOptions::strict)"
            );
        }
        if n == 0 {
            return write!(
                f,
                "snapdiff: no site kept memory over {} checkpoints",
                self.checkpoints
            );
        }
        writeln!(
            f,
            "snapdiff: {n} site{} kept {} more (allowed: {}):",
            if n == 1 { "" } else { "s" },
            self.limit.amount(self.kept),
            self.limit
        )?;
        let diffs: Vec<GroupDiff> = self.groups.iter().map(|g| g.diff.clone()).collect();
        let options = TextOptions {
            top: 0,
            frames: STACK_FRAMES,
            // A test's own paths are short, and the note that would say
            // where shortened ones start from names a command-line flag.
            full_paths: true,
            color: false,
            // Test runners' messages are read where no terminal width is
            // known: long paths are cut from the left to fit.
            width: Some(FAILURE_WIDTH),
        };
        let mut table = Vec::new();
        snapdiff_render::compare::write_sites(&diffs, self.leaked_bytes(), &options, &mut table)
            .map_err(|_| fmt::Error)?;
        f.write_str(&String::from_utf8_lossy(&table))?;
        if let Some((before, after)) = &self.files {
            write!(
                f,
                "look closer: snapdiff compare {} {} --frames 8",
                before.display(),
                after.display()
            )?;
        }
        Ok(())
    }
}

/// A suspect as a failure's row: from the end of warm-up to the end, each
/// figure the least the site held from that checkpoint on.
fn kept_row(suspect: &Suspect, warmup: usize) -> GroupDiff {
    let floor_blocks = |at: usize| suspect.blocks[at..].iter().copied().min().unwrap_or(0);
    let last = suspect.floor.len().saturating_sub(1);
    let from = warmup.min(last);
    let (before, after) = (suspect.floor[from], suspect.floor[last]);
    GroupDiff {
        site: suspect.site.clone(),
        change: if before == 0 {
            Change::New
        } else {
            Change::Grown
        },
        blocks_before: floor_blocks(from),
        blocks_after: floor_blocks(last),
        bytes_before: before,
        bytes_after: after,
        delta_bytes: suspect.growth_bytes as i64,
        allocated_before: before,
        allocated_after: after,
        blocks_kept: 0,
        held_by: suspect.held_by.clone(),
        moved_from: None,
    }
}

/// Frames of each site's stack a failure message shows under its culprit.
const STACK_FRAMES: usize = 4;
/// The columns a failure's table fits in: test runners show messages where
/// no terminal says its width.
const FAILURE_WIDTH: u16 = 100;

/// Panics with the report, naming the files, when the report is not clean.
fn assert_clean(report: LeakReport) {
    if !report.is_clean() {
        panic!("{report}");
    }
}

/// Asserts that no site holds more memory in snapshot file `after` than in
/// `before`, beyond what `options` allow, by the strict rule (two
/// snapshots have no trend; see [`LeakOptions::strict`]). The files can
/// come from any producer: `snapdiff-runtime`, or PyTorch's
/// `_dump_snapshot`.
///
/// # Panics
///
/// With the leak report when something leaked, and with the reason when a
/// file cannot be read.
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("snapdiff-doc-between-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # snapdiff::format::write_path(dir.join("a.snap"), &snapdiff::Snapshot::default(), snapdiff::format::Existing::Replace).unwrap();
/// # snapdiff::format::write_path(dir.join("b.snap"), &snapdiff::Snapshot::default(), snapdiff::format::Existing::Replace).unwrap();
/// use snapdiff::testing::{LeakOptions, assert_no_leaks_between};
/// assert_no_leaks_between(dir.join("a.snap"), dir.join("b.snap"), &LeakOptions::new());
/// ```
pub fn assert_no_leaks_between(
    before: impl AsRef<Path>,
    after: impl AsRef<Path>,
    options: &LeakOptions,
) {
    let (before, after) = (before.as_ref(), after.as_ref());
    let read = |p: &Path| snapdiff_format::read_path(p).unwrap_or_else(|e| panic!("snapdiff: {e}"));
    let strict = options.clone().strict();
    let mut report = LeakReport::between(&[read(before), read(after)], 0, &strict);
    report.files = Some((before.to_path_buf(), after.to_path_buf()));
    assert_clean(report);
}

#[cfg(feature = "runtime")]
pub use self::check::LeakCheck;

#[cfg(feature = "runtime")]
mod check {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::{LeakOptions, LeakReport, assert_clean};
    use crate::{Allocator, Snapshot};

    /// Watches an allocator during a test; see the [module documentation](super).
    ///
    /// ```
    /// use snapdiff::testing::LeakCheck;
    /// use snapdiff::{Allocator, HostBackend, Stream};
    ///
    /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
    /// let weights = a.alloc(1 << 20, Stream::DEFAULT).unwrap(); // before: not counted
    /// let check = LeakCheck::begin(&a).warmup(1);
    /// for _ in 0..5 {
    ///     let activations = a.alloc(4 << 20, Stream::DEFAULT).unwrap();
    ///     drop(activations);
    ///     check.step();
    /// }
    /// check.assert_no_leaks();
    /// # drop(weights);
    /// ```
    pub struct LeakCheck<'a> {
        alloc: &'a Allocator,
        options: LeakOptions,
        warmup: usize,
        points: RefCell<Vec<Snapshot>>,
    }

    impl<'a> LeakCheck<'a> {
        /// Starts checking `alloc`: what is live now is the baseline.
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a).strict();
        /// check.assert_no_leaks();
        /// ```
        pub fn begin(alloc: &'a Allocator) -> LeakCheck<'a> {
            LeakCheck {
                alloc,
                options: LeakOptions::default(),
                warmup: 0,
                points: RefCell::new(vec![alloc.snapshot()]),
            }
        }

        /// Treats the first `steps` steps as warm-up: what they allocate and
        /// keep (weights, optimizer state, caches) is not a leak.
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend, Stream};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a).warmup(1);
        /// let state = a.alloc(1 << 20, Stream::DEFAULT).unwrap(); // first step: kept, but once
        /// check.step();
        /// check.step();
        /// check.assert_no_leaks();
        /// # drop(state);
        /// ```
        pub fn warmup(mut self, steps: usize) -> LeakCheck<'a> {
            self.warmup = steps;
            self
        }

        /// Passes when the sites together kept at most `bytes` more after
        /// warm-up (see [`LeakOptions::max_growth`]).
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend, Stream};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a).max_growth(4096);
        /// let mut kept = Vec::new();
        /// for _ in 0..4 {
        ///     kept.push(a.alloc(100, Stream::DEFAULT).unwrap());
        ///     check.step();
        /// }
        /// check.assert_no_leaks(); // 400 bytes kept, 4096 allowed
        /// ```
        pub fn max_growth(mut self, bytes: u64) -> LeakCheck<'a> {
            self.options = self.options.max_growth(bytes);
            self
        }

        /// Passes when the sites kept at most `limit`: in all, a step or a
        /// checkpoint (see [`LeakOptions::limit`]).
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a).limit("1KiB/step".parse().unwrap());
        /// # let _ = check;
        /// ```
        pub fn limit(mut self, limit: snapdiff_analyze::Limit) -> LeakCheck<'a> {
            self.options = self.options.limit(limit);
            self
        }

        /// Judges by the strict rule (see [`LeakOptions::strict`]): a check
        /// of a step or two has a verdict.
        ///
        /// ```should_panic
        /// # use snapdiff::{Allocator, HostBackend, Stream};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a).strict();
        /// let kept = a.alloc(1000, Stream::DEFAULT).unwrap();
        /// check.assert_no_leaks(); // panics: 1 site kept 1000 B more
        /// # drop(kept);
        /// ```
        pub fn strict(mut self) -> LeakCheck<'a> {
            self.options = self.options.strict();
            self
        }

        /// The earlier name of [`max_growth`](LeakCheck::max_growth).
        pub fn allow_bytes(self, bytes: u64) -> LeakCheck<'a> {
            self.max_growth(bytes)
        }

        /// Leaves out sites with a frame matching `pattern` (`function file:line`).
        ///
        /// # Panics
        ///
        /// When `pattern` is not a valid regular expression.
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend, Stream};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a).ignore("rust_out");
        /// # let _ = check;
        /// ```
        pub fn ignore(mut self, pattern: &str) -> LeakCheck<'a> {
            self.options = self.options.ignore(pattern);
            self
        }

        /// Keeps only sites with a frame matching `pattern` (`function file:line`).
        ///
        /// # Panics
        ///
        /// When `pattern` is not a valid regular expression.
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend, Stream};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a).only("train_step");
        /// # let _ = check;
        /// ```
        pub fn only(mut self, pattern: &str) -> LeakCheck<'a> {
            self.options = self.options.only(pattern);
            self
        }

        /// Marks the end of a training step: a checkpoint.
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a);
        /// check.step();
        /// ```
        pub fn step(&self) {
            self.points.borrow_mut().push(self.alloc.snapshot());
        }

        /// The report, without panicking: for custom assertions.
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend, Stream};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a).strict();
        /// let kept = a.alloc(1000, Stream::DEFAULT).unwrap();
        /// let report = check.finish();
        /// assert_eq!(report.leaked_bytes(), 1000); // requested; the allocator rounded it to 1 KiB
        /// assert_eq!(report.groups()[0].blocks(), 1);
        /// # drop(kept);
        /// ```
        pub fn finish(&self) -> LeakReport {
            let mut points = self.points.borrow().clone();
            points.push(self.alloc.snapshot());
            LeakReport::between(&points, self.warmup, &self.options)
        }

        /// Checks the steps so far against the baseline file at `path` (the
        /// file `snapdiff baseline` writes and `snapdiff check` reads; under
        /// `cargo test` a relative path is from the crate's root), writing
        /// it instead when it is missing or `SNAPDIFF_UPDATE_BASELINES` is
        /// set: commit it.
        ///
        /// # Panics
        ///
        /// Naming each site whose memory at the peak (or growth after
        /// warm-up) rose by more than `tolerance` (5% and 1 MiB by default)
        /// over the baseline, and when the file cannot be read or written.
        ///
        /// ```
        /// # use snapdiff::{Allocator, HostBackend, Stream};
        /// # let dir = std::env::temp_dir().join(format!("snapdiff-doc-{}", std::process::id()));
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a);
        /// let buffer = a.alloc(1 << 20, Stream::DEFAULT).unwrap();
        /// check.step();
        /// let file = dir.join("memory.json");
        /// check.assert_within_baseline(&file, Default::default()); // written
        /// check.assert_within_baseline(&file, Default::default()); // within it
        /// # drop(buffer);
        /// # std::fs::remove_dir_all(dir).unwrap();
        /// ```
        pub fn assert_within_baseline(
            &self,
            path: impl AsRef<std::path::Path>,
            tolerance: snapdiff_analyze::baseline::Tolerance,
        ) {
            use snapdiff_analyze::baseline::{Baseline, check};
            use snapdiff_analyze::{CulpritRules, TrendOptions, trend_snapshots};
            let path = path.as_ref();
            let mut points = self.points.borrow().clone();
            points.push(self.alloc.snapshot());
            let mut options = TrendOptions::default();
            options.warmup = self.warmup;
            let trend = trend_snapshots(&points, &options);
            let run = Baseline::of(&points, Some(&trend), &CulpritRules::default());
            let update = std::env::var_os("SNAPDIFF_UPDATE_BASELINES").is_some();
            if update || !path.exists() {
                let text = serde_json::to_string_pretty(&run).expect("a baseline is JSON") + "\n";
                if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(folder)
                        .unwrap_or_else(|e| panic!("{}: cannot create ({e})", folder.display()));
                }
                std::fs::write(path, text)
                    .unwrap_or_else(|e| panic!("{}: cannot write ({e})", path.display()));
                return;
            }
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("{}: cannot read ({e})", path.display()));
            let baseline: Baseline = serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!("{}: not a snapdiff baseline file ({e})", path.display())
            });
            let checked = check(&baseline, &run, tolerance);
            if !checked.over.is_empty() {
                let mut message = Vec::new();
                snapdiff_render::baseline::write_check(
                    &checked,
                    &path.display().to_string(),
                    tolerance,
                    &mut message,
                )
                .expect("writing to memory");
                panic!("{}", String::from_utf8_lossy(&message));
            }
        }

        /// Panics with a report when a site kept more memory than allowed,
        /// after writing the two snapshots compared to files the report names.
        ///
        /// # Panics
        ///
        /// When something leaked.
        ///
        /// ```should_panic
        /// # use snapdiff::{Allocator, HostBackend, Stream};
        /// let a = Allocator::new(HostBackend::with_capacity(1 << 30));
        /// let check = snapdiff::testing::LeakCheck::begin(&a);
        /// let mut kept = Vec::new();
        /// for _ in 0..4 {
        ///     kept.push(a.alloc(1000, Stream::DEFAULT).unwrap());
        ///     check.step();
        /// }
        /// check.assert_no_leaks(); // panics: 1 site kept 4000 B more
        /// # drop(kept);
        /// ```
        pub fn assert_no_leaks(&self) {
            let mut points = self.points.borrow().clone();
            points.push(self.alloc.snapshot());
            let mut report = LeakReport::between(&points, self.warmup, &self.options);
            if !report.is_clean() {
                let from = self.warmup.min(points.len() - 1);
                report.files = write_pair(&points[from], &points[points.len() - 1]);
            }
            assert_clean(report);
        }
    }

    /// Writes the two snapshots of a failed check to a fresh temporary
    /// folder, for `snapdiff compare`; `None` if that fails.
    fn write_pair(
        before: &Snapshot,
        after: &Snapshot,
    ) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "snapdiff-leakcheck-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).ok()?;
        let (b, a) = (dir.join("before.snap"), dir.join("after.snap"));
        snapdiff_format::write_path(&b, before, snapdiff_format::Existing::Replace).ok()?;
        snapdiff_format::write_path(&a, after, snapdiff_format::Existing::Replace).ok()?;
        Some((b, a))
    }
}
