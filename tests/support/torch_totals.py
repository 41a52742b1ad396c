#!/usr/bin/env python3
"""Print, as JSON, the totals of a PyTorch snapshot file computed by CPython.

The tests compare snapdiff's `summary --json` with these numbers, so the
expected values come from Python's own pickle module, not from snapdiff.
Reads pickles and torch.save zips of plain objects (no torch needed).
"""
import collections
import json
import pickle
import re
import sys
import zipfile


def load(path):
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            name = next(n for n in z.namelist() if n.endswith("data.pkl"))
            return pickle.loads(z.read(name))
    with open(path, "rb") as f:
        return pickle.load(f)


# Anomaly mode's forward frames follow a backward allocation's own frames,
# behind a marker frame, innermost first (docs/format.md, `forward_frames`).
FORWARD_MARKER = {"name": "(backward)", "filename": "<autograd>", "line": 0}
TRACEBACK_ENTRY = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')


def with_forward(frames, record):
    entries = [TRACEBACK_ENTRY.match(line) for text in record.get("forward_frames") or [] for line in text.splitlines()]
    forward = [{"name": m[3], "filename": m[1], "line": int(m[2])} for m in entries if m]
    return list(frames) + [FORWARD_MARKER] + forward[::-1] if forward else frames


def block_frames(b):
    own = b.get("frames") or (b.get("history") or [{}])[0].get("frames", [])
    return with_forward(own, b)


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
    # Pinned host memory (newest PyTorch) is no device: the totals are the
    # devices', the host's come apart. Its segments follow theirs in the
    # file's model, its one list of events their traces.
    devices = data["segments"]
    host = data.get("host_segments", [])
    device_blocks = [b for s in devices for b in s["blocks"]]
    active = [b for b in device_blocks if b["state"] != "inactive"]
    blocks = device_blocks + [b for s in host for b in s["blocks"]]
    traces = data.get("device_traces", []) + ([data["host_traces"]] if data.get("host_traces") else [])
    events = [e for t in traces for e in t]
    host_blocks = [b for s in host for b in s["blocks"]]
    cached = [b for b in host_blocks if b["state"] == "inactive"]
    in_use = [b for b in host_blocks if b["state"] != "inactive"]
    pinned_host = {
        "reserved_bytes": sum(b["size"] for b in host_blocks),
        "in_use_bytes": sum(b["size"] for b in in_use),
        "in_use_blocks": len(in_use),
        "cached_bytes": sum(b["size"] for b in cached),
        "cached_blocks": len(cached),
        "cached_sizes": len({b["size"] for b in cached}),
    } if host else None
    print(json.dumps({
        "segments": len(devices),
        "blocks": len(device_blocks),
        "reserved_bytes": sum(s["total_size"] for s in devices),
        "allocated_bytes": sum(b["size"] for b in device_blocks if b["state"] == "active_allocated"),
        "active_bytes": sum(b["size"] for b in active),
        "requested_bytes": sum(b.get("requested_size", b["size"]) for b in active),
        "pinned_host": pinned_host,
        "trace_events": len(events),
        "actions": dict(collections.Counter(e["action"] for e in events)),
        "frames_per_block": [len(block_frames(b)) for b in blocks],
        "block_stacks": stacks(block_frames(b) for b in blocks),
        "event_stacks": stacks(with_forward(e.get("frames") or [], e) for e in events),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
