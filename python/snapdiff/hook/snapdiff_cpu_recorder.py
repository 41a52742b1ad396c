"""Records the storages of CPU tensors in the schema of PyTorch's CUDA
memory snapshots, for jobs that run without a GPU.

PyTorch records memory history only for its CUDA caching allocator. Two
recorders fill the gap; `CpuRecorder(...)` returns the better one that works:

- `AllocatorRecorder` wraps PyTorch's CPU allocator (`snapdiff_cpu_alloc.cpp`,
  compiled on first use with the C++ compiler `torch.compile` needs on CPU,
  cached per torch and Python version): every CPU storage, from any operator,
  thread or C++ extension, is noted when allocated, with the Python stack of
  the thread that started recording, and when freed. It costs the test model
  about 1.3x (`bench/cpu_recorder.py`).
- `DispatchRecorder`, where no compiler is at hand, sees every tensor an ATen
  operator returns (a `TorchDispatchMode`), which puts every operator through
  Python: 2.2-2.6x before recording anything, about 4.5x in all.

Each storage is modelled the way the CPU allocator hands it out: its own
segment holding one block. Trace events are PyTorch's (`segment_alloc`,
`alloc`, `free_requested`, `free_completed`, `segment_free`, and a
`snapshot` marker at each dump), so every reader of `_dump_snapshot` files,
snapdiff's and `torch.cuda._memory_viz`'s, reads what this writes.

Neither sees storages made outside PyTorch's CPU allocator
(`torch.from_numpy`, tensors rebuilt from shared memory sent by DataLoader
workers) or made before recording started. Nothing either does raises into
the program: a failure of its own is reported once and recording stops.
"""

import collections
import contextlib
import ctypes
import fcntl
import hashlib
import os
import pickle
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
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


class DispatchRecorder(TorchDispatchMode):
    """The recorder through a dispatch mode. `start()` turns it on for the
    calling thread, `snapshot()` returns the snapshot dict `_dump_snapshot`
    would pickle.

    A storage's end is noted before the next operator runs: every tensor an
    operator returns is watched through a weak reference, and when one goes,
    its storage is checked once the tensor has let it go. A storage that
    moves (`resize_`, `set_`) is noted as freed at its old place and
    allocated at its new one. A sweep of all live storages, every few
    operators and before each dump, catches a storage released some other
    way. It sees only operators run on the thread that started recording,
    and skips (and counts) tensors without a plain storage (sparse, CSR,
    MKLDNN)."""

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
        self._warn = warn or _warn
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

    def mark_step(self, step):
        """Marks in the trace that the job's optimizer is about to take a
        step, after `step` steps: reports cut the trace there."""
        with self._lock:
            self._trace.append(("step", 0, step, _now_us(), _NO_FRAMES))

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
        return _frame_of(self._frames, code, line)

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
                storage.segment = _segment(storage.address, storage.size, storage.frames)
            segments.append(storage.segment)
        return {
            "segments": segments,
            "device_traces": [list(self._events)],
            "snapdiff_recorder": "cpu",
            "snapdiff_skipped_tensors": self.tensors_skipped,
        }


def CpuRecorder(max_entries=100000, warn=None, stacks=True):
    """The CPU recorder to use: an `AllocatorRecorder` where its library
    builds and loads, else a `DispatchRecorder` (saying why, once)."""
    warn = warn or _warn
    try:
        library = _allocator_library()
    except Exception as e:
        warn(
            f"cannot build the CPU allocator hook ({e}); recording CPU tensors "
            "through a dispatch mode instead, which slows the job 3-5x"
        )
        return DispatchRecorder(max_entries, warn=warn, stacks=stacks)
    return AllocatorRecorder(library, max_entries, warn=warn, stacks=stacks)


class AllocatorRecorder:
    """The recorder inside PyTorch's CPU allocator (`snapdiff_cpu_alloc.cpp`,
    which holds what it records). `start()` wraps the allocator (one
    recording a process: a later start forgets an earlier one), `stop()`
    unwraps it; `write(f)` writes the pickle `_dump_snapshot` would write,
    `snapshot()` returns the dict it holds."""

    def __init__(self, library, max_entries=100000, warn=None, stacks=True):
        self._library = library
        self._entries = max(int(max_entries), 1)
        self._stacks_on = bool(stacks)
        self._warn = warn or _warn
        self._lock = threading.Lock()  # two threads dumping at once
        self._failed = False
        self._stacks_lost_said = False
        # Why recording stopped, once it did (said in each dump's manifest line).
        self.stopped = None
        # Every storage has a plain one: nothing is skipped.
        self.tensors_skipped = 0
        self._forget()

    def _forget(self):
        """The library's stacks, none known yet."""
        self._stack_frames = [_NO_FRAMES]  # stack index -> its frame dicts
        self._frames = {}  # (code, line) -> frame dict, shared by stacks
        self._written = []  # stack index -> its frames as `write` writes them
        self._written_for = None  # the `frames_of` key they were made for

    @property
    def storages_seen(self):
        return self._library.snapdiff_cpu_allocations()

    def start(self):
        """Starts recording allocations afresh; stacks are the calling thread's."""
        with self._lock:
            if self._library.snapdiff_cpu_start(self._entries, int(self._stacks_on)) != 0:
                self._fail("another CPU allocator of higher priority is in place")

    def stop(self):
        self._library.snapdiff_cpu_stop()

    def follow_main_thread(self):
        """Stacks are the main thread's from the next time it runs Python
        code, not the thread's that started recording."""
        self._library.snapdiff_cpu_follow_main_thread()

    def mark_step(self, step):
        """Marks in the trace that the job's optimizer is about to take a
        step, after `step` steps: reports cut the trace there."""
        self._library.snapdiff_cpu_mark_step(step)

    def pause(self):
        """Records nothing more in this process (a forked child)."""
        self._library.snapdiff_cpu_pause()

    def _fail(self, why):
        if not self._failed:
            self._failed = True
            self.stopped = why
            self._library.snapdiff_cpu_pause()
            self._warn(f"the CPU recorder stopped ({why}); the program goes on unrecorded")

    def _learn_stacks(self):
        """Adds the library's stacks not known yet to `_stack_frames`."""
        frame = self._frame
        self._stack_frames.extend(
            [frame(code, line) for code, line in places]
            for places in self._library.snapdiff_cpu_stacks(len(self._stack_frames))
        )

    def snapshot(self):
        """The live storages and the trace, as `torch.cuda.memory._snapshot()`
        lays them out: what `write` writes, read back. Any thread."""
        with tempfile.TemporaryFile() as f:
            self.write(f)
            f.seek(0)
            return pickle.load(f)

    def write(self, f, frames_of=None, key=None, blocks=False):
        """Writes what `pickle.dump(self.snapshot(), f, protocol=4)` would
        to the binary file `f`, each stack's frames first given to
        `frames_of` (what it made of them for one `key` is kept for the
        next write with the same). Returns the live blocks [(address,
        size)] when `blocks`, else None. Any thread."""
        with self._lock:
            if self._library.snapdiff_cpu_replaced():
                self._fail(
                    "the job made another CPU allocator PyTorch's own (c10::SetCPUAllocator), "
                    "which passes nothing on"
                )
            if key is None or key != self._written_for:
                self._written, self._written_for = [], key
            f.flush()
            while True:
                self._learn_stacks()
                self._written.extend(
                    frames_of(frames) if frames_of else frames
                    for frames in self._stack_frames[len(self._written):]
                )
                done = self._library.snapdiff_cpu_write(f.fileno(), self._written, int(blocks))
                if done != -1:  # else stacks came meanwhile: learn them, again
                    break
            if not self._stacks_lost_said and self._library.snapdiff_cpu_stacks_lost():
                self._stacks_lost_said = True
                self._warn(
                    "another profiler (sys.setprofile, cProfile) holds the recording thread's "
                    "profile hook, and is left to it: CPU storages are recorded without stacks"
                )
            return done

    def _frame(self, code, line):
        return _frame_of(self._frames, code, line)


_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "snapdiff_cpu_alloc.cpp")


def _allocator_library():
    """`snapdiff_cpu_alloc.cpp` built for this torch and Python, loaded.

    Built once a host into a cache folder only this user can write
    (`_cache_folder`), under a lock so that ranks starting together compile
    it once, written apart and renamed into place so that no reader sees
    half a file. Loaded through a descriptor opened once and checked
    (`_load`), so that a file swapped in after the check is never what
    runs; a cached file that does not load (empty, cut short, not this
    user's) is built again."""
    folder, temporary = _cache_folder()
    try:
        name = f"cpu_alloc-{_build_key()}.so"
        try:
            return _load(folder, name)
        except OSError:
            pass
        with _locked(folder):
            try:  # built by another process while this one waited
                return _load(folder, name)
            except OSError:
                _build(folder, name)
            return _load(folder, name)
    finally:
        if temporary:  # loaded libraries stay mapped once their file is gone
            shutil.rmtree(folder, ignore_errors=True)


def _build_key():
    """What the library is built from: its source, torch and Python."""
    with open(_SOURCE, "rb") as f:
        source = f.read()
    torch_dir = os.path.dirname(torch.__file__)
    return hashlib.sha256(
        b"\0".join([source, torch.__version__.encode(), torch_dir.encode(), sys.version.encode()])
    ).hexdigest()[:16]


def _private(info):
    """Whether `info` (an `os.stat_result`) is this user's and nobody
    else can write it."""
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def _load(folder, name):
    """The library `name` in `folder`, loaded from a descriptor whose file
    was checked: a regular file of this user's, in a folder of this user's,
    neither writable by anyone else, not reached through a link. Raises
    `OSError` when it is not so or the file does not load."""
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not _private(os.fstat(folder_fd)):
            raise OSError(f"{folder} is not this user's alone")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _private(info) or info.st_size == 0:
            raise OSError(f"{name} is not a library of this user's alone")
        # The descriptor's own file, whatever its path now names.
        library = ctypes.PyDLL(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    library.snapdiff_cpu_start.argtypes = [ctypes.c_size_t, ctypes.c_int]
    library.snapdiff_cpu_start.restype = ctypes.c_int
    library.snapdiff_cpu_stop.restype = None
    library.snapdiff_cpu_pause.restype = None
    library.snapdiff_cpu_allocations.restype = ctypes.c_uint64
    library.snapdiff_cpu_stacks.argtypes = [ctypes.c_size_t]
    library.snapdiff_cpu_stacks.restype = ctypes.py_object
    library.snapdiff_cpu_write.argtypes = [ctypes.c_int, ctypes.py_object, ctypes.c_int]
    library.snapdiff_cpu_write.restype = ctypes.py_object
    library.snapdiff_cpu_stacks_lost.restype = ctypes.c_int
    library.snapdiff_cpu_follow_main_thread.restype = None
    library.snapdiff_cpu_replaced.restype = ctypes.c_int
    library.snapdiff_cpu_mark_step.argtypes = [ctypes.c_uint64]
    library.snapdiff_cpu_mark_step.restype = None
    return library


@contextlib.contextmanager
def _locked(folder):
    """Holds the cache folder's lock (one build at a time on this host)."""
    fd = os.open(
        os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _build(folder, name):
    """Compiles the library into `folder/name`, replacing what is there."""
    fd, building = tempfile.mkstemp(prefix=".cpu_alloc-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        _compile(building, os.path.dirname(torch.__file__))
        # The linker writes under the umask, which may let the group write.
        os.chmod(building, 0o700)
        os.replace(building, os.path.join(folder, name))
    finally:
        if os.path.exists(building):
            os.unlink(building)


def _cache_folder():
    """The folder the library is cached in, and whether it is a temporary
    one to remove once loaded: `$XDG_CACHE_HOME/snapdiff`
    (`~/.cache/snapdiff`) when it is this user's alone, else
    `snapdiff-cache-UID` in the temporary folder when it is, else a new
    private folder. A library loaded from a folder others can write to
    would run their code."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for folder in (
        os.path.join(base, "snapdiff"),
        os.path.join(tempfile.gettempdir(), f"snapdiff-cache-{os.getuid()}"),
    ):
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            info = os.lstat(folder)
            if stat.S_ISDIR(info.st_mode) and _private(info) and os.access(folder, os.W_OK):
                return folder, False
        except OSError:
            pass
    return tempfile.mkdtemp(prefix="snapdiff-cache-"), True


def _compile(output, torch_dir):
    """Compiles the library into `output`; raises with the compiler's first
    error line."""
    compiler = os.environ.get("CXX") or "g++"
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    command = [
        compiler, "-O2", "-shared", "-fPIC", "-std=c++17",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-I", os.path.join(torch_dir, "include"),
        "-I", sysconfig.get_paths()["include"],
        _SOURCE, "-o", output,
        "-L", os.path.join(torch_dir, "lib"), "-lc10",
        f"-Wl,-rpath,{os.path.join(torch_dir, 'lib')}",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{compiler}: {e}") from None
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        raise RuntimeError(f"{compiler} failed: {(errors or done.stderr.splitlines() or ['?'])[0]}")


def _warn(message):
    print(f"snapdiff: {message}", file=sys.stderr)


def _frame_of(frames, code, line):
    """The frame dict of `code` at `line`: one a place, kept in `frames`
    (by (code, line)), so that stacks through it share it."""
    frame = frames.get((code, line))
    if frame is None:
        frame = frames[(code, line)] = {
            "filename": code.co_filename, "line": line, "name": code.co_name,
        }
    return frame


def _trace_event(action, address, size, time_us, frames):
    """One trace event as PyTorch's snapshots lay it out."""
    return {"action": action, "addr": address, "size": size, "stream": 0,
            "time_us": time_us, "frames": frames}


def _segment(address, size, frames):
    """A storage's segment, holding its one block."""
    return {
        "device": 0,
        "address": address,
        "total_size": size,
        "allocated_size": size,
        "active_size": size,
        "requested_size": size,
        "stream": 0,
        "segment_type": "small" if size <= _SMALL_SIZE else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": frames,
        "blocks": [
            {
                "address": address,
                "size": size,
                "requested_size": size,
                "state": "active_allocated",
                "frames": frames,
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
