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


def main(path):
    data = load(path)
    if isinstance(data, list):
        data = {"segments": data, "device_traces": []}
    blocks = [b for s in data["segments"] for b in s["blocks"]]
    active = [b for b in blocks if b["state"] != "inactive"]
    events = [e for t in data.get("device_traces", []) for e in t]
    print(json.dumps({
        "segments": len(data["segments"]),
        "blocks": len(blocks),
        "reserved_bytes": sum(s["total_size"] for s in data["segments"]),
        "allocated_bytes": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
        "active_bytes": sum(b["size"] for b in active),
        "requested_bytes": sum(b.get("requested_size", b["size"]) for b in active),
        "trace_events": len(events),
        "actions": dict(collections.Counter(e["action"] for e in events)),
        "frames_per_block": [len(b.get("frames") or (b.get("history") or [{}])[0].get("frames", [])) for b in blocks],
    }))


if __name__ == "__main__":
    main(sys.argv[1])
