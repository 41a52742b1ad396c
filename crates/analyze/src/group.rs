//! Live blocks grouped by allocation site, and how a site is described.

use std::sync::OnceLock;

use rayon::prelude::*;
use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_format::{Block, FrameId, Snapshot, StackId};

use crate::culprit::{Culprit, CulpritKind, CulpritRules, FrameRole};
use crate::recorded::{Recorded, recorded_by_stack};
use crate::stack_key::{StackKey, StackKeys};

/// Blocks and bytes of one group.
///
/// Bytes are what the program asked for (`requested_size`), the unit of
/// every report: the allocator rounds each request up, and the same blocks
/// carved from different segments round differently, which is slack, not
/// growth. The rounded sizes are kept beside them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteTotals {
    /// Number of blocks.
    pub blocks: u64,
    /// Sum of the bytes requested.
    pub bytes: u64,
    /// Sum of the blocks' allocated (rounded) sizes.
    pub allocated: u64,
}

impl SiteTotals {
    /// Adds one block.
    pub fn add(&mut self, block: &Block) {
        self.add_bytes(requested(block), block.size);
    }

    /// Adds one block of `requested` bytes, `allocated` once rounded.
    pub fn add_bytes(&mut self, requested: u64, allocated: u64) {
        // Saturating, here and in `merge`: sizes come from files, and a
        // forged one must not wrap a sum to a small number.
        self.blocks += 1;
        self.bytes = self.bytes.saturating_add(requested);
        self.allocated = self.allocated.saturating_add(allocated);
    }

    /// Takes away one block added by [`SiteTotals::add_bytes`].
    pub fn remove_bytes(&mut self, requested: u64, allocated: u64) {
        self.blocks = self.blocks.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(requested);
        self.allocated = self.allocated.saturating_sub(allocated);
    }

    /// Adds another site's (or chunk's) totals.
    pub fn merge(&mut self, other: SiteTotals) {
        self.blocks = self.blocks.saturating_add(other.blocks);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.allocated = self.allocated.saturating_add(other.allocated);
    }
}

/// The bytes `block` was asked for: its `requested_size`, or its size when
/// the file does not record one.
pub fn requested(block: &Block) -> u64 {
    match block.requested_size {
        0 => block.size,
        r => r,
    }
}

/// The live blocks of one snapshot, by site.
#[derive(Clone, Debug, Default)]
pub(crate) struct LiveGroups {
    /// Totals per site.
    pub totals: FxHashMap<StackKey, SiteTotals>,
    /// One stack of each site, to describe it.
    pub stacks: FxHashMap<StackKey, Option<StackId>>,
}

/// A block that counts as live: allocated, or freed but still in use by a stream.
pub(crate) fn is_live(b: &Block) -> bool {
    b.state.is_active()
}

/// Groups the live blocks of `snap`'s devices (pinned host memory is not
/// one) by the key of their stack.
pub(crate) fn live_groups(snap: &Snapshot, keys: &StackKeys) -> LiveGroups {
    let mut by_stack = LiveByStack::new(snap);
    for b in snap.device_segments().flat_map(|s| &s.blocks) {
        by_stack.add(b);
    }
    by_stack.into_groups(keys)
}

/// Live blocks summed by stack id, on the way to [`LiveGroups`].
///
/// A snapshot has millions of blocks on tens of thousands of stacks: a
/// table indexed by stack id takes each block in a few nanoseconds, where
/// a hash lookup by key took most of the time of grouping. Each site's
/// stack is that of its first block, in the order blocks were added.
pub(crate) struct LiveByStack {
    /// Slot 0 for blocks without a stack, slot `id + 1` for stack `id`.
    totals: Vec<SiteTotals>,
    /// The stacks with live blocks, in the order of their first.
    first_seen: Vec<Option<StackId>>,
}

impl LiveByStack {
    pub(crate) fn new(snap: &Snapshot) -> LiveByStack {
        LiveByStack {
            totals: vec![SiteTotals::default(); snap.stacks.len() + 1],
            first_seen: Vec::new(),
        }
    }

    /// Adds `block` if it is live.
    #[inline]
    pub(crate) fn add(&mut self, block: &Block) {
        if !is_live(block) {
            return;
        }
        let slot = &mut self.totals[block.stack.map_or(0, |id| id as usize + 1)];
        if slot.blocks == 0 {
            self.first_seen.push(block.stack);
        }
        slot.add(block);
    }

    /// The sums by site.
    pub(crate) fn into_groups(self, keys: &StackKeys) -> LiveGroups {
        let mut groups = LiveGroups::default();
        for stack in self.first_seen {
            let key = keys.key(stack);
            let t = self.totals[stack.map_or(0, |id| id as usize + 1)];
            groups.totals.entry(key).or_default().merge(t);
            groups.stacks.entry(key).or_insert(stack);
        }
        groups
    }
}

/// The live blocks of one device of a snapshot, by site.
#[derive(Clone, Debug, Default)]
pub struct DeviceSites {
    /// The device.
    pub device: u32,
    /// Live blocks and bytes per site.
    pub totals: FxHashMap<StackKey, SiteTotals>,
    /// One stack of each site, to describe it.
    pub stacks: FxHashMap<StackKey, Option<StackId>>,
}

/// The live blocks of `snap` by device and site, devices in ascending
/// order; a device with segments but no live block is listed, empty.
/// Pinned host memory is no device and is left out.
pub fn live_sites_by_device(snap: &Snapshot, keys: &StackKeys) -> Vec<DeviceSites> {
    let mut devices: Vec<DeviceSites> = Vec::new();
    for segment in snap.device_segments() {
        let at = match devices.binary_search_by_key(&segment.device, |d| d.device) {
            Ok(at) => at,
            Err(at) => {
                devices.insert(
                    at,
                    DeviceSites {
                        device: segment.device,
                        ..DeviceSites::default()
                    },
                );
                at
            }
        };
        let sites = &mut devices[at];
        for b in segment.blocks.iter().filter(|b| is_live(b)) {
            let key = keys.key(b.stack);
            sites.totals.entry(key).or_default().add(b);
            sites.stacks.entry(key).or_insert(b.stack);
        }
    }
    devices
}

/// A frame as reports show it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct SiteFrame {
    /// Function name.
    pub name: String,
    /// Source file.
    pub file: String,
    /// Line number.
    pub line: u32,
}

/// An allocation site: its key, its culprit and its stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Site {
    /// The stack key, as 16 hex digits in JSON.
    pub key: StackKey,
    /// The frame to look at first.
    pub culprit: Culprit,
    /// The stack without allocator, interpreter and dispatcher frames, innermost first.
    pub frames: Vec<SiteFrame>,
    /// How many stacks the row stands for: more than one when sites whose
    /// culprits are the same line were merged (see
    /// [`CulpritRules::with_rows_by_stack`]); then `key` and `frames` are the
    /// largest one's. Left out of JSON when 1.
    #[serde(skip_serializing_if = "is_one")]
    pub stacks: u32,
    /// What PyTorch recorded with the site's allocations besides their
    /// stack (labels, compiled regions, user metadata). Left out of JSON
    /// when empty.
    #[serde(skip_serializing_if = "Recorded::is_empty")]
    pub recorded: Recorded,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Site {
    /// Merges `other`, a smaller site with the same culprit line, into this
    /// one, which stands for both (see [`merge_rows`]): the stacks add up.
    pub(crate) fn absorb(&mut self, other: Site) {
        self.stacks += other.stacks;
        self.recorded.merge(&other.recorded);
    }
}

/// `rows` with those whose `key`s are equal merged by `merge` into the
/// largest of them by `size` (bytes, then the smallest stack key), which
/// stands for them all; largest first. What reports use to give each
/// culprit line one row. Which row stands for a line depends on the rows
/// alone, never on the order they come in (a hash map's). The keys are
/// worked out on every core: a culprit is a walk up its stack's frames,
/// for each of 15,000 sites on a large snapshot (13 ms on one core).
pub(crate) fn merge_rows<T: Send, K: std::hash::Hash + Eq + Send>(
    rows: Vec<T>,
    key: impl Fn(&T) -> K + Sync,
    size: impl Fn(&T) -> (u64, StackKey),
    merge: impl Fn(&mut T, T),
) -> Vec<T> {
    let mut keyed: Vec<(K, T)> = rows.into_par_iter().map(|row| (key(&row), row)).collect();
    keyed.sort_by_cached_key(|(_, row)| {
        let (bytes, key) = size(row);
        (std::cmp::Reverse(bytes), key)
    });
    let mut index: FxHashMap<K, usize> = FxHashMap::default();
    let mut out: Vec<T> = Vec::with_capacity(keyed.len());
    for (key, row) in keyed {
        match index.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => merge(&mut out[*e.get()], row),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(out.len());
                out.push(row);
            }
        }
    }
    out
}

/// A culprit's kind, function, file and line: what rows are merged by.
pub(crate) type CulpritLine<'a> = (CulpritKind, &'a str, &'a str, u32);

/// A site's culprit line, what rows are merged by.
pub(crate) fn culprit_line(site: &Site) -> (CulpritKind, String, String, u32) {
    let c = &site.culprit;
    (c.kind, c.name.clone(), c.file.clone(), c.line)
}

/// Describes the site `key` of `snap`, whose blocks have stack `stack`:
/// what reports show for it, for a few sites of a large snapshot
/// (only the stack's own frames are looked at).
pub fn describe_site(
    snap: &Snapshot,
    key: StackKey,
    stack: Option<StackId>,
    rules: &CulpritRules,
) -> Site {
    let ids: &[FrameId] = stack.map_or(&[], |s| &snap.stacks[s as usize]);
    site_of_frames(
        key,
        ids.iter().map(|&f| {
            let frame = &snap.frames[f as usize];
            (frame, rules.role(frame))
        }),
        rules,
    )
}

/// The site `key` whose stack is `frames` (innermost first, each with its
/// role): its culprit, and its frames without noise (the forward marker
/// kept).
fn site_of_frames<'a>(
    key: StackKey,
    frames: impl Iterator<Item = (&'a snapdiff_format::Frame, FrameRole)> + Clone,
    rules: &CulpritRules,
) -> Site {
    Site {
        key,
        culprit: rules.culprit_of(frames.clone()),
        frames: frames
            // The forward marker is left out of keys and culprits, but
            // shown: the frames after it are the forward pass's, not callers.
            .filter(|(_, role)| !role.noise || role.forward_marker)
            .map(|(f, _)| SiteFrame {
                name: f.name.to_string(),
                file: f.file.to_string(),
                line: f.line,
            })
            .collect(),
        stacks: 1,
        recorded: Recorded::default(),
    }
}

/// Describes the sites of one snapshot. Built once per snapshot: it works
/// out what each distinct frame is (noise, the program's code, ...) once,
/// when a stack it names first needs it, however many stacks share the
/// frame. A report names few of a snapshot's sites (a check names those at
/// the peak), so frames no named stack holds are never looked at.
pub(crate) struct SiteNamer<'a> {
    snap: &'a Snapshot,
    rules: &'a CulpritRules,
    /// The snapshot's stack keys, which know whether each frame is noise.
    keys: Option<&'a StackKeys>,
    /// Each frame's role, by [`FrameId`], once asked for.
    roles: Vec<OnceLock<FrameRole>>,
    recorded: FxHashMap<StackId, Recorded>,
}

impl<'a> SiteNamer<'a> {
    /// A namer for the sites of `snap`, choosing culprits by `rules`.
    pub(crate) fn new(snap: &'a Snapshot, rules: &'a CulpritRules) -> SiteNamer<'a> {
        SiteNamer {
            snap,
            rules,
            keys: None,
            roles: snap.frames.iter().map(|_| OnceLock::new()).collect(),
            recorded: recorded_by_stack(snap),
        }
    }

    /// [`SiteNamer::new`], for a snapshot whose stack keys are `keys`: the
    /// noise they found is not looked for again.
    pub(crate) fn keyed(
        snap: &'a Snapshot,
        keys: &'a StackKeys,
        rules: &'a CulpritRules,
    ) -> SiteNamer<'a> {
        SiteNamer {
            keys: Some(keys),
            ..SiteNamer::new(snap, rules)
        }
    }

    /// Frame `id`, and its role.
    fn frame(&self, id: FrameId) -> (&'a snapdiff_format::Frame, FrameRole) {
        let frame = &self.snap.frames[id as usize];
        let role = self.roles[id as usize].get_or_init(|| match self.keys {
            Some(keys) => self.rules.role_known(frame, keys.is_noise(self.snap, id)),
            None => self.rules.role(frame),
        });
        (frame, *role)
    }

    /// The rules culprits are chosen by.
    pub(crate) fn rules(&self) -> &CulpritRules {
        self.rules
    }

    /// The line of the culprit of the site whose blocks have stack
    /// `stack`, as [`site`](SiteNamer::site) names it: borrowed from the
    /// snapshot, for merging thousands of rows by it.
    pub(crate) fn culprit_line(&self, stack: Option<StackId>) -> CulpritLine<'a> {
        let ids: &[FrameId] = stack.map_or(&[], |s| &self.snap.stacks[s as usize]);
        match self.rules.culprit_frame(ids.iter().map(|&f| self.frame(f))) {
            Some((f, kind)) => (kind, &f.name, &f.file, f.line),
            None => (CulpritKind::NoStack, "", "", 0),
        }
    }

    /// Describes the site of key `key`, whose blocks have stack `stack`.
    pub(crate) fn site(&self, key: StackKey, stack: Option<StackId>) -> Site {
        let ids: &[FrameId] = stack.map_or(&[], |s| &self.snap.stacks[s as usize]);
        let mut site = site_of_frames(key, ids.iter().map(|&f| self.frame(f)), self.rules);
        if let Some(recorded) = stack.and_then(|s| self.recorded.get(&s)) {
            site.recorded = recorded.clone();
        }
        site
    }
}
