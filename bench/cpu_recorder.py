"""What the CPU recorder costs a job, side by side in one run:

- steps per second of the test model (`tests/support/torch_train.py`'s
  Net, AdamW) without recording, under the allocator recorder (the one
  used where a C++ compiler is at hand), under a dispatch mode that does
  nothing (the floor of any recorder built on `TorchDispatchMode`: every
  operator through Python), and under the dispatch recorder;
- how long a dump of a process holding 100,000 live tensors takes, the
  first and a later one, written as capture writes it.

    python3 bench/cpu_recorder.py
"""
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python/snapdiff/hook"))
sys.path.insert(0, os.path.join(ROOT, "tests/support"))
import snapdiff_cpu_recorder  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch_train import Net  # noqa: E402


class NothingMode(TorchDispatchMode):
    """The floor: each operator through Python, nothing recorded."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def steps_per_second(steps, mode):
    torch.manual_seed(0)
    if mode is not None:
        mode.start() if hasattr(mode, "start") else mode.__enter__()
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 32), torch.randint(0, 8, (32,))
    start = time.perf_counter()
    for _ in range(steps):
        _, logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    took = time.perf_counter() - start
    if mode is not None:
        mode.stop() if hasattr(mode, "stop") else mode.__exit__(None, None, None)
    return steps / took


def dump_seconds(tensors):
    """The first dump of a process holding `tensors` live tensors and a
    later one, as capture writes them (`AllocatorRecorder.write`)."""
    recorder = allocator_recorder()
    recorder.start()
    kept = [torch.zeros(4) for _ in range(tensors)]
    times = []
    with tempfile.TemporaryDirectory() as folder:
        for n in range(2):
            start = time.perf_counter()
            with open(os.path.join(folder, f"{n}.pickle"), "wb") as f:
                recorder.write(f)
            times.append(time.perf_counter() - start)
    recorder.stop()
    del kept
    return times


def allocator_recorder():
    recorder = snapdiff_cpu_recorder.CpuRecorder(100000)
    assert isinstance(recorder, snapdiff_cpu_recorder.AllocatorRecorder)
    return recorder


def dispatch_recorder():
    return snapdiff_cpu_recorder.DispatchRecorder(100000)


steps_per_second(200, allocator_recorder())  # builds the library, imports, warm-up
steps_per_second(200, dispatch_recorder())
for _ in range(3):
    off = steps_per_second(2000, None)
    allocator = steps_per_second(2000, allocator_recorder())
    floor = steps_per_second(2000, NothingMode())
    dispatch = steps_per_second(2000, dispatch_recorder())
    print(f"off {off:.0f} steps/s   allocator recorder {allocator:.0f} ({off / allocator:.2f}x)   "
          f"nothing-mode {floor:.0f} ({off / floor:.2f}x)   "
          f"dispatch recorder {dispatch:.0f} ({off / dispatch:.2f}x)")
first, later = dump_seconds(100_000)
print(f"dump of 100,000 tensors: first {first * 1000:.0f} ms, a later one {later * 1000:.0f} ms")
