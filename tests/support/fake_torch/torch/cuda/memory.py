"""Stand-in for torch.cuda.memory (see torch/__init__.py)."""
import pickle

_dumps = 0


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=None, **kwargs):
    import torch
    torch._log("_record_memory_history", enabled=enabled, context=context, stacks=stacks, max_entries=max_entries)


def _snapshot():
    global _dumps
    _dumps += 1
    leak = [{"name": "train_step", "filename": "/home/user/train.py", "line": 42},
            {"name": "<module>", "filename": "/home/user/train.py", "line": 60}]
    blocks = [{"address": 0x7F0000000000 + i * (1 << 20), "size": 1 << 20, "requested_size": 1 << 20,
               "state": "active_allocated", "frames": leak} for i in range(_dumps)]
    segment = {"device": 0, "address": 0x7F0000000000, "total_size": _dumps << 20, "stream": 0,
               "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": leak,
               "blocks": blocks}
    return {"segments": [segment], "device_traces": [[]]}


def _dump_snapshot(filename="dump_snapshot.pickle"):
    import torch
    torch._log("_dump_snapshot", filename=filename)
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)
