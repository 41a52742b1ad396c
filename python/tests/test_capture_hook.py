"""The capture hook's handling of requests, on real torch (CPU tensors):
dumps slower than the interval never pile up."""

import collections
import json
import os
import pickle
import subprocess
import threading
import time

import pytest
import torch

from snapdiff._cli import binary, one_trend
from snapdiff.hook import snapdiff_capture, snapdiff_dumping


class Settings:
    def __init__(self, folder, interval):
        self.dir = str(folder)
        self.every = 0
        self.requests = None
        self.stack_root = None
        self.file_names = None
        self.entries = 1000
        self.stacks = True
        self.owners = False
        self.interval = interval


def test_ticks_during_a_slow_dump_are_skipped_and_the_interval_widens(tmp_path):
    capture = snapdiff_capture.Capture(torch, Settings(tmp_path, 0.05), deferred=False)
    capture.start_recording()
    kept = [torch.zeros(64) for _ in range(10)]
    write = capture.write

    def slow_write(path, **how):  # a dump of a large process: 0.3 s, six ticks
        time.sleep(0.3)
        return write(path, **how)

    capture.write = slow_write
    # The job's time starts here: on a busy machine, starting the recorder
    # may take seconds, which would make the first dump's share look small.
    capture.started = time.monotonic()
    capture.install_dump_thread()
    capture.install_interval()
    time.sleep(1.5)
    capture.uninstall()
    capture.cpu.stop()
    del kept
    # 1.5 s of 0.05 s ticks: 30 asked, a backlog would write them all.
    # The first dump took most of the job's time so far: the interval
    # widened to ten times its length, and the ticks during it were skipped.
    assert capture.interval >= 3.0
    assert capture.dumps <= 2, capture.dumps
    assert capture.skipped >= 3, capture.skipped
    assert not [t for t in threading.enumerate() if t.name.startswith("snapdiff")]


def test_requests_coalesce_one_per_reason():
    requests = snapdiff_capture.Requests()
    assert requests.put("signal") and requests.put("interval")
    assert not requests.put("signal")
    assert [requests.take(), requests.take()] == ["signal", "interval"]
    requests.put("signal")
    requests.close()
    assert requests.take() is None and not requests.put("interval")


SLOW_STEP_DUMP = """
import os, sys, time, torch
from snapdiff.hook import snapdiff_capture
sys.path.insert(0, os.path.dirname(sys.argv[2]))
from test_capture_hook import Settings

capture = snapdiff_capture.Capture(torch, Settings(sys.argv[1], None), deferred=False)
capture.settings.every = 1
capture.install()
write = capture.write
seconds = float(sys.argv[3])

def slow_write(path, **how):  # a step dump of a large process, with owners
    if "exit" not in path:
        print("dumping", flush=True)
        time.sleep(seconds)
    return write(path, **how)

capture.write = slow_write
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
kept = torch.zeros(64)
print("stepping", flush=True)
model(torch.ones(4)).sum().backward()
optimizer.step()  # the step's dump, on this (the main) thread
print("stepped", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("dump_seconds", [1.0, 6.0])
def test_sigterm_during_a_step_dump_ends_the_job_within_its_bound(tmp_path, dump_seconds):
    """A step dump is written on the main thread, which SIGTERM's handler
    interrupts: the job ends by SIGTERM once that dump is done, with its
    exit dump if there is time, and 2 s after the signal at the latest,
    without it. (Inside one long call into C, no Python handler can run
    until it returns.)"""
    import json
    import signal
    import subprocess
    import sys

    job = subprocess.Popen(
        [sys.executable, "-c", SLOW_STEP_DUMP, str(tmp_path), __file__, str(dump_seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    try:
        assert job.stdout.readline().strip() == "stepping", job.stderr.read()
        assert job.stdout.readline().strip() == "dumping", job.stderr.read()
        time.sleep(0.8)  # inside the step's dump
        signalled = time.monotonic()
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=30)
    finally:
        job.kill()
    took = time.monotonic() - signalled
    assert job.returncode == -signal.SIGTERM, err
    assert took < 3.0, f"ended {took:.1f} s after SIGTERM"
    assert "stepped" not in out
    manifest = tmp_path / "manifest.jsonl"
    lines = manifest.read_text().splitlines() if manifest.exists() else []
    reasons = [json.loads(line)["reason"] for line in lines]
    if dump_seconds < 2:
        assert reasons == ["step", "exit"], (reasons, err)
    else:
        assert reasons == [] and "the job ends without it" in err, (reasons, err)


SLOW_EXIT_DUMP = """
import os, sys, time, torch
from snapdiff.hook import snapdiff_capture
sys.path.insert(0, os.path.dirname(sys.argv[2]))
from test_capture_hook import Settings

capture = snapdiff_capture.Capture(torch, Settings(sys.argv[1], None), deferred=False)
capture.install()
write = capture.write

def slow_write(path, **how):  # an exit dump of 1.5 s, in Python, where handlers run
    for _ in range(150):
        time.sleep(0.01)
    return write(path, **how)

capture.write = slow_write
kept = torch.zeros(64)
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("gap", [0.03, 1.2])
def test_sigterm_repeated_at_once_is_one_request_and_later_ends_the_job(tmp_path, gap):
    """A killed `snapdiff capture` sends the job its SIGTERM once per thread
    it had, a few milliseconds apart (and a scheduler may signal both):
    repeats within a second are one request, served with its exit dump. A
    SIGTERM later than that ends the job at once, without it."""
    import json
    import signal
    import subprocess
    import sys

    job = subprocess.Popen(
        [sys.executable, "-c", SLOW_EXIT_DUMP, str(tmp_path), __file__],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    try:
        assert job.stdout.readline().strip() == "ready", job.stderr.read()
        job.send_signal(signal.SIGTERM)
        time.sleep(gap)
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=30)
    finally:
        job.kill()
    assert job.returncode == -signal.SIGTERM, err
    manifest = tmp_path / "manifest.jsonl"
    lines = manifest.read_text().splitlines() if manifest.exists() else []
    reasons = [json.loads(line)["reason"] for line in lines]
    if gap < 1:
        assert reasons == ["exit"], (reasons, err)
    else:
        assert reasons == [] and "SIGTERM" not in err, (reasons, err)


SIGTERM_AS_A_STEP_DUMP_STARTS = """
import os, signal, sys, threading, time, torch
from snapdiff.hook import snapdiff_capture
sys.path.insert(0, os.path.dirname(sys.argv[2]))
from test_capture_hook import Settings

class SignalledOnce(threading.Event):
    armed = False

    def is_set(self):  # asked first thing under the dump lock
        if self.armed:
            self.armed = False
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the handler runs here
        return super().is_set()

capture = snapdiff_capture.Capture(torch, Settings(sys.argv[1], None), deferred=False)
capture.settings.every = 1
capture.stopping = SignalledOnce()
capture.install()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(4)).sum().backward()
capture.stopping.armed = True
optimizer.step()  # the step's dump, on this (the main) thread
print("stepped", flush=True)
"""


def test_sigterm_as_a_step_dump_takes_the_lock_gets_the_exit_dump_at_once(tmp_path):
    """A SIGTERM handled on the main thread just as it took the dump lock for
    a step dump, before writing: the exit dump is written then and there
    (it used to wait 2 s for a lock its own thread held, and give up)."""
    import json
    import signal
    import subprocess
    import sys

    job = subprocess.run(
        [sys.executable, "-c", SIGTERM_AS_A_STEP_DUMP_STARTS, str(tmp_path), __file__],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert job.returncode == -signal.SIGTERM, job.stderr
    assert "stepped" not in job.stdout and "without it" not in job.stderr, job.stderr
    lines = (tmp_path / "manifest.jsonl").read_text().splitlines()
    assert [json.loads(line)["reason"] for line in lines] == ["exit"], job.stderr


def test_the_pacer_is_weak_and_an_optimizer_that_takes_no_weak_reference_still_paces(tmp_path):
    capture = snapdiff_capture.Capture(torch, Settings(tmp_path, None), deferred=False)
    model = torch.nn.Linear(2, 2)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    capture.after_step(first, (), {})
    import gc
    import weakref

    dropped = weakref.ref(first)
    del first
    gc.collect()
    assert dropped() is None  # the hook kept nothing of it

    class Slotted:  # an optimizer-like object without __weakref__
        __slots__ = ()

    second = Slotted()
    for _ in range(3):
        capture.after_step(second, (), {})
    assert capture.steps == 4


FIXTURE = os.path.join(
    os.path.dirname(__file__), "../../../shared/fixtures/torch/cs336-medium-128-training.pickle"
)


def test_a_cuda_dumps_trace_gets_the_jobs_steps_where_their_times_fall(tmp_path):
    """PyTorch's trace cannot be told the job's steps while it records: the
    hook puts them in where their times fall, and reports cut there."""
    if not os.path.exists(FIXTURE):
        pytest.skip("../shared/fixtures is not beside the repository")
    with open(FIXTURE, "rb") as f:
        snapshot = pickle.load(f)
    before = list(snapshot["device_traces"][0])
    first, last = before[0]["time_us"], before[-1]["time_us"]
    span = last - first
    # One before recording began (left out), three inside, one after the end.
    marks = [(0, first - 10)] + [(k, first + k * span // 4) for k in (1, 2, 3)] + [(4, last + 10)]
    snapdiff_dumping.mark_steps(snapshot, collections.deque(marks))
    after = snapshot["device_traces"][0]
    assert [e for e in after if e["action"] != "step"] == before
    steps = [(i, e) for i, e in enumerate(after) if e["action"] == "step"]
    assert [e["size"] for _, e in steps] == [1, 2, 3, 4]
    for i, e in steps:
        assert after[i - 1]["time_us"] <= e["time_us"]
        assert i + 1 == len(after) or e["time_us"] < after[i + 1]["time_us"]
    path = tmp_path / "marked.pickle"
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    report = one_trend(json.loads(subprocess.run(
        [binary(), "trend", str(path), "--json"], check=True, capture_output=True, text=True,
    ).stdout))
    assert report["checkpoint_source"] == "step_marks", report
    assert [p["step"] for p in report["points"]] == [1, 2, 3, 4], report["points"]
