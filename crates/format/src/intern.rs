//! Interning tables: each distinct value stored once, found by content.
//!
//! Written over `hashbrown::HashTable` rather than a `HashMap<T, u32>` so
//! that each value is stored once (in `items`) instead of twice, and can be
//! looked up by a borrowed form (`&[FrameId]` for a `Vec<FrameId>`).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

/// Distinct values in first-seen order, with an index by content.
pub(crate) struct Interner<T> {
    items: Vec<T>,
    /// Item ids with their hashes, so that growing the index rehashes no item.
    index: HashTable<(u64, u32)>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            items: Vec::new(),
            index: HashTable::new(),
        }
    }
}

impl<T> Interner<T> {
    /// An empty table with room for `n` values.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Interner {
            items: Vec::with_capacity(n),
            index: HashTable::with_capacity(n),
        }
    }
}

impl<T: Hash> Interner<T> {
    /// The id of the value equal to `key`, adding `make(key)` if there is none.
    pub(crate) fn intern<Q>(&mut self, key: &Q, make: impl FnOnce(&Q) -> T) -> u32
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = FxBuildHasher.hash_one(key);
        let items = &self.items;
        if let Some(&(_, id)) = self
            .index
            .find(hash, |&(_, i)| items[i as usize].borrow() == key)
        {
            return id;
        }
        let id = self.items.len() as u32;
        self.items.push(make(key));
        self.index
            .insert_unique(hash, (hash, id), |&(hash, _)| hash);
        id
    }

    /// The interned values, in id order.
    pub(crate) fn into_items(self) -> Vec<T> {
        self.items
    }

    /// The value with id `id`.
    pub(crate) fn get(&self, id: u32) -> &T {
        &self.items[id as usize]
    }
}
