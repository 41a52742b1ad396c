"""Backward allocations named by the forward line that caused them, from the
`forward_frames` real torch keeps in anomaly mode.

No GPU here: the CUDA allocator that copies a node's forward stack into the
snapshot cannot run. The forward stacks themselves are real: torch on the CPU
stores them on each autograd node under anomaly mode (`traceback_`), exactly
the strings the allocator writes as `forward_frames`; the snapshots around
them are written by CPython's pickler in the layout of
fixtures/make_torch_format.py's `backward_snapshot`.
"""

import inspect
import pickle

import torch

import snapdiff

MiB = 1 << 20


def _forward_stacks():
    """The forward stacks anomaly mode keeps for two operations of a real
    forward pass, with the line of each."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    with torch.autograd.detect_anomaly():
        x = torch.randn(4, 8, requires_grad=True)
        first_line = inspect.currentframe().f_lineno + 1
        h = model[0](x).relu()
        second_line = inspect.currentframe().f_lineno + 1
        y = model[1](h).exp()
    return (h.grad_fn.metadata["traceback_"], first_line), (y.grad_fn.metadata["traceback_"], second_line)


def _snapshot(step, first, second):
    """A process after `step` steps: one backward block from each forward
    operation, and one more from the second each step (a hook keeping it)."""
    live = [(16 * MiB, first), (16 * MiB, second)] + [(4 * MiB, second)] * step
    base, at, blocks = 0x7F3000000000, 0x7F3000000000, []
    for size, forward in live:
        blocks.append({"address": at, "size": size, "requested_size": size, "state": "active_allocated",
                       "frames": [], "forward_frames": forward})
        at += size
    used = at - base
    segment = {"device": 0, "address": base, "total_size": used, "allocated_size": used, "active_size": used,
               "requested_size": used, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
               "is_expandable": False, "frames": [], "blocks": blocks}
    return {"segments": [segment], "device_traces": [[]]}


def test_a_backward_leak_is_named_by_the_forward_line_from_real_anomaly_stacks(tmp_path):
    (first, first_line), (second, second_line) = _forward_stacks()
    assert any(f'line {second_line}, in _forward_stacks' in entry for entry in second), second
    files = []
    for step in range(8):
        path = tmp_path / f"step{step}.pickle"
        path.write_bytes(pickle.dumps(_snapshot(step, first, second), protocol=4))
        files.append(path)

    result = snapdiff.trend(tmp_path)
    assert len(result.suspects) == 1, str(result)
    culprit = result.suspects[0].culprit
    assert (culprit.kind, culprit.file, culprit.line) == ("forward", __file__, second_line), culprit
    assert str(culprit).startswith("backward of _forward_stacks"), str(culprit)

    # The steady one is a site of its own, named by its own forward line.
    sites = snapdiff.compare(files[0], files[-1]).groups
    lines = {(g.site.culprit.kind, g.site.culprit.line): g.delta_bytes for g in sites}
    assert lines.get(("forward", second_line)) == 7 * 4 * MiB, lines
    assert ("forward", first_line) not in lines or lines[("forward", first_line)] == 0, lines
