#!/usr/bin/env python3
"""Make a leaking variant of a real PyTorch snapshot, with CPython's pickler.

    inject_leak.py snapshot IN OUT --blocks K --size S [--stack-from FILE]
    inject_leak.py trace IN OUT --allocs K --size S [--stack-from FILE]

`snapshot` adds a segment of K live blocks of S bytes each: a second
snapshot of the same job, taken after a leak. `trace` also inserts K `alloc`
events spread evenly through the first device's trace, never freed.

The new allocations reuse a real stack: the frame list of the first live
block (snapshot) or trace event (trace) of the file (or of --stack-from) that
has a frame of user code. Prints JSON: the culprit frame (the innermost user
frame), the bytes injected, and, for `trace`, the index of each inserted
event in the new trace.
"""
import argparse
import os
import json
import pickle


# Packages whose copy inside a job's own tree is a library's code (the maph
# fixture vendors transformers in the job's folder).
LIBRARIES = ("torch", "transformers", "accelerate", "deepspeed", "lightning", "peft")


def placed_as_user(f):
    """A Python file outside installed packages and the standard library."""
    return f.endswith(".py") and not any(
        p in f for p in ("/site-packages/", "/dist-packages/", "/lib/python"))


def user_frames(frames):
    """The frames of the job's own code in one stack (innermost first): placed
    as the user's, and no library's folder below the folder each shares with
    the stack's outermost such frame (the script)."""
    placed = [fr for fr in frames if placed_as_user(fr["filename"])]
    if not placed:
        return []
    entry = placed[-1]["filename"]

    def vendored(f):
        shared = os.path.commonpath([f, entry])
        folders = os.path.relpath(f, shared).split("/")[:-1]
        return any(lib in folders for lib in LIBRARIES)

    return [fr for fr in placed if not vendored(fr["filename"])]


def pick_stack(snap):
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "inactive" and user_frames(b.get("frames", [])):
                return b["frames"]
    for trace in snap.get("device_traces", []):
        for e in trace:
            if user_frames(e.get("frames", [])):
                return e["frames"]
    raise SystemExit("no stack with a user frame")


def new_segment(snap, addresses, size, frames):
    top = max(s["address"] + s["total_size"] for s in snap["segments"])
    base = (top + (1 << 30)) & ~((1 << 21) - 1)
    blocks = []
    for i in range(len(addresses)):
        addresses[i] = base + i * size
        blocks.append({"address": addresses[i], "size": size, "requested_size": size,
                       "state": "active_allocated", "frames": frames})
    total = size * len(blocks)
    snap["segments"].append({
        "device": 0, "address": base, "total_size": total, "allocated_size": total,
        "active_size": total, "requested_size": total, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": blocks,
    })


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["snapshot", "trace"])
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--blocks", "--allocs", dest="count", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--stack-from")
    a = p.parse_args()
    with open(a.input, "rb") as f:
        snap = pickle.load(f)
    source = snap
    if a.stack_from:
        with open(a.stack_from, "rb") as f:
            source = pickle.load(f)
    frames = pick_stack(source)
    culprit = user_frames(frames)[0]
    addresses = [0] * a.count
    new_segment(snap, addresses, a.size, frames)
    positions = []
    if a.mode == "trace":
        trace = snap["device_traces"][0]
        n = len(trace)
        inserts = [(k + 1) * n // (a.count + 1) for k in range(a.count)]
        out = []
        for i, e in enumerate(trace):
            while inserts and inserts[0] == i:
                inserts.pop(0)
                ev = {"action": "alloc", "addr": addresses[len(positions)], "size": a.size, "stream": 0,
                      "frames": frames}
                if "time_us" in e:
                    ev["time_us"] = e["time_us"]
                positions.append(len(out))
                out.append(ev)
            out.append(e)
        snap["device_traces"][0] = out
    with open(a.output, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    print(json.dumps({"culprit": {"name": culprit["name"], "file": culprit["filename"], "line": culprit["line"]},
                      "bytes": a.count * a.size, "size": a.size, "positions": positions}))


if __name__ == "__main__":
    main()
