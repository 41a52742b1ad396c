"""Records the storages of CPU tensors in the schema of PyTorch's CUDA
memory snapshots, for jobs that run without a GPU.

PyTorch records memory history only for its CUDA caching allocator. This
recorder sees every tensor an ATen operator returns (a `TorchDispatchMode`,
so forward, backward through autograd, optimizer steps and module set-up
alike), notes each new storage with its size and the Python stack that made
it, and notes a storage's end once PyTorch has released it (checked through
a weak reference to the storage, every few operators and before each dump).

Each storage is modelled the way the CPU allocator hands it out: its own
segment holding one block. Trace events are PyTorch's (`segment_alloc`,
`alloc`, `free_requested`, `free_completed`, `segment_free`, and a
`snapshot` marker at each dump), so every reader of `_dump_snapshot` files,
snapdiff's and `torch.cuda._memory_viz`'s, reads what this writes.

What it cannot see: storages made without an ATen operator (`torch.from_numpy`,
tensors rebuilt from shared memory sent by DataLoader workers, storages
made in C++ extensions that skip the dispatcher), and operators run on
threads other than the one that started recording. A free is noted when it
is found, at most a few operators after it happened.
"""

import collections
import sys
import threading
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

# Frames in these files are the recorder's own machinery, not the program's.
_MACHINERY = (__file__, "torch/utils/_python_dispatch.py", "torch/_dynamo/")


def _is_machinery(filename):
    return any(m in filename for m in _MACHINERY)
# PyTorch's split between the small and the large pool, for `segment_type`.
_SMALL_SIZE = 1 << 20


class _Storage:
    """One live storage: where, how large, the weak reference that tells
    when it is gone, and the stack that made it."""

    __slots__ = ("address", "size", "ref", "frames")

    def __init__(self, address, size, ref, frames):
        self.address = address
        self.size = size
        self.ref = ref
        self.frames = frames


class CpuRecorder(TorchDispatchMode):
    """The recorder. `start()` turns it on for the calling thread,
    `snapshot()` returns the snapshot dict `_dump_snapshot` would pickle."""

    def __init__(self, max_entries=100000):
        super().__init__()
        self._lock = threading.Lock()
        self._live = {}  # data pointer -> _Storage
        self._trace = collections.deque(maxlen=max(int(max_entries), 1))
        self._ops_since_sweep = 0
        self._frames = {}  # (code, line) -> frame dict, shared by stacks
        self._stacks = {}  # tuple of (code, line) -> list of frame dicts
        self._paused = False
        self.storages_seen = 0

    # -- recording ---------------------------------------------------------

    def start(self):
        """Starts recording on this thread; lasts until `stop`."""
        self.__enter__()

    def stop(self):
        """Stops recording on this thread."""
        self.__exit__(None, None, None)

    def pause(self):
        """Keeps the mode but records nothing (a forked child)."""
        self._paused = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._paused:
            return out
        if isinstance(out, torch.Tensor):
            self._note(out)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._note(t)
        self._ops_since_sweep += 1
        if self._ops_since_sweep > 64 + len(self._live) // 4:
            with self._lock:
                self._sweep()
        return out

    def _note(self, tensor):
        if tensor.device.type != "cpu":
            return
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        size = storage.nbytes()
        if address == 0 or size == 0:
            return
        known = self._live.get(address)
        if known is not None and not known.ref.expired():
            return
        frames = self._stack()
        now = _now_us()
        with self._lock:
            # Looked up again under the lock: a dump's sweep may have released
            # the storage that lived here since.
            known = self._live.get(address)
            if known is not None:
                # The storage that lived here is gone and its address reused.
                self._release(known, now)
            self._live[address] = _Storage(address, size, StorageWeakRef(storage), frames)
            self.storages_seen += 1
            self._event("segment_alloc", address, size, now, frames)
            self._event("alloc", address, size, now, frames)

    def _sweep(self):
        """Notes the end of every storage PyTorch has released. Holds the lock."""
        self._ops_since_sweep = 0
        gone = [s for s in self._live.values() if s.ref.expired()]
        if gone:
            now = _now_us()
            for s in gone:
                self._release(s, now)

    def _release(self, storage, now):
        """Notes that `storage` is gone. Holds the lock."""
        del self._live[storage.address]
        for action in ("free_requested", "free_completed", "segment_free"):
            self._event(action, storage.address, storage.size, now, storage.frames)

    def _event(self, action, address, size, now, frames):
        self._trace.append(
            {
                "action": action,
                "addr": address,
                "size": size,
                "stream": 0,
                "time_us": now,
                "frames": frames,
            }
        )

    def _stack(self):
        """The Python stack of the operator's caller, innermost frame first,
        as a list shared with every other allocation from the same place."""
        f = sys._getframe(2)
        while f is not None and _is_machinery(f.f_code.co_filename):
            f = f.f_back
        key = []
        while f is not None:
            key.append((f.f_code, f.f_lineno))
            f = f.f_back
        key = tuple(key)
        stack = self._stacks.get(key)
        if stack is None:
            stack = [self._frame(code, line) for code, line in key]
            self._stacks[key] = stack
        return stack

    def _frame(self, code, line):
        frame = self._frames.get((code, line))
        if frame is None:
            frame = {"filename": code.co_filename, "line": line, "name": code.co_name}
            self._frames[(code, line)] = frame
        return frame

    # -- dumping -----------------------------------------------------------

    def snapshot(self):
        """The live storages and the trace, as `torch.cuda.memory._snapshot()`
        lays them out. Safe to call from any thread."""
        with self._lock:
            self._sweep()
            live = sorted(self._live.values(), key=lambda s: s.address)
            trace = list(self._trace)
            active = sum(s.size for s in live)
            # PyTorch marks each dump in the trace; later dumps show where it was.
            self._trace.append(
                {"action": "snapshot", "addr": 0, "size": active, "stream": 0,
                 "time_us": _now_us(), "frames": []}
            )
        segments = [_segment(s) for s in live]
        return {
            "segments": segments,
            "device_traces": [trace],
            "snapdiff_recorder": "cpu",
        }


def _segment(s):
    return {
        "device": 0,
        "address": s.address,
        "total_size": s.size,
        "allocated_size": s.size,
        "active_size": s.size,
        "requested_size": s.size,
        "stream": 0,
        "segment_type": "small" if s.size <= _SMALL_SIZE else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": s.frames,
        "blocks": [
            {
                "address": s.address,
                "size": s.size,
                "requested_size": s.size,
                "state": "active_allocated",
                "frames": s.frames,
            }
        ],
    }


def _now_us():
    return time.time_ns() // 1000
