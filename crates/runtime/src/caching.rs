//! The caching allocator's bookkeeping: segments, blocks, free lists.
//!
//! It follows PyTorch's `DeviceCachingAllocator` (`c10/cuda/CUDACachingAllocator.cpp`)
//! so that snapshots look like PyTorch's (numbers in
//! `reference/pytorch-snapshot.md` §5):
//!
//! - sizes are rounded up to multiples of 512 bytes;
//! - requests of at most 1 MiB use the small pool, whose segments are 2 MiB;
//!   larger ones use the large pool, with 20 MiB segments below 10 MiB and
//!   exact 2 MiB-rounded segments above;
//! - a request takes the smallest free block of its pool and stream that fits;
//! - the block is split when the rest is worth keeping: at least 512 bytes in
//!   the small pool, more than 1 MiB in the large pool (so large blocks can
//!   carry up to 1 MiB of slack), the allocation taking the front;
//! - a freed block merges with free neighbours of its segment;
//! - only whole free segments are returned to the device.
//!
//! This module has no locking and no I/O; [`crate::Allocator`] drives it.

use std::collections::BTreeMap;

use snapdiff_format::Pool;

use crate::backend::Stream;

/// All sizes are rounded up to a multiple of this.
pub(crate) const MIN_BLOCK: u64 = 512;
/// The largest request served from the small pool.
pub(crate) const SMALL_SIZE: u64 = 1 << 20;
/// The size of small-pool segments.
pub(crate) const SMALL_BUFFER: u64 = 2 << 20;
/// The size of large-pool segments for requests below [`MIN_LARGE_ALLOC`].
pub(crate) const LARGE_BUFFER: u64 = 20 << 20;
/// Requests from this size up get a segment of their own size.
pub(crate) const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Own-size segments are rounded up to a multiple of this.
pub(crate) const ROUND_LARGE: u64 = 2 << 20;

/// The size a request of `size` bytes occupies.
pub(crate) fn round_size(size: u64) -> u64 {
    size.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
}

/// The pool that serves a rounded size.
pub(crate) fn pool_of(rounded: u64) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The size of the segment to obtain for a rounded request none of the free blocks fits.
pub(crate) fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

fn should_split(pool: Pool, block_size: u64, rounded: u64) -> bool {
    let remaining = block_size - rounded;
    match pool {
        Pool::Small => remaining >= MIN_BLOCK,
        Pool::Large => remaining > SMALL_SIZE,
    }
}

/// Index of a block in [`Caching::blocks`].
pub(crate) type BlockIdx = u32;

/// One block: a piece of a segment, allocated or free.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub(crate) address: u64,
    pub(crate) size: u64,
    pub(crate) requested: u64,
    /// Address of the segment the block belongs to.
    pub(crate) segment: u64,
    /// The free list of the segment's pool and stream.
    list: u16,
    pool: Pool,
    pub(crate) prev: Option<BlockIdx>,
    pub(crate) next: Option<BlockIdx>,
    pub(crate) allocated: bool,
    /// The allocation's stack (a runtime stack id), while allocated.
    pub(crate) stack: Option<u32>,
    /// The allocation's sequence number, while allocated.
    pub(crate) seq: u64,
}

/// One segment obtained from the backend.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub(crate) size: u64,
    pub(crate) stream: Stream,
    pub(crate) pool: Pool,
    /// The stack of the allocation that made the segment.
    pub(crate) stack: Option<u32>,
    /// The block at the segment's start.
    pub(crate) first: BlockIdx,
}

/// Free blocks are ordered so that a range query finds the best fit: by free
/// list (pool and stream), then size, then address, packed into one `u128`
/// (16 bits of free list, 48 of size, 64 of address) so that the free map
/// compares and moves 16-byte keys.
type FreeKey = u128;

fn free_key(list: u16, size: u64, address: u64) -> FreeKey {
    debug_assert!(size < 1 << 48, "blocks are smaller than 256 TiB");
    (u128::from(list) << 112) | (u128::from(size) << 64) | u128::from(address)
}

fn key_list(key: FreeKey) -> u16 {
    (key >> 112) as u16
}

/// A key no block has, kept in the free map at all times: a `BTreeMap` frees
/// its root node whenever it becomes empty and allocates one on the next
/// insert, and in a steady allocate-free loop the map empties on every call.
/// It is the smallest key, so that it sorts before every block: the blocks
/// a steady loop removes and inserts are then at the end of their node,
/// and no key has to be moved aside for them. A range query starts above
/// it (no block has size 0), so it is never found.
const SENTINEL: FreeKey = 0;

/// Segments, blocks and free lists of one device.
pub(crate) struct Caching {
    blocks: Vec<Block>,
    /// Slots of `blocks` no longer in use.
    spare: Vec<BlockIdx>,
    free: BTreeMap<FreeKey, BlockIdx>,
    /// The free block made or freed last, kept out of `free`: a loop that
    /// frees a block and allocates one of the same size finds it here, and
    /// the split-off rest goes back here, with no insert into or removal
    /// from the map (a third of the time of a cached allocation). The free
    /// blocks are `free`'s and this one, and the best fit the smallest key
    /// of both, so PyTorch's choice is unchanged.
    held: Option<BlockIdx>,
    /// The pool and stream of each free list.
    lists: Vec<(Pool, Stream)>,
    /// Segments by address.
    pub(crate) segments: BTreeMap<u64, Segment>,
}

impl Default for Caching {
    fn default() -> Self {
        Caching {
            blocks: Vec::new(),
            spare: Vec::new(),
            free: BTreeMap::from([(SENTINEL, BlockIdx::MAX)]),
            held: None,
            lists: Vec::new(),
            segments: BTreeMap::new(),
        }
    }
}

impl Caching {
    pub(crate) fn block(&self, idx: BlockIdx) -> &Block {
        &self.blocks[idx as usize]
    }

    fn new_block(&mut self, b: Block) -> BlockIdx {
        match self.spare.pop() {
            Some(idx) => {
                self.blocks[idx as usize] = b;
                idx
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as BlockIdx
            }
        }
    }

    fn key_of(&self, idx: BlockIdx) -> FreeKey {
        let b = &self.blocks[idx as usize];
        free_key(b.list, b.size, b.address)
    }

    /// Makes `idx` a free block: the held one, the one held before going
    /// into the map.
    fn insert_free(&mut self, idx: BlockIdx) {
        if let Some(before) = self.held.replace(idx) {
            self.free.insert(self.key_of(before), before);
        }
    }

    fn remove_free(&mut self, idx: BlockIdx) {
        if self.held == Some(idx) {
            self.held = None;
        } else {
            self.free.remove(&self.key_of(idx));
        }
    }

    /// The free list of `pool` and `stream`, if it exists (streams are few).
    fn list(&self, pool: Pool, stream: Stream) -> Option<u16> {
        self.lists
            .iter()
            .position(|&l| l == (pool, stream))
            .map(|i| i as u16)
    }

    /// The smallest free block of `pool` and `stream` with room for `rounded` bytes.
    pub(crate) fn find_free(&self, pool: Pool, stream: Stream, rounded: u64) -> Option<BlockIdx> {
        let list = self.list(pool, stream)?;
        let least = free_key(list, rounded, 0);
        let fits = |key: FreeKey| key >= least && key_list(key) == list;
        let in_map = self
            .free
            .range(least..)
            .next()
            .map(|(&key, &idx)| (key, idx))
            .filter(|&(key, _)| fits(key));
        let held = self
            .held
            .map(|idx| (self.key_of(idx), idx))
            .filter(|&(key, _)| fits(key));
        match (in_map, held) {
            (Some(a), Some(b)) => Some(a.min(b).1),
            (a, b) => a.or(b).map(|(_, idx)| idx),
        }
    }

    /// Records a new segment, all one free block, and returns that block.
    pub(crate) fn add_segment(
        &mut self,
        address: u64,
        size: u64,
        stream: Stream,
        pool: Pool,
        stack: Option<u32>,
    ) -> BlockIdx {
        let list = self.list(pool, stream).unwrap_or_else(|| {
            self.lists.push((pool, stream));
            (self.lists.len() - 1) as u16
        });
        let idx = self.new_block(Block {
            address,
            size,
            requested: 0,
            segment: address,
            list,
            pool,
            prev: None,
            next: None,
            allocated: false,
            stack: None,
            seq: 0,
        });
        self.segments.insert(
            address,
            Segment {
                size,
                stream,
                pool,
                stack,
                first: idx,
            },
        );
        self.insert_free(idx);
        idx
    }

    /// Hands out free block `idx` for a request of `requested` bytes
    /// (`rounded` after rounding), splitting off the rest when PyTorch would.
    pub(crate) fn allocate(
        &mut self,
        idx: BlockIdx,
        rounded: u64,
        requested: u64,
        stack: Option<u32>,
        seq: u64,
    ) {
        self.remove_free(idx);
        let (size, address, next, segment, list, pool) = {
            let b = &self.blocks[idx as usize];
            (b.size, b.address, b.next, b.segment, b.list, b.pool)
        };
        if should_split(pool, size, rounded) {
            let rest = self.new_block(Block {
                address: address + rounded,
                size: size - rounded,
                requested: 0,
                segment,
                list,
                pool,
                prev: Some(idx),
                next,
                allocated: false,
                stack: None,
                seq: 0,
            });
            if let Some(n) = next {
                self.blocks[n as usize].prev = Some(rest);
            }
            let b = &mut self.blocks[idx as usize];
            b.size = rounded;
            b.next = Some(rest);
            self.insert_free(rest);
        }
        let b = &mut self.blocks[idx as usize];
        b.allocated = true;
        b.requested = requested;
        b.stack = stack;
        b.seq = seq;
    }

    /// Returns allocated block `idx` to the cache, merging it with free neighbours.
    pub(crate) fn free(&mut self, idx: BlockIdx) {
        {
            let b = &mut self.blocks[idx as usize];
            debug_assert!(b.allocated, "freeing a free block");
            b.allocated = false;
            b.stack = None;
            b.requested = 0;
        }
        let mut idx = idx;
        if let Some(prev) = self.blocks[idx as usize]
            .prev
            .filter(|&p| !self.blocks[p as usize].allocated)
        {
            self.remove_free(prev);
            self.absorb_next(prev);
            idx = prev;
        }
        if let Some(next) = self.blocks[idx as usize]
            .next
            .filter(|&n| !self.blocks[n as usize].allocated)
        {
            self.remove_free(next);
            self.absorb_next(idx);
        }
        self.insert_free(idx);
    }

    /// Merges the block after `idx` into `idx` (both free, same segment).
    fn absorb_next(&mut self, idx: BlockIdx) {
        let next = self.blocks[idx as usize].next.expect("a next block");
        let (next_size, next_next) = {
            let n = &self.blocks[next as usize];
            (n.size, n.next)
        };
        let b = &mut self.blocks[idx as usize];
        b.size += next_size;
        b.next = next_next;
        if let Some(nn) = next_next {
            self.blocks[nn as usize].prev = Some(idx);
        }
        self.spare.push(next);
    }

    /// Removes every segment that is one free block (of `stream`, or of all
    /// streams) and returns their address, size and stream, for the backend to free.
    pub(crate) fn release_free_segments(
        &mut self,
        stream: Option<Stream>,
    ) -> Vec<(u64, u64, Stream)> {
        let whole: Vec<(u64, BlockIdx)> = self
            .segments
            .iter()
            .filter(|(_, s)| stream.is_none_or(|st| st == s.stream))
            .filter(|(_, s)| {
                let b = &self.blocks[s.first as usize];
                !b.allocated && b.next.is_none()
            })
            .map(|(&a, s)| (a, s.first))
            .collect();
        let mut released = Vec::with_capacity(whole.len());
        for (address, first) in whole {
            self.remove_free(first);
            let seg = self.segments.remove(&address).expect("listed above");
            self.spare.push(first);
            released.push((address, seg.size, seg.stream));
        }
        released
    }

    /// The blocks of the segment at `address`, in address order.
    pub(crate) fn segment_blocks(&self, seg: &Segment) -> impl Iterator<Item = &Block> + '_ {
        std::iter::successors(Some(&self.blocks[seg.first as usize]), |b| {
            b.next.map(|n| &self.blocks[n as usize])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_pytorch() {
        // The worked examples of reference/pytorch-snapshot.md §5.
        for (request, rounded, segment) in [
            (1, 512, 2 << 20),
            (4000, 4096, 2 << 20),
            ((1 << 20) + 1, 1049088, 20 << 20),
            (10 << 20, 10 << 20, 10 << 20),
            ((10 << 20) + 1, 10486272, 12 << 20),
        ] {
            assert_eq!(round_size(request), rounded, "round {request}");
            assert_eq!(
                segment_size(round_size(request)),
                segment,
                "segment of {request}"
            );
        }
        assert_eq!(pool_of(1 << 20), Pool::Small, "exactly 1 MiB is small");
        assert_eq!(pool_of((1 << 20) + 512), Pool::Large);
    }

    #[test]
    fn splits_best_fits_and_merges() {
        let mut c = Caching::default();
        let s = Stream::DEFAULT;
        let seg = c.add_segment(0x1000_0000, SMALL_BUFFER, s, Pool::Small, None);
        c.allocate(seg, 4096, 4000, None, 1);
        let a = seg;
        let b = c.find_free(Pool::Small, s, 512).unwrap();
        c.allocate(b, 512, 100, None, 2);
        assert_eq!(
            c.block(a).address,
            0x1000_0000,
            "the allocation takes the front"
        );
        assert_eq!(c.block(b).address, 0x1000_0000 + 4096);
        let seg_info = c.segments[&0x1000_0000].clone();
        let sizes: Vec<u64> = c.segment_blocks(&seg_info).map(|b| b.size).collect();
        assert_eq!(sizes, [4096, 512, SMALL_BUFFER - 4608]);
        // Another stream does not see this segment.
        assert_eq!(c.find_free(Pool::Small, Stream(7), 512), None);
        c.free(a);
        // Best fit: the 4096-byte hole, not the big tail.
        assert_eq!(c.find_free(Pool::Small, s, 1024), Some(a));
        c.free(b);
        let sizes: Vec<u64> = c.segment_blocks(&seg_info).map(|b| b.size).collect();
        assert_eq!(sizes, [SMALL_BUFFER], "everything merged back");
        assert_eq!(
            c.release_free_segments(None),
            [(0x1000_0000, SMALL_BUFFER, s)]
        );
        assert!(c.segments.is_empty());
    }

    #[test]
    fn large_blocks_keep_up_to_a_mebibyte_of_slack() {
        let mut c = Caching::default();
        let s = Stream::DEFAULT;
        let seg = c.add_segment(0, LARGE_BUFFER, s, Pool::Large, None);
        // 19.5 MiB of a 20 MiB segment: 0.5 MiB left is not worth a block.
        c.allocate(seg, LARGE_BUFFER - (1 << 19), 1, None, 1);
        assert_eq!(c.block(seg).size, LARGE_BUFFER);
        c.free(seg);
        // 2 MiB of it: 18 MiB left is split off.
        c.allocate(seg, 2 << 20, 1, None, 2);
        assert_eq!(c.block(seg).size, 2 << 20);
    }
}
