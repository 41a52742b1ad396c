//! Private pools left behind: memory reserved for a CUDA graph (or a
//! `torch.cuda.MemPool`) that holds no block in use, snapshot after
//! snapshot. A graph capture that failed or a graph that was dropped while
//! something still referred to its pool keeps it; the shared pools cannot
//! use it, so it is told apart from their cache, never counted as it.

use rustc_hash::FxHashMap;
use serde::Serialize;
use snapdiff_format::Snapshot;

/// A private pool with nothing in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct IdlePool {
    /// The device.
    pub device: u32,
    /// The pool's id (`segment_pool_id`).
    pub pool_id: (i64, i64),
    /// Its reserved bytes (at the last snapshot).
    pub reserved_bytes: u64,
    /// Its segments.
    pub segments: u64,
    /// The snapshots it was there in, idle in each.
    pub snapshots: usize,
}

/// One private pool of one snapshot.
#[derive(Clone, Copy, Default)]
struct PoolState {
    reserved_bytes: u64,
    segments: u64,
    in_use: bool,
}

/// Each private pool of `snap`'s devices, by device and pool id.
fn private_pools(snap: &Snapshot) -> FxHashMap<(u32, (i64, i64)), PoolState> {
    let mut pools: FxHashMap<_, PoolState> = FxHashMap::default();
    for s in snap.device_segments().filter(|s| s.pool_id != (0, 0)) {
        let pool = pools.entry((s.device, s.pool_id)).or_default();
        pool.reserved_bytes += s.total_size;
        pool.segments += 1;
        pool.in_use |= s.blocks.iter().any(|b| b.state.is_active());
    }
    pools
}

/// The private pools of `snaps` (in order) that are there in the last,
/// were in at least two, and held nothing in use in any snapshot from the
/// first they were in to the last; largest first.
pub fn idle_private_pools(snaps: &[&Snapshot]) -> Vec<IdlePool> {
    let Some(last) = snaps.last() else {
        return Vec::new();
    };
    let mut idle: Vec<IdlePool> = private_pools(last)
        .into_iter()
        .filter(|(_, pool)| !pool.in_use)
        .map(|((device, pool_id), pool)| IdlePool {
            device,
            pool_id,
            reserved_bytes: pool.reserved_bytes,
            segments: pool.segments,
            snapshots: 1,
        })
        .collect();
    let earlier: Vec<_> = snaps[..snaps.len() - 1]
        .iter()
        .rev()
        .map(|s| private_pools(s))
        .collect();
    for pool in &mut idle {
        // Back from the last: idle in each while it is there; missing, the
        // snapshots before are from before it was made; in use, it is no
        // pool left behind.
        for pools in &earlier {
            match pools.get(&(pool.device, pool.pool_id)) {
                Some(then) if !then.in_use => pool.snapshots += 1,
                Some(_) => {
                    pool.snapshots = 0;
                    break;
                }
                None => break,
            }
        }
    }
    idle.retain(|p| p.snapshots >= 2);
    idle.sort_by(|a, b| {
        (b.reserved_bytes, a.device, a.pool_id).cmp(&(a.reserved_bytes, b.device, b.pool_id))
    });
    idle
}
