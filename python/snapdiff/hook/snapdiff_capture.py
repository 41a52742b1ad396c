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
import collections
import os
import signal
import sys
import threading
import time
import weakref

try:  # in the snapdiff package (snapdiff.recording)
    from .snapdiff_dumping import Dumping
    from .snapdiff_files import file_size, warn
    from .snapdiff_signals import EXIT_DUMP_SECONDS, Requests, Signals
except ImportError:  # capture's start-up hook: top-level modules beside this one
    from snapdiff_dumping import Dumping
    from snapdiff_files import file_size, warn
    from snapdiff_signals import EXIT_DUMP_SECONDS, Requests, Signals

# How often each process looks for a dump asked of `snapdiff capture` (a
# stat of one file: a few microseconds).
REQUEST_POLL_SECONDS = 0.2


class Settings:
    """What `snapdiff capture` asked for, from the environment."""

    def __init__(self, environ):
        self.dir = environ["SNAPDIFF_DIR"]
        # The capture this process runs under: in every manifest line and
        # temporary file name, so that two jobs writing one folder under
        # one name are told apart, and capture removes only its own files.
        run = environ.get("SNAPDIFF_RUN") or ""
        self.run = run if run.isalnum() else None
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
        # (`capture` does so unless `--no-owners`; see snapdiff_owners).
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




class Capture(Signals, Dumping):
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
        # When the last optimizer steps were taken (microseconds since the
        # epoch, as the trace's times), to mark them in a CUDA dump's trace
        # (`mark_steps`); the CPU recorders mark them as they come.
        self.step_times = collections.deque(maxlen=max(settings.entries, 1))
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
        # Owners are searched at every `owners_every`th dump: doubled each
        # time a search runs out of its budget (see Dumping.wants_owners).
        self.owners_every = 1
        self.dumps_since_owners = 0
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
            raise RuntimeError(
                "torch was first imported off the main thread, where Python allows no "
                "signal handler; dumps asked by snapdiff capture still come"
            )
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
            off_main = threading.current_thread() is not threading.main_thread()
            if off_main and self.settings.stacks and hasattr(self.cpu, "follow_main_thread"):
                # The job trains on its main thread: its stacks are the ones to name.
                self.cpu.follow_main_thread()
                warn(
                    "torch was first imported off the main thread: CPU tensors' stacks are "
                    "the main thread's"
                )

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
        """The first step of a child process: it is a rank, not a worker.
        Each step of the pacer is marked in the trace, labelled with the
        steps taken before it (as the manifest counts them), so that
        reports cut the trace at the job's own steps."""
        if self.waiting_for_step:
            self.waiting_for_step = False
            self.start_recording()
        pacer = self.pacer() if self.pacer is not None else None
        if (pacer is None or opt is pacer) and self.recording and self.settings.entries > 0:
            if self.cpu is not None:
                self.cpu.mark_step(self.steps)
            else:
                self.step_times.append((self.steps, time.time_ns() // 1000))

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






def weak(obj):
    """A weak reference to `obj`; for one that takes none (a class with
    `__slots__` and no `__weakref__`), a strong one, called the same way."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj










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
