"""The capture hook's handling of requests, on real torch (CPU tensors):
dumps slower than the interval never pile up."""

import threading
import time

import torch

from snapdiff.hook import snapdiff_capture


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

    def slow_write(path):  # a dump of a large process: 0.3 s, six ticks
        time.sleep(0.3)
        return write(path)

    capture.write = slow_write
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
