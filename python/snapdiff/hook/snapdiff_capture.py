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
- signals come first: SIGTERM takes at most one exit dump, waiting at most
  EXIT_DUMP_SECONDS for it, then ends the job by SIGTERM's default action
  (so its status is the one it would have had); queued dumps are dropped;
- requests coalesce (at most one pending per reason); an interval tick
  while a dump runs is skipped and counted, and when dumps take more than
  a tenth of the job's time the interval widens (said in the manifest);
- SIGUSR1 only queues a request, which the dump thread serves;
- nothing of the job is kept: the optimizer whose steps are counted is
  held by a weak reference;
- files are created new (`O_EXCL`, `O_NOFOLLOW`), never through a link
  another user planted in a shared folder;
- CUDA recording starts when the process initialises CUDA itself, never
  before, so processes that do not use CUDA are left alone;
- DataLoader workers record and dump nothing: children, forked or started
  by multiprocessing's `spawn`, start recording only when they step an
  optimizer (as a rank of `torch.multiprocessing.spawn` or `start_processes`
  does, whatever its start method, and a worker never does).
"""

import atexit
import errno
import itertools
import json
import os
import pickle
import secrets
import signal
import socket
import sys
import threading
import time
import weakref

MANIFEST = "manifest.jsonl"
# How often each process looks for a dump asked of `snapdiff capture` (a
# stat of one file: a few microseconds).
REQUEST_POLL_SECONDS = 0.2
# How long a terminating signal waits for the exit dump (behind a dump
# already running) before the job ends without it.
EXIT_DUMP_SECONDS = 2.0
# Terminating signals this soon after the first are the same request: a
# killed `snapdiff capture` sends its SIGTERM once per thread of its own
# (the kernel's parent-death signal, each time the job is handed to another
# of them), and a scheduler may signal the job and capture, which passes it on.
REPEAT_SECONDS = 1.0
# What a job that ends without its exit dump is told.
NO_EXIT_DUMP = (
    f"the exit snapshot could not be written within {EXIT_DUMP_SECONDS:g} s "
    "(a dump was being written); the job ends without it"
)
# The share of the job's time dumps may take before the interval widens.
MAX_DUMP_SHARE = 0.10
# The machine, in each manifest line: with the process id, what tells two
# runs of one rank apart.
try:
    HOST = socket.gethostname()
except OSError:
    HOST = None
# Bytes a page, for the resident size in /proc/self/statm.
try:
    PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    PAGE_SIZE = 4096
# Flags of every file the hook creates: new, never through a link.
CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


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
        # A function giving {file: name} for frames' files to be named
        # otherwise in each dump: set by the notebook magic, for cells.
        self.file_names = None
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


class Requests:
    """Dumps asked for and not yet taken: at most one pending per reason
    (a second request while one waits is the same request), served in the
    order they came. Closed, it drops what is pending and takes no more.
    Signal handlers put requests too, so the lock is re-entrant."""

    def __init__(self):
        self._changed = threading.Condition(threading.RLock())
        self._pending = []
        self._closed = False

    def put(self, reason):
        """Asks for a dump; False when one for `reason` already waits."""
        with self._changed:
            if self._closed or reason in self._pending:
                return False
            self._pending.append(reason)
            self._changed.notify()
            return True

    def take(self):
        """The next request, waiting for one; None once closed."""
        with self._changed:
            while not self._pending and not self._closed:
                self._changed.wait()
            return None if self._closed else self._pending.pop(0)

    def close(self):
        with self._changed:
            self._closed = True
            self._pending.clear()
            self._changed.notify_all()


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
        # A weak reference to the optimizer whose steps are counted: the
        # job's model and optimizer state are freed when it drops them.
        self.pacer = None
        self.requests = Requests()
        # Reentrant: a terminating signal handled on the thread that holds it,
        # outside the dump itself (see `on_terminate`), writes the exit dump.
        self.dump_lock = threading.RLock()
        self.dumping = False  # whether a dump is being written now
        self.dumping_thread = None  # the thread writing it
        # The signal that ends the job once the dump it interrupted is done.
        self.ending_by = None
        self.stopping = threading.Event()
        self.terminating_since = None  # when a terminating signal came
        self.stopped = False  # a recording from Python was stopped for good
        self.started = time.monotonic()
        self.dump_seconds = 0.0  # time all dumps took so far
        self.last_seconds = 0.0  # time the last dump took
        self.exit_deadline = None  # when the exit dump must be done by
        self.interval = settings.interval  # widened when dumps take too long
        self.skipped = 0  # interval ticks that came while a dump ran
        self.failures = 0
        self.last_failure = None
        self.manifest_refused = False  # said once: the manifest cannot be written
        self.dumps = 0  # dumps written
        self.written = []  # their names, in order
        self.previous_handlers = {}
        self.threads = []  # the threads started, for `uninstall`

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
        """SIGUSR1 asks for a dump (after the job's own handler, if any);
        SIGTERM, where the job keeps its default action, is served by
        `on_terminate`. Undone by `uninstall`."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("torch was first imported off the main thread")
        usr1 = signal.getsignal(signal.SIGUSR1)

        def on_usr1(signum, frame):
            self.requests.put("signal")
            if callable(usr1):
                usr1(signum, frame)

        signal.signal(signal.SIGUSR1, on_usr1)
        self.previous_handlers[signal.SIGUSR1] = (usr1, on_usr1)
        # Only where the job keeps the default (which ends it without
        # running anything): a handler of the job's own is left alone.
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self.on_terminate)
            self.previous_handlers[signal.SIGTERM] = (signal.SIG_DFL, self.on_terminate)

    def install_dump_thread(self):
        self.start_thread(self.serve, "snapdiff-dumps")
        if self.settings.requests:
            self.start_thread(self.guarded(self.watch_requests), "snapdiff-requests")

    def start_thread(self, target, name):
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

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

            self.cpu = snapdiff_cpu_recorder.CpuRecorder(
                self.settings.entries, stacks=self.settings.stacks
            )
            self.cpu.start()
            self.recording = True
            warn("torch sees no CUDA device; recording CPU tensors with snapdiff's CPU recorder")

    def start_cuda(self):
        if self.waiting_for_step or self.stopped:
            return  # a forked child that has not stepped (maybe a worker), or stopped
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
        """Counts the steps of one optimizer, the pacer: the first to step,
        and after it is freed, the next one that steps."""
        pacer = self.pacer() if self.pacer is not None else None
        if pacer is None:
            self.pacer, pacer = weak(opt), opt
        if opt is not pacer:
            return
        self.steps += 1
        every = self.settings.every
        if every > 0 and self.steps % every == 0:
            self.dump("step")

    def install_interval(self):
        if not self.interval:
            return

        def tick():
            while not self.stopping.wait(self.interval):
                # A tick while a dump runs (or one waits) is not queued.
                if self.dumping or not self.requests.put("interval"):
                    self.skipped += 1

        self.start_thread(tick, "snapdiff-interval")

    def install_exit(self):
        atexit.register(self.guarded(self.at_exit))

    def install_fork(self):
        os.register_at_fork(after_in_child=self.guarded(self.forked))

    def uninstall(self):
        """Undoes what `install_signals` and the threads did: the handlers
        the job had come back (where ours are still in place), pending
        requests are dropped and the threads end (a dump being written is
        waited for, EXIT_DUMP_SECONDS at most)."""
        self.stopping.set()
        self.requests.close()
        current = threading.current_thread()
        if current is threading.main_thread():
            for signum, (previous, ours) in self.previous_handlers.items():
                if signal.getsignal(signum) == ours:
                    signal.signal(signum, previous)
        self.previous_handlers = {}
        for thread in self.threads:
            if thread is not current:
                thread.join(timeout=EXIT_DUMP_SECONDS)
        self.threads = []

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
        if self.cpu is not None:
            self.cpu.pause()
        self.uninstall()
        self.pid = os.getpid()
        self.steps = 0
        self.rank = None
        self.pacer = None
        self.requests = Requests()
        self.dump_lock = threading.RLock()
        self.dumping = False
        self.dumping_thread = None
        self.ending_by = None
        self.stopping = threading.Event()
        self.terminating_since = None
        self.started = time.monotonic()
        self.dump_seconds = 0.0
        self.last_seconds = 0.0
        self.exit_deadline = None
        self.skipped = 0
        self.threads = []
        self.waiting_for_step = True
        self.forked_child = True

    def serve(self):
        """The dump thread: serves requests from signals and the timer."""
        while True:
            reason = self.requests.take()
            if reason is None:
                return
            self.dump(reason)

    def on_terminate(self, signum, frame):
        """SIGTERM where the job has no handler of its own: the exit dump
        before any queued one, within EXIT_DUMP_SECONDS of the signal, then
        the default action, so the job ends as it would have (by the
        signal). Repeats within REPEAT_SECONDS are the same request; a
        SIGTERM after that ends the job at once."""
        if os.getpid() != self.pid:
            end_by(signum)
        now = time.monotonic()
        if self.terminating_since is not None:
            if now - self.terminating_since < REPEAT_SECONDS:
                return
            end_by(signum)
        self.terminating_since = now
        deadline = now + EXIT_DUMP_SECONDS
        if self.dumping_thread == threading.get_ident():
            self.end_after_this_dump(signum, deadline)
            return
        try:
            self.last_dump(deadline=deadline)
            self.report_failures()
        except BaseException:
            pass
        end_by(signum)

    def end_after_this_dump(self, signum, deadline):
        """The signal came in the middle of a dump this same (main) thread
        is writing, which holds the lock an exit dump needs: the job ends
        when that dump is done (see `dump_locked`), with the exit dump if
        there is time, or at `deadline` without it."""
        self.ending_by = signum
        self.exit_deadline = deadline

        def at_deadline():
            time.sleep(max(0.0, deadline - time.monotonic()))
            warn(NO_EXIT_DUMP)
            end_by(signum)

        threading.Thread(target=at_deadline, name="snapdiff-deadline", daemon=True).start()

    def at_exit(self):
        if os.getpid() != self.pid:
            return
        self.last_dump()
        self.report_failures()

    def last_dump(self, deadline=None):
        """The exit dump, before anything queued (which is dropped), waiting
        at most EXIT_DUMP_SECONDS for a dump already being written. With a
        `deadline` (a terminating signal), the dump is given up when, as
        long as the last one took, it would end past it, and the owners
        search gets only the time left."""
        self.stopping.set()
        self.requests.close()
        if not self.recording:
            return
        acquired = self.dump_lock.acquire(timeout=EXIT_DUMP_SECONDS)
        if acquired and deadline is not None and time.monotonic() + self.last_seconds > deadline:
            self.dump_lock.release()
            acquired = False
        if not acquired:
            warn(NO_EXIT_DUMP)
            return
        try:
            self.exit_deadline = deadline
            self.dump_locked("exit")
        finally:
            self.dump_lock.release()

    # -- dumping -------------------------------------------------------------

    def dump(self, reason):
        """Writes one snapshot; a failure is counted and reported, never raised."""
        if self.dumping_thread == threading.get_ident():
            return  # out of memory inside a dump of this thread's
        with self.dump_lock:
            if self.stopping.is_set() and reason not in ("exit", "oom"):
                return  # the process is ending: only its exit dump is taken
            self.dump_locked(reason)

    def dump_locked(self, reason):
        """`dump`, holding the dump lock."""
        if not self.recording or os.getpid() != self.pid:
            return
        if self.cpu is not None and self.cpu.storages_seen == 0:
            return  # a launcher of ranks, say: it made no tensor
        if reason == "signal" and self.settings.requests:
            append_byte(self.settings.requests + ".served")
        self.dumping = True
        self.dumping_thread = threading.get_ident()
        try:
            self.write_dump(reason)
        finally:
            self.dumping = False
            self.dumping_thread = None
        if self.ending_by is not None:
            self.end_now(reason)

    def end_now(self, interrupted):
        """After the dump a terminating signal interrupted (see
        `end_after_this_dump`), for `interrupted` (a reason): the exit dump,
        unless that was it, when it can be done by the deadline as long as
        the last dump took; then the signal's end."""
        self.stopping.set()
        self.requests.close()
        if interrupted == "exit":
            pass
        elif time.monotonic() + self.last_seconds <= self.exit_deadline:
            self.write_dump("exit")
        else:
            warn(NO_EXIT_DUMP)
        self.report_failures()
        end_by(self.ending_by)

    def write_dump(self, reason):
        started = time.perf_counter()
        who, rank = self.who()
        stem = f"{who}-step{self.steps}" + ("" if reason == "step" else f"-{reason}")
        folder = self.settings.dir
        # Unique, so that nobody can plant it; the pid last, for capture's
        # cleanup of a killed process's half-written dump.
        temporary = os.path.join(folder, f".{stem}.{secrets.token_hex(4)}.{self.pid}.tmp")
        measured = self.measure()
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
        entry = {"file": name, **measured}
        if getattr(self.settings, "owners", False):
            searched = time.perf_counter()
            entry["owners"] = self.write_owners(snapshot, name)
            entry["owners_seconds"] = round(time.perf_counter() - searched, 4)
        # How long this dump held the process, owners included.
        seconds = time.perf_counter() - started
        entry["seconds"] = round(seconds, 4)
        widened = self.pace(seconds, reason)
        if widened:
            entry["interval"] = round(widened, 3)
        if self.skipped:
            entry["skipped"] = self.skipped
        self.note(entry, rank, reason)

    def measure(self):
        """What the process holds beside what the dump records: its
        resident bytes and, on CUDA, the bytes in use on its device (by
        every user of it), so that reports can tell growth outside the
        allocator. A figure that cannot be read is left out."""
        measured = {}
        try:
            with open("/proc/self/statm", "rb") as f:
                measured["rss_bytes"] = int(f.read().split()[1]) * PAGE_SIZE
        except (OSError, ValueError, IndexError):
            pass
        if self.cpu is None:
            try:
                free, total = self.torch.cuda.mem_get_info()
                measured["device_used_bytes"] = int(total - free)
            except Exception:
                pass
        return measured

    def pace(self, seconds, reason):
        """Counts a dump's time; after an interval dump, when dumps took
        more than MAX_DUMP_SHARE of the job's time so far, widens the
        interval to keep this dump under that share, says so once and
        returns the new interval (else None)."""
        self.dump_seconds += seconds
        self.last_seconds = seconds
        if reason != "interval" or not self.interval:
            return None
        elapsed = time.monotonic() - self.started
        wanted = seconds / MAX_DUMP_SHARE
        if self.dump_seconds <= MAX_DUMP_SHARE * elapsed or wanted <= self.interval:
            return None
        first = self.interval == self.settings.interval
        self.interval = wanted
        if first:
            warn(
                f"dumps took {self.dump_seconds / elapsed:.0%} of the job's time; interval "
                f"dumps now every {wanted:.1f} s instead of {self.settings.interval:g} s"
            )
        return wanted

    def write_owners(self, snapshot, name):
        """Writes the owners of the dump's live blocks beside it
        (`NAME.owners.json`) and returns that file's name; None when it
        could not be written (said once, as failed dumps are)."""
        temporary = None
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
            seconds = None
            if self.exit_deadline is not None:
                seconds = self.exit_deadline - time.monotonic()
                if seconds <= 0:
                    raise TimeoutError("no time left before the job ends")
                seconds = min(seconds, snapdiff_owners.budget())
            owners = snapdiff_owners.find(self.torch, blocks, seconds=seconds)
            owners_name = name.rsplit(".", 1)[0] + ".owners.json"
            folder = self.settings.dir
            temporary = os.path.join(folder, f".{owners_name}.{secrets.token_hex(4)}.tmp")
            with create_new(temporary, "w") as f:
                json.dump(owners, f)
            publish(temporary, os.path.join(folder, owners_name))
            return owners_name
        except Exception as e:
            if temporary is not None:
                remove(temporary)
            self.failed(f"owners of {name}", e)
            return None

    def write(self, path):
        """Writes the dump to `path`, a new file; returns the snapshot."""
        if self.cpu is not None:
            snapshot = self.cpu.snapshot()
        else:
            # What `torch.cuda.memory._dump_snapshot` pickles, into a file
            # opened here (it would follow a link at `path`).
            snapshot = self.torch.cuda.memory._snapshot()
        root = self.settings.stack_root
        if root is not None:
            cut_stacks(snapshot, *root)
        names = self.settings.file_names
        if names is not None:
            rename_files(snapshot, names())
        with create_new(path, "wb") as f:
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
        several processes never interleave; never through a link)."""
        device = "cpu"
        if self.cpu is None:
            try:
                device = f"cuda:{self.torch.cuda.current_device()}"
            except Exception:
                device = "cuda"
        entry.update(
            rank=rank, pid=self.pid, host=HOST, device=device, step=self.steps,
            time=round(time.time(), 6), reason=reason,
        )
        line = (json.dumps(entry) + "\n").encode()
        try:
            append(os.path.join(self.settings.dir, MANIFEST), line)
        except OSError as e:
            if not self.manifest_refused:
                self.manifest_refused = True
                warn(f"cannot write {MANIFEST} ({describe(e)}); dumps go on without it")

    def failed(self, name, error):
        """Reports the first failure in full; later ones are counted."""
        self.failures += 1
        self.last_failure = f"{name}: {describe(error)}"
        if self.failures == 1:
            warn(f"cannot write {name} ({describe(error)}); training goes on")

    def report_failures(self):
        if self.failures > 1:
            warn(f"{self.failures} snapshot writes failed; the last: {self.last_failure}")


def weak(obj):
    """A weak reference to `obj`; for one that takes none (a class with
    `__slots__` and no `__weakref__`), a strong one, called the same way."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def end_by(signum):
    """Ends this process by `signum`'s default action (as if no handler had
    been installed); `os._exit` with the shell's status if it lives on."""
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, signal.SIG_DFL)
        else:  # Python sets handlers only from the main thread; libc does it from any
            import ctypes

            set_handler = ctypes.CDLL(None).signal
            set_handler.argtypes = (ctypes.c_int, ctypes.c_void_p)
            set_handler(signum, None)  # SIG_DFL
        os.kill(os.getpid(), signum)
    finally:
        os._exit(128 + signum)


def create_new(path, mode):
    """Opens `path` for writing as a new file: never one that exists, never
    through a symbolic link."""
    return os.fdopen(os.open(path, CREATE_NEW, 0o644), mode)


def publish(temporary, final):
    """Gives the written `temporary` the name `final`, which must not exist
    (a link planted there is refused, not replaced)."""
    try:
        os.link(temporary, final)
    except FileExistsError:
        raise
    except OSError:
        # A file system without hard links: rename, after checking.
        if os.path.lexists(final):
            raise FileExistsError(errno.EEXIST, "exists", final) from None
        os.rename(temporary, final)
        return
    os.unlink(temporary)


def append(path, data):
    """Appends `data` to the file at `path` in one write, creating it if
    needed; a symbolic link there is refused (OSError)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def describe(error):
    """An error as one line; a refused link says what it is."""
    if isinstance(error, OSError) and error.errno == errno.ELOOP:
        return f"{error.filename}: a symbolic link is there; not followed"
    if isinstance(error, FileExistsError):
        return f"{error.filename}: a file is already there; not replaced"
    return str(error)


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
            if os.path.lexists(final):
                continue
            os.rename(temporary, final)
            return name
        os.unlink(temporary)
        return name


def each_record(snapshot):
    """Every record of `snapshot` that has frames: segments, blocks, their
    history, trace events."""
    for segment in snapshot.get("segments", []):
        yield segment
        for block in segment.get("blocks", []):
            yield block
            yield from block.get("history", [])
    for trace in snapshot.get("device_traces", []):
        yield from trace


def rename_files(snapshot, names):
    """Gives the frames of `snapshot` whose file is a key of `names` that
    name instead (a notebook's cells: see `snapdiff._notebook`). Frame lists
    shared between records stay shared; the frames are new dicts."""
    if not names:
        return
    renamed = {}  # id of a frame list -> (it, its renamed copy)

    def rename(frames):
        done = renamed.get(id(frames))
        if done is None:
            new = frames
            if any(f.get("filename") in names for f in frames):
                new = [dict(f, filename=names[f["filename"]]) if f.get("filename") in names
                       else f for f in frames]
            done = renamed[id(frames)] = (frames, new)
        return done[1]

    for record in each_record(snapshot):
        frames = record.get("frames")
        if isinstance(frames, list):
            record["frames"] = rename(frames)


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

    for record in each_record(snapshot):
        frames = record.get("frames")
        if isinstance(frames, list):
            record["frames"] = cut_one(frames)


def file_size(path):
    """The size of the file at `path`, 0 when it cannot be read."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def append_byte(path):
    """Appends one byte to the file at `path`; a failure is ignored."""
    try:
        append(path, b".")
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
