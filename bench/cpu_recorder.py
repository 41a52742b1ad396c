"""Steps per second of the test model with and without the CPU recorder.

    python3 bench/cpu_recorder.py
"""
import os, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python/snapdiff/hook"))
import torch, torch.nn.functional as F
sys.path.insert(0, os.path.join(ROOT, "tests/support"))
from torch_train import Net

def run(steps, record):
    torch.manual_seed(0)
    rec = None
    if record:
        import snapdiff_cpu_recorder
        rec = snapdiff_cpu_recorder.CpuRecorder(100000); rec.start()
    model = Net(); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 32); y = torch.randint(0, 8, (32,))
    t = time.perf_counter()
    for _ in range(steps):
        _, logits = model(x); loss = F.cross_entropy(logits, y)
        opt.zero_grad(); loss.backward(); opt.step()
    dt = time.perf_counter() - t
    if rec: rec.stop()
    return steps / dt
for rnd in range(3):
    print("off %.0f steps/s   on %.0f steps/s" % (run(2000, False), run(2000, True)))
