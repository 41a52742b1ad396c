#!/usr/bin/env python3
"""Write large PyTorch snapshot pickles shaped like real ones, for benchmarks.

    python3 bench/make_real_shaped.py OUTDIR [--blocks N] [--events N] ...

Real snapshots are not the shallow stacks of fixtures/make_torch_format.py:
their events carry 20 to 260 frames, C++ and Python mixed (`stacks="all"`),
tens of thousands of distinct stacks, and a million live blocks on a big
job. This script builds its stacks from the frames of the real PyTorch
snapshots in ../shared/fixtures/torch/: each stack is a real stack, with
slices of other real stacks spliced in after its native part until it
reaches a depth drawn from 20 to 260 (most between 20 and 60). It writes,
with CPython's own pickler, as PyTorch does:

  OUTDIR/real-a.pickle   live blocks in segments, and a trace of alloc and
                         free events of a steady training loop;
  OUTDIR/real-b.pickle   the same process at a later step: the same blocks
                         at the same addresses, a few freed, new blocks at a
                         few sites (the growth `compare` should find), and
                         the trace's next window.

Frame dicts are shared objects (PyTorch's symbolizer shares them, so the
pickle memo does). By default each distinct stack's frame list is shared
too, which keeps a file of 1M blocks and 2M events near 200 MB; with
--fresh-lists every block and event gets its own list, as PyTorch's
`_snapshot()` builds them, which makes the same content near 1 GB.

The output is deterministic for given arguments.
"""

import argparse
import glob
import os
import pickle
import random

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "shared", "fixtures", "torch")

KiB = 1024
MiB = 1024 * KiB
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB
BASE_ADDRESS = 0x7F0000000000
POOL_ADDRESS = 0x7E0000000000
T0 = 1_750_000_000_000_000


def real_stacks(fixtures):
    """The distinct stacks of the real snapshots, as tuples of (name, file, line)."""
    stacks = set()
    for path in sorted(glob.glob(os.path.join(fixtures, "*.pickle"))):
        with open(path, "rb") as f:
            snap = pickle.load(f)
        records = [b for s in snap.get("segments", []) for b in s["blocks"]]
        records += [e for t in snap.get("device_traces", []) for e in t]
        for r in records:
            frames = r.get("frames") or []
            if len(frames) >= 10:
                stacks.add(tuple((f["name"], f["filename"], f["line"]) for f in frames))
    if not stacks:
        raise SystemExit(f"no stacks found in {fixtures}/*.pickle")
    return sorted(stacks)


def first_python_frame(stack):
    for i, frame in enumerate(stack):
        if frame[1].endswith(".py"):
            return i
    return len(stack)


def target_depth(rng):
    r = rng.random()
    if r < 0.70:
        return rng.randint(20, 60)
    if r < 0.95:
        return rng.randint(60, 150)
    return rng.randint(150, 260)


def make_stacks(rng, templates, count):
    """`count` distinct stacks of 20 to 260 frames built from real ones."""
    tails = [t[first_python_frame(t):] for t in templates]
    tails = [t for t in tails if t]
    stacks, seen = [], set()
    while len(stacks) < count:
        template = rng.choice(templates)
        depth = target_depth(rng)
        cut = first_python_frame(template)
        middle = []
        while cut + len(middle) + len(template) - cut < depth:
            tail = rng.choice(tails)
            start = rng.randrange(len(tail))
            middle += tail[start:start + rng.randint(2, 12)]
        stack = (template[:cut] + tuple(middle) + template[cut:])[:depth]
        if stack not in seen:
            seen.add(stack)
            stacks.append(stack)
    return stacks


class Frames:
    """Shared frame dicts and, unless fresh lists are asked for, shared lists."""

    def __init__(self, stacks, fresh):
        dicts = {}
        self.stacks = [
            [dicts.setdefault(f, {"name": f[0], "filename": f[1], "line": f[2]}) for f in s]
            for s in stacks
        ]
        self.fresh = fresh

    def of(self, stack):
        frames = self.stacks[stack]
        return list(frames) if self.fresh else frames


def block_size(rng):
    """A block size and the request it was rounded from, weighted toward small."""
    r = rng.random()
    if r < 0.55:
        size = 512 * rng.randint(1, 8)
    elif r < 0.85:
        size = 512 * rng.randint(9, 2048)
    elif r < 0.98:
        size = 2 * MiB * rng.randint(1, 4)
    else:
        size = 2 * MiB * rng.randint(5, 10)
    return size, size - rng.randrange(0, min(size, 512))


def make_blocks(rng, stacks, count):
    """`count` live blocks: (stack, size, requested). A few sites hold many."""
    weights = [1.0 / (i + 1) ** 0.8 for i in range(stacks)]
    sites = rng.choices(range(stacks), weights=weights, k=count)
    return [(s, *block_size(rng)) for s in sites]


def segments_of(blocks, frames):
    """Packs blocks into small (2 MiB) and large (20 MiB+) segments, in order."""
    segments = []
    address = BASE_ADDRESS
    for kind in ("small", "large"):
        cap = SMALL_SEGMENT if kind == "small" else LARGE_SEGMENT
        current, used = [], 0
        for b in blocks:
            if (b["size"] < MiB) != (kind == "small"):
                continue
            if current and used + b["size"] > cap:
                segments.append(segment(address, current, kind, max(cap, used), frames))
                address += max(cap, used)
                current, used = [], 0
            current.append(b)
            used += b["size"]
        if current:
            segments.append(segment(address, current, kind, max(cap, used), frames))
            address += max(cap, used)
    return segments


def segment(address, blocks, kind, total, frames):
    blocks = [dict(b) for b in blocks]
    at = address
    for b in blocks:
        b["address"] = at
        at += b["size"]
    if at < address + total:
        blocks.append({"address": at, "size": address + total - at, "requested_size": 0, "state": "inactive", "frames": []})
    active = [b for b in blocks if b["state"] != "inactive"]
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": sum(b["size"] for b in active),
        "active_size": sum(b["size"] for b in active),
        "requested_size": sum(b["requested_size"] for b in active),
        "stream": 0,
        "segment_type": kind,
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": frames.of(blocks[0]["stack"]) if "stack" in blocks[0] else [],
        "blocks": [{k: v for k, v in b.items() if k != "stack"} for b in blocks],
    }


def as_block(site, size, requested, frames):
    return {"size": size, "requested_size": requested, "state": "active_allocated", "frames": frames.of(site), "stack": site}


def make_trace(rng, events, stacks, frames, step, clock):
    """A steady loop's window: each step allocates temporaries at its sites
    and frees them (free_requested, free_completed), newest first."""
    trace = []
    per_step = 300
    sites = rng.sample(range(stacks), min(stacks, 2000))
    t = clock
    while len(trace) < events:
        live = []
        for i in range(per_step):
            if len(trace) + 3 * (len(live) + 1) > events:
                break
            site = sites[(step * 7 + i) % len(sites)]
            size, _ = block_size(rng)
            addr = POOL_ADDRESS + (i * 16 * MiB)
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames.of(site), "compile_context": "N/A", "user_metadata": ""})
            live.append((addr, size, site))
            t += 3
        for addr, size, site in reversed(live):
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames.of(site), "compile_context": "N/A", "user_metadata": ""})
                t += 1
        if not live:
            break
        step += 1
    return trace, t


def snapshot(segments, trace):
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": 2**64 - 1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(2**i): 0 for i in range(16)},
        },
        "external_annotations": [],
    }


def write(path, snap):
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=pickle.HIGHEST_PROTOCOL)
    print(f"wrote {path} ({os.path.getsize(path) / MiB:.1f} MiB)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--blocks", type=int, default=1_000_000, help="live blocks of the first file")
    p.add_argument("--events", type=int, default=2_000_000, help="trace events of each file")
    p.add_argument("--stacks", type=int, default=20_000, help="distinct stacks")
    p.add_argument("--growth", type=int, default=2_000, help="new blocks in the second file at the growing sites")
    p.add_argument("--fresh-lists", action="store_true", help="a frame list per block and event, as PyTorch writes")
    p.add_argument("--only-a", action="store_true", help="write the first file only")
    p.add_argument("--fixtures", default=FIXTURES, help="the real snapshots the frames come from")
    p.add_argument("--seed", type=int, default=14)
    args = p.parse_args()

    rng = random.Random(args.seed)
    stacks = make_stacks(rng, real_stacks(args.fixtures), args.stacks)
    frames = Frames(stacks, args.fresh_lists)
    os.makedirs(args.outdir, exist_ok=True)

    blocks = [as_block(*b, frames) for b in make_blocks(rng, len(stacks), args.blocks)]
    trace, clock = make_trace(rng, args.events, len(stacks), frames, 0, T0)
    write(os.path.join(args.outdir, "real-a.pickle"), snapshot(segments_of(blocks, frames), trace))
    if args.only_a:
        return

    # Later: 1% of the blocks freed, growth at five sites (a leak), and a
    # few new blocks elsewhere, appended so the kept blocks keep their
    # addresses.
    kept = [b for b in blocks if rng.random() >= 0.01]
    growing = rng.sample(range(len(stacks)), 5)
    new = [as_block(growing[i % 5], 4096, 4000 + i % 96, frames) for i in range(args.growth)]
    new += [as_block(s, size, req, frames) for s, size, req in make_blocks(rng, len(stacks), args.growth // 4)]
    freed = {id(b) for b in blocks} - {id(b) for b in kept}
    after = [b if id(b) not in freed else dict(b, state="inactive", requested_size=0, frames=[]) for b in blocks] + new
    trace, _ = make_trace(rng, args.events, len(stacks), frames, 1000, clock)
    write(os.path.join(args.outdir, "real-b.pickle"), snapshot(segments_of(after, frames), trace))


if __name__ == "__main__":
    main()
