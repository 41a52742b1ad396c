"""Records the storages of CPU tensors in the schema of PyTorch's CUDA
memory snapshots, for jobs that run without a GPU.

PyTorch records memory history only for its CUDA caching allocator. This
recorder sees every tensor an ATen operator returns (a `TorchDispatchMode`,
so forward, backward through autograd, optimizer steps and module set-up
alike), and notes each new storage with its size and the Python stack that
made it.

A storage's end is noted before the next operator runs: every tensor an
operator returns is watched through a weak reference, and when one goes,
its storage is checked once the tensor has let it go. A storage that moves
(`resize_`, `set_`) is noted as freed at its old place and allocated at its
new one, so the trace's live bytes follow PyTorch's own accounting. A sweep
of all live storages, every few operators and before each dump, catches a
storage released some other way.

Each storage is modelled the way the CPU allocator hands it out: its own
segment holding one block. Trace events are PyTorch's (`segment_alloc`,
`alloc`, `free_requested`, `free_completed`, `segment_free`, and a
`snapshot` marker at each dump), so every reader of `_dump_snapshot` files,
snapdiff's and `torch.cuda._memory_viz`'s, reads what this writes.

What it cannot see: storages made without an ATen operator (`torch.from_numpy`,
tensors rebuilt from shared memory sent by DataLoader workers, storages
made in C++ extensions that skip the dispatcher), operators run on threads
other than the one that started recording, and tensors without a plain
storage (sparse, CSR, MKLDNN), which are skipped and counted. Nothing it
does raises into the program: a failure of its own is reported once and
recording stops.
"""

import collections
import sys
import threading
import time
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

# Frames in these files are the recorder's own machinery, not the program's
# (torch wraps a mode's `__torch_dispatch__` in `torch/_compile.py`).
_MACHINERY = (
    __file__, "torch/utils/_python_dispatch.py", "torch/_dynamo/", "torch/_compile.py",
)


def _is_machinery(filename):
    return any(m in filename for m in _MACHINERY)


# The frames of every record when stacks are off.
_NO_FRAMES = []
# PyTorch's split between the small and the large pool, for `segment_type`.
_SMALL_SIZE = 1 << 20


class _Storage:
    """One live storage: which (PyTorch's storage object, by address),
    where its bytes are, how many, the weak reference that tells when it is
    gone, the stack that made it, and its segment in the snapshots (made at
    the first dump that holds it, then kept)."""

    __slots__ = ("key", "address", "size", "ref", "frames", "segment")

    def __init__(self, key, address, size, ref, frames):
        self.key = key
        self.address = address
        self.size = size
        self.ref = ref
        self.frames = frames
        self.segment = None


class _Watch(weakref.ref):
    """A weak reference to a tensor an operator returned, with the key of
    its storage and its id (under which the recorder keeps it)."""

    __slots__ = ("key", "tensor_id")

    def __new__(cls, tensor, callback, key):
        return super().__new__(cls, tensor, callback)

    def __init__(self, tensor, callback, key):
        super().__init__(tensor, callback)
        self.key = key
        self.tensor_id = id(tensor)


class CpuRecorder(TorchDispatchMode):
    """The recorder. `start()` turns it on for the calling thread,
    `snapshot()` returns the snapshot dict `_dump_snapshot` would pickle."""

    def __init__(self, max_entries=100000, warn=None, stacks=True):
        super().__init__()
        # Without stacks (`capture --no-stacks`) every record has no frames.
        self._stacks_on = bool(stacks)
        # Re-entrant: a weak reference's callback or the garbage collector
        # may run inside a locked section.
        self._lock = threading.RLock()
        self._live = {}  # storage key -> _Storage
        self._at = {}  # data pointer -> _Storage
        self._watched = {}  # id of a returned tensor -> its _Watch
        self._gone = collections.deque()  # keys of storages a tensor let go
        self._kinds = {}  # operator -> its kind (see `_kind`)
        # Events as (action, address, size, time, frames): tuples are made
        # for every event, PyTorch's dicts at the next dump (`_trace_event`),
        # once, into `_events`; both hold the last `max_entries`.
        entries = max(int(max_entries), 1)
        self._trace = collections.deque(maxlen=entries)
        self._events = collections.deque(maxlen=entries)
        self._ops_since_sweep = 0
        self._frames = {}  # (code, line) -> frame dict, shared by stacks
        self._stacks = {}  # tuple of (code, last instruction) -> list of frame dicts
        self._machinery = {}  # code -> whether it is the recorder's machinery
        self._paused = False
        self._warn = warn or (lambda message: print(f"snapdiff: {message}", file=sys.stderr))
        self.storages_seen = 0
        self.tensors_skipped = 0

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
        if self._paused:
            return func(*args, **(kwargs or {}))
        moved = None
        try:
            if self._gone:
                self._settle()
            # An operator that resizes its tensor may move its storage
            # (`resize_`, an `out=` argument) or drop it (`set_`): that
            # storage is checked after. (Most operators are known not to.)
            kind = self._kinds.get(func)
            if kind is None:
                kind = self._kinds[func] = _kind(func)
            if kind == "inplace":
                # It returns the tensors it was given, whose storages are
                # known (or not an operator's): nothing to note.
                out = func(*args, **(kwargs or {}))
                self._ops_since_sweep += 1
                return out
            target = self._moved_by(kind, args, kwargs) if kind else None
            if target is not None:
                storage = self._storage_of(target)
                moved = None if storage is None else self._live.get(storage._cdata)
                del storage  # holding it would keep it alive
        except Exception as e:
            self._fail(e)
            return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if self._paused:
            return out
        try:
            if moved is not None:
                self._check(moved, target)
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
        except Exception as e:
            self._fail(e)
        return out

    def _moved_by(self, kind, args, kwargs):
        """The CPU tensor whose storage an operator of `kind` (see `_kind`)
        may move or drop: the first argument of `resize_`, `resize_as_` and
        `set_`, the `out=` argument of an `.out` overload; else None."""
        if kind == "self" and args:
            target = args[0]
        elif kind == "out" and kwargs:
            target = kwargs.get("out")
        else:
            return None
        return target if _is_cpu_tensor(target) else None

    def _fail(self, error):
        """Stops recording after a failure of the recorder's own, saying so
        once: the program goes on as if it were not recorded."""
        self._paused = True
        self._warn(
            f"the CPU recorder stopped ({type(error).__name__}: {error}); "
            "the program goes on unrecorded"
        )

    def _storage_of(self, tensor):
        """The storage behind `tensor`, or None for a tensor without a plain
        one (sparse, CSR, MKLDNN), which is counted."""
        try:
            return tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):
            self.tensors_skipped += 1
            if self.tensors_skipped == 1:
                self._warn(
                    f"the CPU recorder skips tensors without a plain storage "
                    f"({tensor.layout}, and others later); they are counted, not recorded"
                )
            return None

    def _check(self, known, tensor):
        """Notes that `known`, the storage `tensor` had before an in-place
        operator, has ended or moved, if it did."""
        if self._live.get(known.key) is not known:
            return
        if known.ref.expired():
            with self._lock:
                if self._live.get(known.key) is known:
                    self._release(known, _now_us())
            return
        storage = self._storage_of(tensor)
        if storage is not None and storage._cdata == known.key and (
            storage.data_ptr() != known.address or storage.nbytes() != known.size
        ):
            self._note_storage(storage)

    def _note(self, tensor):
        if not tensor.is_cpu:
            return
        storage = self._storage_of(tensor)
        if storage is None:
            return
        key = storage._cdata
        # Each tensor is watched once (an in-place operator returns the
        # tensor it was given), for the storage it has now.
        watch = self._watched.get(id(tensor))
        if watch is not None and watch() is tensor:
            watch.key = key
        else:
            self._watched[id(tensor)] = _Watch(tensor, self._on_tensor_gone, key)
        known = self._live.get(key)
        if (
            known is not None
            and known.address == storage.data_ptr()
            and known.size == storage.nbytes()
        ):
            return
        self._note_storage(storage)

    def _note_storage(self, storage):
        """Notes `storage` as allocated where it is now, by the operator's
        caller, ending what was recorded for it before (it moved) or at its
        address (that storage is gone)."""
        key, address, size = storage._cdata, storage.data_ptr(), storage.nbytes()
        frames = self._stack()
        now = _now_us()
        with self._lock:
            for earlier in (self._live.get(key), self._at.get(address)):
                if earlier is not None and self._live.get(earlier.key) is earlier:
                    self._release(earlier, now)
            if address == 0 or size == 0:
                return
            noted = _Storage(key, address, size, StorageWeakRef(storage), frames)
            self._live[key] = noted
            self._at[address] = noted
            self.storages_seen += 1
            self._trace.append(("segment_alloc", address, size, now, frames))
            self._trace.append(("alloc", address, size, now, frames))

    def _on_tensor_gone(self, watch):
        """A watched tensor is going: its storage is checked before the
        next operator (now, the tensor still holds it). Any thread."""
        try:  # a weak reference's callback must never raise (nor print)
            if self._watched.get(watch.tensor_id) is watch:
                del self._watched[watch.tensor_id]
            self._gone.append(watch.key)
        except Exception:
            pass

    def _settle(self):
        """Notes the end of the storages that tensors gone since the last
        operator let go, if nothing else holds them."""
        now = None
        with self._lock:
            while self._gone:
                s = self._live.get(self._gone.popleft())
                if s is not None and s.ref.expired():
                    now = now or _now_us()
                    self._release(s, now)

    def _sweep(self):
        """Notes the end of every storage PyTorch has released. Holds the lock."""
        self._ops_since_sweep = 0
        # `StorageWeakRef.expired`, without a Python call per storage.
        expired = torch.UntypedStorage._expired
        gone = [s for s in self._live.values() if expired(s.ref.cdata)]
        if gone:
            now = _now_us()
            for s in gone:
                self._release(s, now)

    def _release(self, storage, now):
        """Notes that `storage` is gone. Holds the lock."""
        del self._live[storage.key]
        if self._at.get(storage.address) is storage:
            del self._at[storage.address]
        address, size, frames = storage.address, storage.size, storage.frames
        append = self._trace.append
        append(("free_requested", address, size, now, frames))
        append(("free_completed", address, size, now, frames))
        append(("segment_free", address, size, now, frames))

    def _stack(self):
        """The Python stack of the operator's caller, innermost frame first,
        as a list shared with every other allocation from the same place
        (empty without stacks). Places are told apart by each frame's code
        and last instruction, which read faster than its line; lines are
        read only for a stack not seen before."""
        if not self._stacks_on:
            return _NO_FRAMES
        f = sys._getframe(2)
        machinery = self._machinery
        while f is not None:
            code = f.f_code
            skip = machinery.get(code)
            if skip is None:
                skip = machinery[code] = _is_machinery(code.co_filename)
            if not skip:
                break
            f = f.f_back
        caller = f
        key = []
        place = key.append
        while f is not None:
            place((f.f_code, f.f_lasti))
            f = f.f_back
        key = tuple(key)
        stack = self._stacks.get(key)
        if stack is None:
            stack = []
            f = caller
            while f is not None:
                stack.append(self._frame(f.f_code, f.f_lineno))
                f = f.f_back
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
        lays them out. Safe to call from any thread. Each record is made
        once and kept for later dumps (so a dump costs what changed since
        the last): a caller changes a record only in ways that leave it the
        same when done again."""
        with self._lock:
            self._settle()
            self._sweep()
            live = sorted(self._live.values(), key=lambda s: s.address)
            new_events = list(self._trace)
            self._trace.clear()
            active = sum(s.size for s in live)
            # PyTorch marks each dump in the trace; later dumps show where it was.
            self._trace.append(("snapshot", 0, active, _now_us(), _NO_FRAMES))
        self._events.extend(_trace_event(*event) for event in new_events)
        segments = []
        for storage in live:
            if storage.segment is None:
                storage.segment = _segment(storage)
            segments.append(storage.segment)
        return {
            "segments": segments,
            "device_traces": [list(self._events)],
            "snapdiff_recorder": "cpu",
            "snapdiff_skipped_tensors": self.tensors_skipped,
        }


def _trace_event(action, address, size, time_us, frames):
    """One trace event as PyTorch's snapshots lay it out."""
    return {"action": action, "addr": address, "size": size, "stream": 0,
            "time_us": time_us, "frames": frames}


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


def _kind(func):
    """What an operator may do to storages: "self" (`resize_`, `resize_as_`
    and `set_` may move or drop their first argument's), "out" (an `.out`
    overload may resize its `out=`), "inplace" (it writes into the tensors
    it was given and returns them: `add_`, `mul_`), else ""."""
    if func._schema.name in ("aten::resize_", "aten::resize_as_", "aten::set_"):
        return "self"
    if func._overloadname.startswith("out"):
        return "out"
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and r.alias_info.is_write for r in returns):
        return "inplace"
    return ""


def _is_cpu_tensor(value):
    return isinstance(value, torch.Tensor) and value.device.type == "cpu"


def _now_us():
    return time.time_ns() // 1000
