"""Signals and requests of the capture hook: SIGTERM served first (at most
one exit dump, bounded in time, then the signal's own default action),
dump requests coalesced, and nothing raised into the job."""

import os
import signal
import threading
import time

try:  # in the snapdiff package (snapdiff.recording)
    from .snapdiff_files import warn
except ImportError:  # capture's start-up hook: top-level modules
    from snapdiff_files import warn



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


class Signals:
    """The capture's running part: the dump thread and the signals that end
    the job (a mixin of `snapdiff_capture.Capture`)."""

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
