"""Snapshot capture for PyTorch jobs run under `snapdiff capture`.

Once torch is imported, this records memory history (PyTorch's own on CUDA,
snapdiff's CPU recorder when torch sees no CUDA device) and dumps snapshot
pickles into $SNAPDIFF_DIR: every N optimizer steps, every interval, when
`snapdiff capture` gets SIGUSR1 (or this process does), on CUDA
out-of-memory and at exit (also on SIGTERM). Each dump is
written under a temporary name and linked into place, never replacing a
file, and described by one JSON line in `manifest.jsonl`.

Rules it keeps so that it cannot hurt the job:
- every feature is installed on its own; one that cannot be prints one
  `snapdiff:` line and the others still work;
- nothing it does raises into the program or changes its exit code;
- signal handlers only queue a request; a dump thread serves it, so a
  signal that lands during a dump waits for it instead of deadlocking;
- CUDA recording starts when the process initialises CUDA itself, never
  before, so processes that do not use CUDA are left alone;
- DataLoader workers record and dump nothing: children, forked or started
  by multiprocessing's `spawn`, start recording only when they step an
  optimizer (as a rank of `torch.multiprocessing.spawn` or `start_processes`
  does, whatever its start method, and a worker never does).
"""

import atexit
import itertools
import json
import os
import pickle
import queue
import signal
import sys
import threading
import time

MANIFEST = "manifest.jsonl"
# How often each process looks for a dump asked of `snapdiff capture` (a
# stat of one file: a few microseconds).
REQUEST_POLL_SECONDS = 0.2


def warn(message):
    """One line on stderr, as every message of the hook is."""
    try:
        print(f"snapdiff: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


class Settings:
    """What `snapdiff capture` asked for, from the environment."""

    def __init__(self, environ):
        self.dir = environ["SNAPDIFF_DIR"]
        self.every = int(environ.get("SNAPDIFF_EVERY_STEPS") or 0)
        # The file through which `snapdiff capture` asks for dumps; see
        # Capture.watch_requests.
        self.requests = environ.get("SNAPDIFF_REQUESTS") or None
        # (file, function) whose callers are left out of every stack: set
        # by the pytest plugin to the test function.
        self.stack_root = None
        self.entries = int(environ.get("SNAPDIFF_TRACE_ENTRIES") or 100000)
        self.stacks = environ.get("SNAPDIFF_STACKS", "1") != "0"
        # Whether each dump is followed by the owners of its live blocks
        # (`capture --owners`; see snapdiff_owners).
        self.owners = environ.get("SNAPDIFF_OWNERS") == "1"
        self.interval = None
        text = environ.get("SNAPDIFF_INTERVAL") or ""
        if text:
            try:
                self.interval = float(text)
            except ValueError:
                self.interval = None
            if self.interval is None or not self.interval > 0:
                raise ValueError(
                    f"SNAPDIFF_INTERVAL={text!r} is not a positive number of seconds"
                )


def spawned_child():
    """Whether this process was started by multiprocessing's `spawn`: a
    DataLoader worker or a rank of `mp.spawn`."""
    argv = getattr(sys, "orig_argv", sys.argv)
    return "--multiprocessing-fork" in argv


class Capture:
    """The capture of one process."""

    def __init__(self, torch, settings, deferred):
        self.torch = torch
        self.settings = settings
        self.pid = os.getpid()
        self.recording = False  # dumps are taken only while recording
        # Whether recording waits for the first optimizer step (a child
        # process, which may be a DataLoader worker).
        self.waiting_for_step = deferred
        self.forked_child = False
        self.cpu = None  # the CPU recorder, when torch sees no CUDA device
        self.steps = 0
        self.rank = None  # this process's rank, once known
        self.pacer = None  # the optimizer whose steps are counted
        self.requests = queue.SimpleQueue()
        self.dump_lock = threading.Lock()
        self.stopping = threading.Event()
        self.failures = 0
        self.last_failure = None
        self.dumps = 0  # dumps written
        self.written = []  # their names, in order
        self.previous_handlers = {}

    # -- installing ----------------------------------------------------------

    def install(self):
        """Installs each feature on its own: one that fails is named, the
        rest still work."""
        features = [
            ("the SIGUSR1 and SIGTERM handlers", self.install_signals),
            ("the dump thread", self.install_dump_thread),
            ("recording", self.install_recording),
            ("the optimizer step hook", self.install_step_hook),
            ("the interval timer", self.install_interval),
            ("the exit dump", self.install_exit),
            ("fork handling", self.install_fork),
        ]
        for what, install in features:
            try:
                install()
            except Exception as e:
                warn(f"cannot install {what} ({type(e).__name__}: {e})")

    def install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("torch was first imported off the main thread")
        usr1 = signal.getsignal(signal.SIGUSR1)
        self.previous_handlers[signal.SIGUSR1] = usr1

        def on_usr1(signum, frame):
            self.requests.put("signal")
            if callable(usr1):
                usr1(signum, frame)

        signal.signal(signal.SIGUSR1, on_usr1)
        # SIGTERM: dump, then end as the job would have. Only where the job
        # keeps the default (which ends it without running anything).
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self.previous_handlers[signal.SIGTERM] = signal.SIG_DFL
            signal.signal(signal.SIGTERM, lambda signum, frame: self.requests.put("sigterm"))

    def install_dump_thread(self):
        threading.Thread(target=self.serve, name="snapdiff-dumps", daemon=True).start()
        if self.settings.requests:
            threading.Thread(
                target=self.guarded(self.watch_requests), name="snapdiff-requests", daemon=True
            ).start()

    def watch_requests(self):
        """Requests from `snapdiff capture`, which owns SIGUSR1: for each
        signal it gets, it appends a byte to the requests file, and every
        process of the job watches the file's size. No signal is sent to the
        job, so none can kill it: before torch is imported, in a program
        that never imports it, or once the interpreter has torn down its
        handlers at exit. A process that takes a request appends a byte to
        the `.served` file beside it, so capture can say when none could."""
        path = self.settings.requests
        stopping = self.stopping
        seen = file_size(path)
        while not stopping.wait(REQUEST_POLL_SECONDS):
            size = file_size(path)
            if size > seen:
                seen = size
                self.requests.put("signal")

    def install_recording(self):
        if self.waiting_for_step:
            return  # started by the first optimizer step; see before_step
        self.start_recording()

    def start_recording(self):
        if self.forked_child:
            self.forked_child = False
            self.install_dump_thread()
            # A forked child ends with os._exit, past atexit; multiprocessing
            # runs its finalizers just before.
            import multiprocessing.util

            multiprocessing.util.Finalize(None, self.guarded(self.at_exit), exitpriority=0)
        torch = self.torch
        if torch.cuda.is_available():
            # Runs now if this process already initialised CUDA, else when it does.
            torch.cuda._lazy_call(self.guarded(self.start_cuda))
        else:
            try:  # in the snapdiff package (snapdiff.recording)
                from . import snapdiff_cpu_recorder
            except ImportError:  # capture's start-up hook, a top-level module
                import snapdiff_cpu_recorder

            self.cpu = snapdiff_cpu_recorder.CpuRecorder(self.settings.entries)
            self.cpu.start()
            self.recording = True
            warn("torch sees no CUDA device; recording CPU tensors with snapdiff's CPU recorder")

    def start_cuda(self):
        if self.waiting_for_step:
            return  # a forked child that has not stepped: maybe a worker
        torch = self.torch
        entries = self.settings.entries
        torch.cuda.memory._record_memory_history(
            enabled="all" if entries > 0 else "state",
            context="all" if self.settings.stacks else None,
            stacks="python",
            max_entries=max(entries, 1),
        )
        self.recording = True
        try:
            torch._C._cuda_attach_out_of_memory_observer(
                lambda device, alloc, device_alloc, device_free: self.dump("oom")
            )
        except Exception as e:
            warn(f"cannot watch for CUDA out-of-memory ({type(e).__name__}: {e})")

    def install_step_hook(self):
        import torch.optim.optimizer as optimizer

        optimizer.register_optimizer_step_pre_hook(self.guarded(self.before_step))
        optimizer.register_optimizer_step_post_hook(self.guarded(self.after_step))

    def before_step(self, opt, args, kwargs):
        """The first step of a child process: it is a rank, not a worker."""
        if self.waiting_for_step:
            self.waiting_for_step = False
            self.start_recording()

    def after_step(self, opt, args, kwargs):
        if self.pacer is None:
            self.pacer = opt
        if opt is not self.pacer:
            return
        self.steps += 1
        every = self.settings.every
        if every > 0 and self.steps % every == 0:
            self.dump("step")

    def install_interval(self):
        interval = self.settings.interval
        if not interval:
            return

        def tick():
            while not self.stopping.wait(interval):
                self.requests.put("interval")

        threading.Thread(target=tick, name="snapdiff-interval", daemon=True).start()

    def install_exit(self):
        atexit.register(self.guarded(self.at_exit))

    def install_fork(self):
        os.register_at_fork(after_in_child=self.guarded(self.forked))

    # -- running -------------------------------------------------------------

    def guarded(self, fn):
        """`fn`, but an error is reported instead of raised into the job."""

        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                warn(f"{fn.__name__} failed ({type(e).__name__}: {e})")

        call.__name__ = fn.__name__
        return call

    def forked(self):
        """In a forked child: a DataLoader worker, or a rank started with the
        `fork` start method. It records and dumps nothing until it steps an
        optimizer, which a worker never does; then it is a process of its
        own, with its own steps and dump thread (threads do not survive a
        fork)."""
        self.recording = False
        self.stopping.set()
        if self.cpu is not None:
            self.cpu.pause()
        for signum, handler in self.previous_handlers.items():
            signal.signal(signum, handler)
        self.pid = os.getpid()
        self.steps = 0
        self.rank = None
        self.pacer = None
        self.requests = queue.SimpleQueue()
        self.dump_lock = threading.Lock()
        self.stopping = threading.Event()
        self.waiting_for_step = True
        self.forked_child = True

    def serve(self):
        """The dump thread: serves requests from signals and the timer."""
        while True:
            reason = self.requests.get()
            if reason is None:
                return
            if reason == "sigterm":
                self.dump("exit")
                self.report_failures()
                os._exit(128 + signal.SIGTERM)
            self.dump(reason)

    def at_exit(self):
        if os.getpid() != self.pid:
            return
        self.stopping.set()
        self.requests.put(None)
        self.dump("exit")
        self.report_failures()

    # -- dumping -------------------------------------------------------------

    def dump(self, reason):
        """Writes one snapshot; a failure is counted and reported, never raised."""
        if not self.recording or os.getpid() != self.pid:
            return
        if self.cpu is not None and self.cpu.storages_seen == 0:
            return  # a launcher of ranks, say: it made no tensor
        if reason == "signal" and self.settings.requests:
            append_byte(self.settings.requests + ".served")
        with self.dump_lock:
            started = time.perf_counter()
            who, rank = self.who()
            stem = f"{who}-step{self.steps}" + ("" if reason == "step" else f"-{reason}")
            folder = self.settings.dir
            temporary = os.path.join(folder, f".{stem}.{self.pid}.tmp")
            try:
                snapshot = self.write(temporary)
                name = place(temporary, folder, stem)
            except Exception as e:
                remove(temporary)
                self.failed(f"{stem}.pickle", e)
                self.note({"file": None, "error": str(e)}, rank, reason)
                return
            self.dumps += 1
            self.written.append(name)
            entry = {"file": name}
            if snapshot is not None and getattr(self.settings, "owners", False):
                entry["owners"] = self.write_owners(snapshot, name)
            # How long this dump held the process, owners included.
            entry["seconds"] = round(time.perf_counter() - started, 4)
            self.note(entry, rank, reason)

    def write_owners(self, snapshot, name):
        """Writes the owners of the dump's live blocks beside it
        (`NAME.owners.json`) and returns that file's name; None when it
        could not be written (said once, as failed dumps are)."""
        try:
            try:  # in the snapdiff package
                from . import snapdiff_owners
            except ImportError:  # capture's start-up hook
                import snapdiff_owners
            blocks = [
                (b["address"], b["size"])
                for segment in snapshot.get("segments", ())
                for b in segment.get("blocks", ())
                if b.get("state") == "active_allocated"
            ]
            owners = snapdiff_owners.find(self.torch, blocks)
            owners_name = name.rsplit(".", 1)[0] + ".owners.json"
            path = os.path.join(self.settings.dir, owners_name)
            temporary = os.path.join(self.settings.dir, f".{owners_name}.{self.pid}.tmp")
            with open(temporary, "w") as f:
                json.dump(owners, f)
            os.replace(temporary, path)
            return owners_name
        except Exception as e:
            self.failed(f"owners of {name}", e)
            return None

    def write(self, path):
        """Writes the dump to `path`; returns the snapshot written, or None
        when PyTorch wrote it itself (no owners wanted)."""
        root = self.settings.stack_root
        if self.cpu is None and root is None and not getattr(self.settings, "owners", False):
            self.torch.cuda.memory._dump_snapshot(path)
            return None
        if self.cpu is not None:
            snapshot = self.cpu.snapshot()
        else:
            snapshot = self.torch.cuda.memory._snapshot()
        if root is not None:
            cut_stacks(snapshot, *root)
        with open(path, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)
        return snapshot

    def who(self):
        """`rank{R}` under torchrun or a rank set in RANK, else `pid{PID}`.
        A rank once known is kept: after `destroy_process_group()` the exit
        dump is still the rank's."""
        rank = os.environ.get("RANK")
        if rank is None:
            try:
                dist = self.torch.distributed
                if dist.is_available() and dist.is_initialized():
                    rank = str(dist.get_rank())
            except Exception:
                rank = None
        if rank is not None and rank.isdigit():
            self.rank = int(rank)
        if self.rank is not None:
            return f"rank{self.rank}", self.rank
        return f"pid{self.pid}", None

    def note(self, entry, rank, reason):
        """Appends the dump's line to the manifest (one write, so lines of
        several processes never interleave)."""
        device = "cpu"
        if self.cpu is None:
            try:
                device = f"cuda:{self.torch.cuda.current_device()}"
            except Exception:
                device = "cuda"
        entry.update(
            rank=rank, pid=self.pid, device=device, step=self.steps,
            time=round(time.time(), 6), reason=reason,
        )
        line = (json.dumps(entry) + "\n").encode()
        try:
            fd = os.open(
                os.path.join(self.settings.dir, MANIFEST),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644,
            )
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as e:
            self.failed(MANIFEST, e)

    def failed(self, name, error):
        """Reports the first failure in full; later ones are counted."""
        self.failures += 1
        self.last_failure = f"{name}: {error}"
        if self.failures == 1:
            warn(f"cannot write {name} ({error}); training goes on")

    def report_failures(self):
        if self.failures > 1:
            warn(f"{self.failures} snapshot writes failed; the last: {self.last_failure}")


def place(temporary, folder, stem):
    """Gives the written file its name without replacing any file:
    `stem.pickle`, else `stem-2.pickle`, ... Returns the name."""
    for n in itertools.count(1):
        name = f"{stem}.pickle" if n == 1 else f"{stem}-{n}.pickle"
        final = os.path.join(folder, name)
        try:
            os.link(temporary, final)
        except FileExistsError:
            continue
        except OSError:
            # A file system without hard links: rename, after checking.
            if os.path.exists(final):
                continue
            os.rename(temporary, final)
            return name
        os.unlink(temporary)
        return name


def cut_stacks(snapshot, filename, name):
    """Leaves out of every stack in `snapshot` the frames that called
    function `name` of `filename` (a test's, whose callers are pytest's and
    pluggy's). A stack without that function is kept whole. Frame lists
    shared between records stay shared."""
    cut = {}  # id of a frame list -> (it, its cut), keeping it alive

    def cut_one(frames):
        done = cut.get(id(frames))
        if done is None:
            end = next(
                (i for i, f in enumerate(frames)
                 if f.get("name") == name and f.get("filename") == filename),
                None,
            )
            done = (frames, frames if end is None else frames[: end + 1])
            cut[id(frames)] = done
        return done[1]

    def cut_in(record):
        frames = record.get("frames")
        if isinstance(frames, list):
            record["frames"] = cut_one(frames)

    for segment in snapshot.get("segments", []):
        cut_in(segment)
        for block in segment.get("blocks", []):
            cut_in(block)
            for entry in block.get("history", []):
                cut_in(entry)
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            cut_in(event)


def file_size(path):
    """The size of the file at `path`, 0 when it cannot be read."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def append_byte(path):
    """Appends one byte to the file at `path`; a failure is ignored."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)
    except OSError:
        pass


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


# The captures started in this process, for the status line capture reads
# when nothing was dumped (see `status`).
CAPTURES = []


def status():
    """What this process's capture came to, for `snapdiff capture` to say
    why nothing was dumped: whether torch was imported, recording began,
    tensors were seen (the CPU recorder), and a child waited for a step."""
    return {
        "pid": os.getpid(),
        "torch": "torch" in sys.modules,
        "recording": any(c.recording for c in CAPTURES),
        "waiting": any(c.waiting_for_step and not c.recording for c in CAPTURES),
        "cuda": any(c.cpu is None for c in CAPTURES),
        "tensors": sum((c.cpu.storages_seen if c.cpu is not None else 0) for c in CAPTURES),
        "dumps": sum(c.dumps for c in CAPTURES),
    }


def start(torch):
    """Called once torch is imported."""
    try:
        settings = Settings(os.environ)
    except ValueError as e:
        warn(f"{e}; the script runs without capture")
        return
    capture = Capture(torch, settings, deferred=spawned_child())
    CAPTURES.append(capture)
    capture.install()
