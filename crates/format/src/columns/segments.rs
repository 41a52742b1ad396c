//! The segment table of a `.snap` head (format version 3 on): one byte
//! string of varints instead of a MessagePack array per segment and block.
//! A step's dump holds hundreds of segments and blocks, and decoding them
//! item by item was a third of the time `fleet` spent on a file.
//!
//! The layout (docs/format.md): the number of segments; for each segment
//! its device, address, total size, stream (zigzag), pool code, pool id
//! (two zigzag varints), a flags byte, its stack, allocated, active and
//! requested sizes where its flags say it has them, and its number of
//! blocks; then every block, segment by segment: its address as the
//! difference (zigzag) from where the previous block of the segment ended
//! (the segment's start for the first), size, requested size, a flags byte
//! (state in the low two bits), its stack and allocation sequence number
//! where its flags say it has them; then the length of a MessagePack
//! document and the document: the few segments and blocks with extra keys
//! or a history, by index.

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ColumnReader, Corrupt, write_i64, write_u64};
use crate::model::{Block, BlockState, HistoryEntry, Pool, Segment, StackId};
use crate::value::{Extra, Value};

const HAS_STACK: u8 = 1;
const HAS_ALLOCATED: u8 = 2;
const HAS_ACTIVE: u8 = 4;
const HAS_REQUESTED: u8 = 8;
const IS_EXPANDABLE: u8 = 16;

const STATE_BITS: u8 = 3;
const BLOCK_HAS_STACK: u8 = 4;
const BLOCK_HAS_SEQ: u8 = 8;

/// The fewest bytes a segment and a block take, which bound the counts a
/// table may declare by its length.
const LEAST_SEGMENT_BYTES: usize = 10;
const LEAST_BLOCK_BYTES: usize = 5;

/// The segments and blocks with fields that are rare, by index.
#[derive(Default, Serialize, Deserialize)]
struct Rare {
    segment_extra: Vec<(u32, Extra)>,
    blocks: Vec<RareBlock>,
}

/// A block with a history or extra keys.
#[derive(Serialize, Deserialize)]
struct RareBlock {
    /// Its index over all segments' blocks.
    index: u64,
    history: Vec<HistoryEntry>,
    extra: Vec<(String, Value)>,
}

/// Writes the segment table as one byte string.
pub(crate) fn serialize<S: Serializer>(segments: &[Segment], s: S) -> Result<S::Ok, S::Error> {
    let blocks: usize = segments.iter().map(|seg| seg.blocks.len()).sum();
    let mut w = Vec::with_capacity(segments.len() * 16 + blocks * 8);
    let mut rare = Rare::default();
    write_u64(&mut w, segments.len() as u64);
    for (i, seg) in segments.iter().enumerate() {
        write_u64(&mut w, u64::from(seg.device));
        write_u64(&mut w, seg.address);
        write_u64(&mut w, seg.total_size);
        write_i64(&mut w, seg.stream);
        write_u64(&mut w, u64::from(seg.pool.code()));
        write_i64(&mut w, seg.pool_id.0);
        write_i64(&mut w, seg.pool_id.1);
        let flags = [
            (seg.stack.is_some(), HAS_STACK),
            (seg.allocated_size.is_some(), HAS_ALLOCATED),
            (seg.active_size.is_some(), HAS_ACTIVE),
            (seg.requested_size.is_some(), HAS_REQUESTED),
            (seg.is_expandable, IS_EXPANDABLE),
        ]
        .iter()
        .filter(|(set, _)| *set)
        .fold(0, |flags, (_, bit)| flags | bit);
        w.push(flags);
        if let Some(stack) = seg.stack {
            write_u64(&mut w, u64::from(stack));
        }
        for size in [seg.allocated_size, seg.active_size, seg.requested_size]
            .into_iter()
            .flatten()
        {
            write_u64(&mut w, size);
        }
        write_u64(&mut w, seg.blocks.len() as u64);
        if !seg.extra.is_empty() {
            rare.segment_extra.push((i as u32, seg.extra.clone()));
        }
    }
    let mut index = 0u64;
    for seg in segments {
        let mut expected = seg.address;
        for b in &seg.blocks {
            write_i64(&mut w, b.address.wrapping_sub(expected) as i64);
            expected = b.address.wrapping_add(b.size);
            write_u64(&mut w, b.size);
            write_u64(&mut w, b.requested_size);
            let mut flags = b.state.code();
            if b.stack.is_some() {
                flags |= BLOCK_HAS_STACK;
            }
            if b.alloc_seq.is_some() {
                flags |= BLOCK_HAS_SEQ;
            }
            w.push(flags);
            if let Some(stack) = b.stack {
                write_u64(&mut w, u64::from(stack));
            }
            if let Some(seq) = b.alloc_seq {
                write_u64(&mut w, seq);
            }
            if !b.history.is_empty() || !b.extra.is_empty() {
                rare.blocks.push(RareBlock {
                    index,
                    history: b.history.to_vec(),
                    extra: b.extra.to_vec(),
                });
            }
            index += 1;
        }
    }
    let rare = rmp_serde::to_vec(&rare).map_err(serde::ser::Error::custom)?;
    write_u64(&mut w, rare.len() as u64);
    w.extend_from_slice(&rare);
    s.serialize_bytes(&w)
}

/// Reads the segment table: one byte string (version 3 on), or an array of
/// segments (a version 1 or 2 body).
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Segment>, D::Error> {
    crate::head_limit::in_bulk_table(|| d.deserialize_any(SegmentsVisitor))
}

struct SegmentsVisitor;

impl<'de> Visitor<'de> for SegmentsVisitor {
    type Value = Vec<Segment>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a segment table")
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Vec<Segment>, E> {
        from_bytes(bytes).map_err(E::custom)
    }

    /// Versions 1 and 2: an array of segments, each an array of its fields.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Segment>, A::Error> {
        let mut segments = Vec::new();
        while let Some(segment) = seq.next_element()? {
            crate::head_limit::take_blocks(1).map_err(de::Error::custom)?;
            segments.push(segment);
        }
        Ok(segments)
    }
}

/// A segment's blocks in a version 1 or 2 body (or JSON), each counted
/// against what its file may hold as it is read.
pub(crate) fn counted_blocks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Block>, D::Error> {
    struct Blocks;
    impl<'de> Visitor<'de> for Blocks {
        type Value = Vec<Block>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a segment's blocks")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Block>, A::Error> {
            let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(block) = seq.next_element()? {
                crate::head_limit::take_blocks(1).map_err(de::Error::custom)?;
                blocks.push(block);
            }
            Ok(blocks)
        }
    }
    d.deserialize_seq(Blocks)
}

impl From<Corrupt> for &'static str {
    fn from(_: Corrupt) -> &'static str {
        "segment table ends early or holds an overlong number"
    }
}

fn from_bytes(bytes: &[u8]) -> Result<Vec<Segment>, String> {
    let mut r = ColumnReader::dense(bytes);
    let left = |r: &ColumnReader| bytes.len() - r.pos;
    let count = r.u64().map_err(<&str>::from)?;
    if count > (left(&r) / LEAST_SEGMENT_BYTES) as u64 {
        return Err(format!(
            "segment table declares {count} segments, more than it holds"
        ));
    }
    crate::head_limit::take_blocks(count)?;
    let mut segments = Vec::with_capacity(count as usize);
    let mut block_counts = Vec::with_capacity(count as usize);
    for _ in 0..count {
        segments.push(segment(&mut r).map_err(<&str>::from)?);
        block_counts.push(r.u64().map_err(<&str>::from)?);
    }
    // Each segment's blocks are reserved for only once the bytes left can
    // hold them.
    for (seg, &n) in segments.iter_mut().zip(&block_counts) {
        if n > (left(&r) / LEAST_BLOCK_BYTES) as u64 {
            return Err(format!(
                "a segment declares {n} blocks, more than the table holds"
            ));
        }
        crate::head_limit::take_blocks(n)?;
        seg.blocks.reserve_exact(n as usize);
        let mut expected = seg.address;
        for _ in 0..n {
            let b = block(&mut r, expected).map_err(<&str>::from)?;
            expected = b.address.wrapping_add(b.size);
            seg.blocks.push(b);
        }
    }
    let rare_len = r.u64().map_err(<&str>::from)?;
    let rare = usize::try_from(rare_len)
        .ok()
        .and_then(|len| bytes.get(r.pos..r.pos.checked_add(len)?))
        .ok_or("segment table ends early")?;
    r.pos += rare.len();
    r.finish()
        .map_err(|_| "segment table has extra bytes".to_owned())?;
    let rare: Rare =
        rmp_serde::from_slice(rare).map_err(|e| format!("segment table's rare fields: {e}"))?;
    for (i, extra) in rare.segment_extra {
        segments
            .get_mut(i as usize)
            .ok_or("extra keys for a segment that does not exist")?
            .extra = extra;
    }
    let mut blocks = segments.iter_mut().flat_map(|s| s.blocks.iter_mut());
    let mut at = 0u64;
    for RareBlock {
        index,
        history,
        extra,
    } in rare.blocks
    {
        let skip = index
            .checked_sub(at)
            .ok_or("rare fields of blocks out of order")?;
        let b = blocks
            .nth(skip as usize)
            .ok_or("rare fields for a block that does not exist")?;
        b.history = history.into();
        b.extra = extra.into();
        at = index + 1;
    }
    Ok(segments)
}

/// A segment's fields before its blocks.
fn segment(r: &mut ColumnReader) -> Result<Segment, Corrupt> {
    let device = u32::try_from(r.u64()?).map_err(|_| Corrupt)?;
    let address = r.u64()?;
    let total_size = r.u64()?;
    let stream = r.i64()?;
    let pool = Pool::from_code(r.u64()?).ok_or(Corrupt)?;
    let pool_id = (r.i64()?, r.i64()?);
    let flags = r.byte()?;
    let has = |bit: u8| flags & bit != 0;
    let stack = if has(HAS_STACK) {
        Some(stack_id(r)?)
    } else {
        None
    };
    let mut size = |bit: u8| {
        if has(bit) {
            r.u64().map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(Segment {
        device,
        address,
        total_size,
        stream,
        pool,
        pool_id,
        is_expandable: has(IS_EXPANDABLE),
        stack,
        blocks: Vec::new(),
        allocated_size: size(HAS_ALLOCATED)?,
        active_size: size(HAS_ACTIVE)?,
        requested_size: size(HAS_REQUESTED)?,
        extra: Extra::new(),
    })
}

/// A block whose address is `expected` plus the difference it holds.
fn block(r: &mut ColumnReader, expected: u64) -> Result<Block, Corrupt> {
    let address = expected.wrapping_add(r.i64()? as u64);
    let size = r.u64()?;
    let requested_size = r.u64()?;
    let flags = r.byte()?;
    let state = BlockState::from_code(u64::from(flags & STATE_BITS)).ok_or(Corrupt)?;
    let stack = if flags & BLOCK_HAS_STACK != 0 {
        Some(stack_id(r)?)
    } else {
        None
    };
    let alloc_seq = if flags & BLOCK_HAS_SEQ != 0 {
        Some(r.u64()?)
    } else {
        None
    };
    Ok(Block {
        address,
        size,
        requested_size,
        state,
        stack,
        alloc_seq,
        ..Block::default()
    })
}

fn stack_id(r: &mut ColumnReader) -> Result<StackId, Corrupt> {
    StackId::try_from(r.u64()?).map_err(|_| Corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serializes through [`serialize`], as the head's field does.
    struct Table<'a>(&'a [Segment]);

    impl Serialize for Table<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            serialize(self.0, s)
        }
    }

    fn encode(segments: &[Segment]) -> Vec<u8> {
        let msgpack = rmp_serde::to_vec(&Table(segments)).unwrap();
        rmp_serde::from_slice::<serde_bytes::ByteBuf>(&msgpack)
            .unwrap()
            .into_vec()
    }

    fn segments() -> Vec<Segment> {
        let block = |address, size, state, stack, seq| Block {
            address,
            size,
            requested_size: size - 3,
            state,
            stack,
            alloc_seq: seq,
            ..Block::default()
        };
        let mut odd = block(0x9000, 512, BlockState::ActivePendingFree, Some(7), None);
        odd.extra = vec![("note".to_owned(), Value::Str("kept".into()))].into();
        odd.history = vec![HistoryEntry {
            address: 0x9000,
            real_size: 509,
            stack: None,
            extra: Extra::new(),
        }]
        .into();
        vec![
            Segment {
                device: 0,
                address: 0x1000,
                total_size: 0x2000,
                stream: -5,
                pool: Pool::Large,
                pool_id: (1, -3),
                is_expandable: true,
                stack: Some(2),
                blocks: vec![
                    block(0x1000, 0x800, BlockState::ActiveAllocated, Some(1), Some(9)),
                    // Out of order and overlapping: kept as written.
                    block(0x1200, 0x900, BlockState::Inactive, None, None),
                ],
                allocated_size: Some(0x800),
                active_size: None,
                requested_size: Some(u64::MAX),
                extra: vec![("x".to_owned(), Value::Int(3))],
            },
            Segment {
                device: u32::MAX,
                address: 0x9000,
                blocks: vec![odd],
                ..Segment::default()
            },
            Segment::default(),
        ]
    }

    #[test]
    fn segments_round_trip_through_their_table() {
        let segments = segments();
        assert_eq!(from_bytes(&encode(&segments)).unwrap(), segments);
        assert_eq!(from_bytes(&encode(&[])).unwrap(), []);
    }

    /// Counts are checked against the bytes left, so a corrupt table is
    /// refused without reserving what it claims; every cut is an error.
    #[test]
    fn cut_or_absurd_tables_are_refused() {
        let bytes = encode(&segments());
        for end in 0..bytes.len() {
            assert!(from_bytes(&bytes[..end]).is_err(), "cut at {end}");
        }
        let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        let err = from_bytes(&huge).unwrap_err();
        assert!(err.contains("more than it holds"), "{err}");
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(from_bytes(&extra).unwrap_err().contains("extra bytes"));
    }
}
