//! A floor for reading a pickle: the time to walk its opcodes while keeping
//! only the memo and the stack (one word per value; no strings, containers or
//! records), best of repeated walks over about a second.
//!
//! `docs/performance.md` compares it with `read_speed`: whatever the reader
//! does beyond this loop is the room left for building the snapshot.
//! It knows only the opcodes that PyTorch's snapshot pickles use.
//!
//! `cargo run --release -p snapdiff-format --example opcode_floor -- FILE...`

use std::time::{Duration, Instant};

fn main() {
    for path in std::env::args().skip(1) {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut best = Duration::MAX;
        let started = Instant::now();
        while started.elapsed().as_secs_f64() < 1.0 {
            let t = Instant::now();
            std::hint::black_box(walk(&data));
            best = best.min(t.elapsed());
        }
        println!("{path} {:.4}", best.as_secs_f64() * 1e3);
    }
}

/// Walks the opcodes; returns a sum of the values popped, so that the work
/// cannot be optimized away.
fn walk(d: &[u8]) -> u64 {
    let u32_at = |pos: usize| u32::from_le_bytes(d[pos..pos + 4].try_into().unwrap());
    const MARK: u64 = u64::MAX;
    let mut memo: Vec<u64> = Vec::with_capacity(d.len() / 16);
    let mut stack: Vec<u64> = Vec::with_capacity(1024);
    let (mut pos, mut sum) = (0, 0u64);
    loop {
        let op = d[pos];
        pos += 1;
        match op {
            0x80 => pos += 1,         // PROTO
            0x95 => pos += 8,         // FRAME
            b'.' => return sum,       // STOP
            b'(' => stack.push(MARK), // MARK
            b'N' | 0x88 | 0x89 | b'}' | b']' | b')' => stack.push(u64::from(op)),
            b'K' => {
                stack.push(u64::from(d[pos]));
                pos += 1;
            }
            b'M' => {
                stack.push(u64::from(d[pos]));
                pos += 2;
            }
            b'J' => {
                stack.push(u64::from(u32_at(pos)));
                pos += 4;
            }
            b'G' => {
                stack.push(1);
                pos += 8;
            }
            0x8a | 0x8c => {
                // LONG1, SHORT_BINUNICODE: a length byte, then the bytes.
                let n = usize::from(d[pos]);
                stack.push(n as u64);
                pos += 1 + n;
            }
            b'X' => {
                let n = u32_at(pos) as usize;
                stack.push(n as u64);
                pos += 4 + n;
            }
            0x94 => memo.push(*stack.last().unwrap()), // MEMOIZE
            b'h' => {
                stack.push(memo[usize::from(d[pos])]);
                pos += 1;
            }
            b'j' => {
                stack.push(memo[u32_at(pos) as usize]);
                pos += 4;
            }
            // APPENDS, SETITEMS: pop to the mark.
            b'e' | b'u' => {
                while let Some(v) = stack.pop().filter(|&v| v != MARK) {
                    sum = sum.wrapping_add(v);
                }
            }
            // APPEND, TUPLE2: pop one (TUPLE2 is rare; its result is not kept).
            b'a' | 0x86 => sum = sum.wrapping_add(stack.pop().unwrap()),
            _ => panic!(
                "opcode 0x{op:02x} at byte {} is not one this walk knows",
                pos - 1
            ),
        }
    }
}
