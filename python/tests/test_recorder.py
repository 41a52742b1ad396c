"""The CPU recorders on real torch: what they hold stays bounded however
long the job runs, each dump says what changed, and the allocator
recorder's own pickle is the snapshot's."""

import os
import pickle
import subprocess
import sys
import threading

import pytest
import torch

from snapdiff.hook.snapdiff_cpu_recorder import (
    AllocatorRecorder,
    CpuRecorder,
    DispatchRecorder,
)


def allocator_recorder(max_entries=100_000, stacks=True):
    recorder = CpuRecorder(max_entries, stacks=stacks)
    # CI installs a C++ compiler: the allocator hook must build there.
    assert isinstance(recorder, AllocatorRecorder), type(recorder)
    return recorder


RECORDERS = {
    "allocator": allocator_recorder,
    "dispatch": lambda max_entries=100_000: DispatchRecorder(max_entries),
}


def sizes(snapshot):
    return sorted(b["size"] for s in snapshot["segments"] for b in s["blocks"])


def test_in_place_steps_on_a_long_lived_tensor_hold_nothing_more():
    # An optimizer's in-place updates, ten thousand times over: the
    # dispatch recorder watches each tensor once, not once per operator.
    recorder = DispatchRecorder(1000)
    recorder.start()
    try:
        weight = torch.zeros(16)
        for _ in range(10_000):
            weight.mul_(0.5).add_(1.0)
        watched = len(recorder._watched)
    finally:
        recorder.stop()
    assert watched < 50, watched


@pytest.mark.parametrize("kind", sorted(RECORDERS))
def test_each_dump_says_what_changed_since_the_last(kind):
    recorder = RECORDERS[kind]()
    recorder.start()
    try:
        kept = [torch.zeros(256) for _ in range(100)]
        first = recorder.snapshot()
        del kept[:50]
        kept.append(torch.ones(1024))
        second = recorder.snapshot()
    finally:
        recorder.stop()

    assert sizes(first) == [1024] * 100
    assert sizes(second) == [1024] * 50 + [4096]
    actions = [e["action"] for e in second["device_traces"][0]]
    # The first dump's events, its marker, then the frees and the new tensor.
    assert actions[: len(first["device_traces"][0])] == [
        e["action"] for e in first["device_traces"][0]]
    later = actions[len(first["device_traces"][0]):]
    assert later[0] == "snapshot"
    assert later.count("segment_free") == 50 and later.count("segment_alloc") == 1
    if kind == "dispatch":
        # The records of the storages alive at both dumps were kept, not made again.
        before = {s["address"]: s for s in first["segments"]}
        both = [s for s in second["segments"] if s["total_size"] == 1024]
        assert len(both) == 50 and all(s is before[s["address"]] for s in both)


def test_the_allocator_recorders_pickle_holds_torchs_own_storages(tmp_path):
    recorder = allocator_recorder(max_entries=500)
    recorder.start()
    try:
        kept = [torch.zeros(4) for _ in range(300)]
        del kept[::3]
        kept.append(torch.zeros(1 << 19))
        with open(tmp_path / "now.pickle", "wb") as f:
            blocks = recorder.write(f, blocks=True)
    finally:
        recorder.stop()
    with open(tmp_path / "now.pickle", "rb") as f:
        written = pickle.load(f)
    # Each live tensor's storage, at PyTorch's address, of PyTorch's size.
    storages = sorted((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in kept)
    assert blocks == storages
    assert [(s["address"], s["total_size"]) for s in written["segments"]] == storages
    assert [(b["address"], b["size"], b["state"]) for s in written["segments"]
            for b in s["blocks"]] == [(a, n, "active_allocated") for a, n in storages]
    assert {s["segment_type"] for s in written["segments"]} == {"small", "large"}
    # The newest 500 of PyTorch's events: 2 an allocation, 3 a free; the
    # last, the frees of `del kept[::3]` and the large allocation.
    trace = written["device_traces"][0]
    assert len(trace) == 500
    assert [e["action"] for e in trace[-5:]] == [
        "free_requested", "free_completed", "segment_free", "segment_alloc", "alloc"]
    assert (trace[-1]["addr"], trace[-1]["size"]) == storages_of(kept[-1])
    # Frame lists are shared, as pickle shares them, and name this file.
    frames = [s["frames"] for s in written["segments"]]
    assert frames[0][0]["filename"] == __file__
    assert len({id(f) for f in frames}) == 2  # the small ones' line, the large one's
    # The whole file is as `pickle` itself would write that dict.
    assert pickle.loads(pickle.dumps(written, protocol=4)) == written


def storages_of(tensor):
    return tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()


def test_the_allocator_recorder_names_the_calling_line_or_nothing_without_stacks():
    def allocate():
        return torch.empty(1000)  # the line

    line = allocate.__code__.co_firstlineno + 1
    for stacks in (True, False):
        recorder = allocator_recorder(stacks=stacks)
        recorder.start()
        try:
            kept = allocate()
            snapshot = recorder.snapshot()
        finally:
            recorder.stop()
        (segment,) = [s for s in snapshot["segments"] if s["total_size"] == 4000]
        if stacks:
            top = segment["frames"][0]
            assert (top["name"], top["line"]) == ("allocate", line), segment["frames"]
            assert top["filename"] == __file__
        else:
            assert segment["frames"] == []
        del kept


def test_the_allocator_recorder_sees_other_threads_without_their_stacks():
    recorder = allocator_recorder()
    recorder.start()
    kept = []
    try:
        worker = threading.Thread(target=lambda: kept.append(torch.empty(3000)))
        worker.start()
        worker.join()
        snapshot = recorder.snapshot()
    finally:
        recorder.stop()
    (segment,) = [s for s in snapshot["segments"] if s["total_size"] == 12000]
    assert segment["frames"] == []


def test_storages_outlive_the_recording_and_a_new_one_starts_afresh():
    first = allocator_recorder()
    first.start()
    kept = torch.empty(5000)
    first.stop()
    after = torch.empty(6000)  # not recorded
    second = allocator_recorder()
    second.start()
    try:
        new = torch.empty(7000)
        del kept  # made by the first recording: freed through its wrapper
        snapshot = second.snapshot()
    finally:
        second.stop()
    assert sizes(snapshot) == [28000]
    assert [e["action"] for e in snapshot["device_traces"][0]] == ["segment_alloc", "alloc"]
    del after, new


def test_a_forked_child_allocates_and_frees_without_the_recorder():
    recorder = allocator_recorder()
    recorder.start()
    try:
        kept = [torch.empty(1000)]
        pid = os.fork()
        if pid == 0:  # the child: allocations pass through, frees too
            status = 0
            try:
                kept.extend(torch.empty(100) for _ in range(1000))
                kept.clear()
            except BaseException:
                status = 1
            os._exit(status)
        _, status = os.waitpid(pid, 0)
        snapshot = recorder.snapshot()
    finally:
        recorder.stop()
    assert os.waitstatus_to_exitcode(status) == 0
    assert sizes(snapshot) == [4000]


# Two threads taking PyTorch's generator lock in opposite orders with the
# GIL: the recording thread draws samples (the lock held while allocating,
# the GIL released), the other reads the generator's state (the lock taken
# with the GIL held). A recorder that waits for the GIL inside an
# allocation hangs here at once.
LOCK_PAIR = """
import subprocess, sys, threading, time, torch
from snapdiff.hook.snapdiff_cpu_recorder import AllocatorRecorder, CpuRecorder
seconds = float(sys.argv[1])
hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
recorder = CpuRecorder()
assert isinstance(recorder, AllocatorRecorder), type(recorder)
recorder.start()
end = time.monotonic() + seconds
def read_state():
    while time.monotonic() < end:
        torch.get_rng_state()
reader = threading.Thread(target=read_state)
reader.start()
probs = torch.rand(1000)
kept = []
draws = 0
while time.monotonic() < end:
    sample = torch.multinomial(probs, 100, replacement=True)  # the draw
    if len(kept) < 5:
        kept.append(sample)
    draws += 1
reader.join()
hog.kill()
snapshot = recorder.snapshot()
recorder.stop()
lines = sorted({s["frames"][0]["line"] for s in snapshot["segments"] if s["total_size"] == 800})
print(draws, lines)
"""


def test_threads_taking_torchs_locks_in_both_orders_never_hang_the_job(tmp_path):
    script = tmp_path / "lock_pair.py"
    script.write_text(LOCK_PAIR)
    draw_line = LOCK_PAIR.splitlines().index(
        "    sample = torch.multinomial(probs, 100, replacement=True)  # the draw"
    ) + 1
    done = subprocess.run(
        [sys.executable, str(script), "60"], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    draws, lines = done.stdout.split(" ", 1)
    assert int(draws) > 1000
    # The recording thread's storages still name their line.
    assert lines.strip() == f"[{draw_line}]"


def test_the_stack_follows_generators_exceptions_and_returns():
    def numbers():
        yield torch.empty(11)  # in the generator, first
        yield torch.empty(12)  # in the generator, resumed

    def fails():
        torch.empty(13)  # before the raise
        raise ValueError

    recorder = allocator_recorder()
    recorder.start()
    try:
        kept = list(numbers())
        try:
            fails()
        except ValueError:
            kept.append(torch.empty(14))  # in the handler
        kept.append(torch.empty(15))  # after it all
        snapshot = recorder.snapshot()
    finally:
        recorder.stop()
    here = test_the_stack_follows_generators_exceptions_and_returns.__name__
    expected = {
        44: ("numbers", line_of("# in the generator, first")),
        48: ("numbers", line_of("# in the generator, resumed")),
        56: (here, line_of("# in the handler")),
        60: (here, line_of("# after it all")),
    }
    found = {
        s["total_size"]: (s["frames"][0]["name"], s["frames"][0]["line"])
        for s in snapshot["segments"]
        if s["total_size"] in expected
    }
    assert found == expected
    # Nothing of the generator's or the raiser's frames stays below.
    for size in (56, 60):
        (segment,) = [s for s in snapshot["segments"] if s["total_size"] == size]
        names = [f["name"] for f in segment["frames"]]
        assert "numbers" not in names and "fails" not in names, names


def line_of(marker):
    """The line of this file that ends with `marker`."""
    with open(__file__) as f:
        (line,) = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(marker)]
    return line


def test_another_profiler_on_the_recording_thread_is_said_and_no_stack_is_wrong():
    said = []
    recorder = CpuRecorder(warn=said.append)
    assert isinstance(recorder, AllocatorRecorder)
    recorder.start()
    try:
        sys.setprofile(lambda *args: None)
        try:
            kept = torch.empty(17)
        finally:
            sys.setprofile(None)
        snapshot = recorder.snapshot()
    finally:
        recorder.stop()
    (segment,) = [s for s in snapshot["segments"] if s["total_size"] == 68]
    assert segment["frames"] == []
    assert len(said) == 1 and "without stacks" in said[0], said
    del kept


def test_a_profiler_the_job_runs_is_never_replaced_by_the_recorder():
    """A job profiled (cProfile, `sys.setprofile`) when recording starts
    keeps its profiler: the recorder does without stacks and says so."""
    calls = []

    def profiler(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    def inner():
        return torch.empty(19)

    said = []
    sys.setprofile(profiler)
    try:
        recorder = CpuRecorder(warn=said.append)
        assert isinstance(recorder, AllocatorRecorder)
        recorder.start()
        try:
            kept = inner()
            assert sys.getprofile() is profiler
            snapshot = recorder.snapshot()
        finally:
            recorder.stop()
        assert sys.getprofile() is profiler  # stopping leaves it too
    finally:
        sys.setprofile(None)
    assert "inner" in calls
    (segment,) = [s for s in snapshot["segments"] if s["total_size"] == 76]
    assert segment["frames"] == []
    assert len(said) == 1 and "left to it" in said[0], said
    del kept
