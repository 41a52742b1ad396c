#!/usr/bin/env python3
"""Print, as JSON, the totals of a PyTorch snapshot file computed by CPython.

The tests compare snapdiff's `summary --json` with these numbers, so the
expected values come from Python's own pickle module, not from snapdiff.
Reads pickles and torch.save zips of plain objects (no torch needed).
"""
import collections
import json
import pickle
import sys
import zipfile


def load(path):
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            name = next(n for n in z.namelist() if n.endswith("data.pkl"))
            return pickle.loads(z.read(name))
    with open(path, "rb") as f:
        return pickle.load(f)


def block_frames(b):
    return b.get("frames") or (b.get("history") or [{}])[0].get("frames", [])


def stacks(frame_lists):
    """Each frame list as an index into a table of distinct stacks, each
    stack as indices into a table of distinct (name, filename, line)."""
    frames, stacks, frame_ids, stack_ids, which = [], [], {}, {}, []
    for frame_list in frame_lists:
        stack = []
        for f in frame_list:
            key = (f["name"], f["filename"], f["line"])
            if key not in frame_ids:
                frame_ids[key] = len(frames)
                frames.append(list(key))
            stack.append(frame_ids[key])
        stack = tuple(stack)
        if stack not in stack_ids:
            stack_ids[stack] = len(stacks)
            stacks.append(list(stack))
        which.append(stack_ids[stack])
    return {"frames": frames, "stacks": stacks, "which": which}


def main(path):
    data = load(path)
    if isinstance(data, list):
        data = {"segments": data, "device_traces": []}
    # Pinned host memory (newest PyTorch) is a device of its own, after the
    # others: its segments follow theirs, its one list of events their traces.
    segments = data["segments"] + data.get("host_segments", [])
    blocks = [b for s in segments for b in s["blocks"]]
    active = [b for b in blocks if b["state"] != "inactive"]
    traces = data.get("device_traces", []) + ([data["host_traces"]] if data.get("host_traces") else [])
    events = [e for t in traces for e in t]
    print(json.dumps({
        "segments": len(segments),
        "blocks": len(blocks),
        "reserved_bytes": sum(s["total_size"] for s in segments),
        "allocated_bytes": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
        "active_bytes": sum(b["size"] for b in active),
        "requested_bytes": sum(b.get("requested_size", b["size"]) for b in active),
        "trace_events": len(events),
        "actions": dict(collections.Counter(e["action"] for e in events)),
        "frames_per_block": [len(block_frames(b)) for b in blocks],
        "block_stacks": stacks(block_frames(b) for b in blocks),
        "event_stacks": stacks(e.get("frames") or [] for e in events),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
