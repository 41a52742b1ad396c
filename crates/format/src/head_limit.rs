//! What the head of a `.snap` file (the body, before version 3) may build,
//! by the size of the zstd frame that holds it; and the same for what its
//! events frame holds beside the trace columns (the names of unknown
//! actions, events' extra keys).
//!
//! A table of empty strings, stacks or values compresses to almost nothing
//! and builds 24 bytes or more of memory from each byte of it, so a file of
//! kilobytes could declare gigabytes. The head's tables of real jobs expand
//! at most 13 times from their frame (frames, stacks and strings are
//! interned, so they never repeat), but a segment table may expand ten
//! thousand times: a leak of a million identical tensors from one line is a
//! million identical blocks. So the head's bytes are limited by the frame's
//! size, apart from the segment table and (before version 3) the trace
//! columns, whose segments and blocks are counted instead, and whose events
//! `columns.rs` limits.

use std::cell::Cell;

/// Bytes of head, outside the segment table and trace columns, a file may
/// hold for each byte of its zstd frame: five times what real jobs' heads
/// expand (12.6 times, the most over every file of the test suite).
const HEAD_BYTES_PER_BYTE: u64 = 64;
/// Bytes of head any file may hold outside those tables, whatever its
/// size: at most about 64 bytes of memory each (an empty value in a list).
const HEAD_BYTES_ALWAYS_ALLOWED: u64 = 32 << 10;
/// Segments and blocks a file may hold for each byte of its zstd frame: a
/// million identical blocks compress to 764 bytes (1,309 a byte).
const BLOCKS_PER_BYTE: u64 = 2048;
/// Segments and blocks any file may hold, whatever its size (72 bytes of
/// memory a block).
const BLOCKS_ALWAYS_ALLOWED: u64 = 1 << 20;

/// What the head being read on this thread may build, for its messages.
#[derive(Clone, Copy)]
struct Limits {
    most_bytes: u64,
    most_blocks: u64,
    frame_len: usize,
}

/// [`BYTES_LEFT`] when nothing is counted.
const UNCOUNTED: u64 = u64::MAX;

thread_local! {
    // Thread-locals because serde hands a visitor nothing but the bytes:
    // the limits come from the file's size, which only the caller knows.
    static LIMITS: Cell<Option<Limits>> = const { Cell::new(None) };
    // Bytes outside the bulk tables that may still be read: [`UNCOUNTED`]
    // while a bulk table is read, or when the whole head fits in what its
    // frame allows. One `u64`, as every read of the head looks at it.
    static BYTES_LEFT: Cell<u64> = const { Cell::new(UNCOUNTED) };
    static BLOCKS_LEFT: Cell<u64> = const { Cell::new(UNCOUNTED) };
}

/// Runs `decode`, the reading of a head of `head_len` bytes from a zstd
/// frame of `frame_len` bytes, within what that frame allows.
pub(crate) fn with_head_limit<T>(head_len: u64, frame_len: usize, decode: impl FnOnce() -> T) -> T {
    let per_byte = |n: u64, always: u64| (frame_len as u64).saturating_mul(n).max(always);
    let limits = Limits {
        most_bytes: per_byte(HEAD_BYTES_PER_BYTE, HEAD_BYTES_ALWAYS_ALLOWED),
        most_blocks: per_byte(BLOCKS_PER_BYTE, BLOCKS_ALWAYS_ALLOWED),
        frame_len,
    };
    let bytes = if head_len > limits.most_bytes {
        limits.most_bytes
    } else {
        UNCOUNTED
    };
    let outer = (
        LIMITS.replace(Some(limits)),
        BYTES_LEFT.replace(bytes),
        BLOCKS_LEFT.replace(limits.most_blocks),
    );
    let decoded = decode();
    LIMITS.set(outer.0);
    BYTES_LEFT.set(outer.1);
    BLOCKS_LEFT.set(outer.2);
    decoded
}

/// Counts `n` bytes of head handed to the MessagePack reader; an error
/// once the bytes outside the bulk tables are more than the frame allows.
#[inline]
pub(crate) fn spend_head_bytes(n: usize) -> std::io::Result<()> {
    let left = BYTES_LEFT.get();
    if left == UNCOUNTED {
        return Ok(());
    }
    match left.checked_sub(n as u64) {
        Some(left) => {
            BYTES_LEFT.set(left);
            Ok(())
        }
        None => Err(too_many_bytes()),
    }
}

#[cold]
fn too_many_bytes() -> std::io::Error {
    let limits = LIMITS.get().expect("counted within a limit");
    std::io::Error::other(format!(
        "its tables other than segments and events take more than {} bytes, the most a {}-byte zstd frame can hold",
        limits.most_bytes, limits.frame_len
    ))
}

/// Runs `read`, the reading of the segment table or a trace column,
/// whose bytes are not counted: their items are, by [`take_blocks`] and
/// the event limit.
pub(crate) fn in_bulk_table<T>(read: impl FnOnce() -> T) -> T {
    let outer = BYTES_LEFT.replace(UNCOUNTED);
    let read = read();
    BYTES_LEFT.set(outer);
    read
}

/// Counts `n` more segments or blocks against what the frame allows,
/// before they are built.
pub(crate) fn take_blocks(n: u64) -> Result<(), String> {
    let left = BLOCKS_LEFT.get();
    if left == UNCOUNTED {
        return Ok(());
    }
    let left = left.checked_sub(n).ok_or_else(|| {
        let limits = LIMITS.get().expect("counted within a limit");
        format!(
            "its segment table holds more than {} segments and blocks, the most a {}-byte zstd frame can hold",
            limits.most_blocks, limits.frame_len
        )
    })?;
    BLOCKS_LEFT.set(left);
    Ok(())
}
