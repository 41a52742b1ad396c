//! The stacks of every site a fleet has seen, shared by all its ranks.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use compact_str::CompactString;
use rustc_hash::FxHashMap;
use snapdiff_analyze::{Categories, Category, StackKey};
use snapdiff_format::{Frame, FrameId, Snapshot, StackId};

/// The stacks of the sites seen so far: each key's frames, once, and the
/// category its allocations were given where they were read.
#[derive(Debug, Default)]
pub struct Stacks {
    /// A snapshot holding only frames and stacks: what sites are named from.
    snapshot: Snapshot,
    /// Each site's stack in `snapshot` (`None`: allocations with no stack).
    ids: FxHashMap<StackKey, Option<StackId>>,
    categories: FxHashMap<StackKey, Category>,
    frame_ids: FxHashMap<(CompactString, CompactString, u32), FrameId>,
}

impl Stacks {
    /// Whether site `key` is known.
    pub fn contains(&self, key: StackKey) -> bool {
        self.ids.contains_key(&key)
    }

    /// The stack of site `key` in [`Stacks::snapshot`]; `None` when the site
    /// is unknown or its allocations have no stack.
    pub fn stack(&self, key: StackKey) -> Option<StackId> {
        self.ids.get(&key).copied().flatten()
    }

    /// The category of site `key`'s allocations, where it was known.
    pub fn category(&self, key: StackKey) -> Option<Category> {
        self.categories.get(&key).copied()
    }

    /// The snapshot holding every stack (and nothing else).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Every known site and its stack, in key order.
    pub fn sites(&self) -> Vec<(StackKey, Option<StackId>)> {
        let mut sites: Vec<_> = self.ids.iter().map(|(&k, &s)| (k, s)).collect();
        sites.sort_unstable_by_key(|(k, _)| *k);
        sites
    }

    /// How many sites are known.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no site is known.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Keeps only the sites `keep` says to, with their frames and
    /// categories: a watch of a long job holds the stacks of the sites its
    /// rows still name, not of every site it ever saw.
    pub fn retain(&mut self, keep: impl Fn(StackKey) -> bool) {
        let old = std::mem::take(self);
        for (key, stack) in old.sites().into_iter().filter(|(k, _)| keep(*k)) {
            let frames = stack.map(|s| old.snapshot.stack_frames(Some(s)));
            self.insert(key, frames, old.categories.get(&key).copied());
        }
    }

    /// Adds site `key` with `frames` (innermost first), unless known.
    pub fn insert<'f>(
        &mut self,
        key: StackKey,
        frames: Option<impl Iterator<Item = &'f Frame>>,
        category: Option<Category>,
    ) {
        if self.ids.contains_key(&key) {
            return;
        }
        let stack = frames.map(|frames| {
            let ids: Vec<FrameId> = frames.map(|f| self.frame_id(f)).collect();
            self.snapshot.stacks.push(ids);
            (self.snapshot.stacks.len() - 1) as StackId
        });
        self.ids.insert(key, stack);
        if let Some(category) = category {
            self.categories.insert(key, category);
        }
    }

    fn frame_id(&mut self, f: &Frame) -> FrameId {
        let frames = &mut self.snapshot.frames;
        *self
            .frame_ids
            .entry((f.name.clone(), f.file.clone(), f.line))
            .or_insert_with(|| {
                frames.push(Frame {
                    name: f.name.clone(),
                    file: f.file.clone(),
                    line: f.line,
                    extra: Vec::new(),
                });
                (frames.len() - 1) as FrameId
            })
    }
}

/// [`Stacks`] shared by the threads that read a fleet's files.
#[derive(Debug, Default)]
pub struct StackStore(RwLock<Stacks>);

impl StackStore {
    /// An empty store.
    pub fn new() -> StackStore {
        StackStore::default()
    }

    /// The stacks, for reading; adding waits until the guard is dropped.
    pub fn read(&self) -> RwLockReadGuard<'_, Stacks> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The stacks, for adding (reading site tables).
    pub fn write(&self) -> RwLockWriteGuard<'_, Stacks> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds the sites of `snap` (key and stack) not yet known, each with
    /// its category. The categories are worked out only when a site is
    /// new: after a job's first dumps, most add none.
    pub fn add_from(
        &self,
        snap: &Snapshot,
        sites: impl Iterator<Item = (StackKey, Option<StackId>)>,
    ) {
        let new: Vec<(StackKey, Option<StackId>)> = {
            let known = self.read();
            sites.filter(|(key, _)| !known.contains(*key)).collect()
        };
        if new.is_empty() {
            return;
        }
        let categories = Categories::new(snap);
        let mut stacks = self.0.write().unwrap_or_else(|e| e.into_inner());
        for (key, stack) in new {
            let frames = stack.map(|s| snap.stack_frames(Some(s)));
            stacks.insert(key, frames, Some(categories.of(stack)));
        }
    }

    /// The stacks, once no thread adds any more.
    pub fn into_inner(self) -> Stacks {
        self.0.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}
