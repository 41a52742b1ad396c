"""The CPU recorder on real torch: what it holds stays bounded however long
the job runs, and records kept from dump to dump still say what changed."""

import torch

from snapdiff.hook.snapdiff_cpu_recorder import CpuRecorder


def test_in_place_steps_on_a_long_lived_tensor_hold_nothing_more():
    # An optimizer's in-place updates, ten thousand times over: the
    # recorder watches each tensor once, not once per operator.
    recorder = CpuRecorder(1000)
    recorder.start()
    try:
        weight = torch.zeros(16)
        for _ in range(10_000):
            weight.mul_(0.5).add_(1.0)
        watched = len(recorder._watched)
    finally:
        recorder.stop()
    assert watched < 50, watched


def test_each_dump_says_what_changed_since_the_last():
    recorder = CpuRecorder(100_000)
    recorder.start()
    try:
        kept = [torch.zeros(256) for _ in range(100)]
        first = recorder.snapshot()
        del kept[:50]
        kept.append(torch.ones(1024))
        second = recorder.snapshot()
    finally:
        recorder.stop()

    def sizes(snapshot):
        return sorted(b["size"] for s in snapshot["segments"] for b in s["blocks"])

    assert sizes(first) == [1024] * 100
    assert sizes(second) == [1024] * 50 + [4096]
    actions = [e["action"] for e in second["device_traces"][0]]
    # The first dump's events, its marker, then the frees and the new tensor.
    assert actions[: len(first["device_traces"][0])] == [
        e["action"] for e in first["device_traces"][0]]
    later = actions[len(first["device_traces"][0]):]
    assert later[0] == "snapshot"
    assert later.count("segment_free") == 50 and later.count("segment_alloc") == 1
    # The records of the storages alive at both dumps were kept, not made again.
    before = {s["address"]: s for s in first["segments"]}
    both = [s for s in second["segments"] if s["total_size"] == 1024]
    assert len(both) == 50 and all(s is before[s["address"]] for s in both)
