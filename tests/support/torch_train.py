"""A real PyTorch training job, run under `snapdiff capture` by
tests/torch_capture.rs (on the CPU) and tests/gpu/run.sh (on CUDA): a small network trained with AdamW or SGD, each of
the design's leaks on request, and the ways jobs are run (DataLoader
workers, ranks, signals, crashes).

Each leak's line carries a `leaks with --leak KIND` marker; the tests look
it up and expect the report to name that line.
"""

import argparse
import gc
import json
import os
import sys
import time
import weakref

import numpy
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x):
        features = torch.relu(self.fc1(x))
        return features, self.fc2(features)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--leak", choices=["hidden-state", "loss-list", "cache-dict", "numpy-list"])
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    p.add_argument("--ranks", type=int, default=0)
    p.add_argument("--rank-start-method", choices=["fork", "spawn"], default="spawn")
    p.add_argument("--leak-rank", type=int, help="with --ranks, only this rank leaks")
    p.add_argument(
        "--gloo", metavar="URL",
        help="with --ranks, ranks join a gloo process group at URL (and leave RANK unset)",
    )
    p.add_argument("--raise-at", type=int, default=0)
    p.add_argument("--leak-from", type=int, default=0, help="the leak begins at this step")
    p.add_argument(
        "--progress", metavar="FILE",
        help="write each step's number here as it ends (what a watcher's alert is checked against)",
    )
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument(
        "--wait-for", metavar="FILE",
        help="after the last step (or --wait-at's), wait (at most 2 minutes) until FILE exists: "
        "a test looks at the job while it still runs",
    )
    p.add_argument(
        "--wait-at", type=int, default=0, metavar="STEP",
        help="with --wait-for, wait after this step instead of the last: a watcher's alert is "
        "checked to come while the job still has steps to run, however busy the machine",
    )
    p.add_argument("--accounting", help="write the model's own storage accounting here")
    p.add_argument(
        "--keep-tensors", type=int, default=0,
        help="keep this many small tensors alive throughout (a large process: slow dumps)",
    )
    p.add_argument(
        "--new-optimizer-at", type=int, default=0,
        help="at this step, drop the model and its optimizer and train a new pair "
        "(stderr says whether the old optimizer was freed)",
    )
    p.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto",
        help="where tensors live; auto: CUDA when torch sees it, as the recorder chooses",
    )
    return p.parse_args()


def batches(args):
    data = TensorDataset(torch.randn(256, 32), torch.randint(0, 8, (256,)))
    if args.workers == 0:
        loader = DataLoader(data, batch_size=32, shuffle=True)
    else:
        loader = DataLoader(
            data, batch_size=32, shuffle=True, num_workers=args.workers,
            multiprocessing_context=args.start_method,
        )
    while True:
        yield from loader


def device(args):
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return args.device


def train(args):
    torch.manual_seed(0)
    on = device(args)
    model = Net().to(on)
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    state = torch.ones(64, device=on)
    losses, cache, arrays = [], {}, []
    kept_alive = [torch.zeros(4) for _ in range(args.keep_tensors)]
    if args.leak_rank is not None and args.rank != args.leak_rank:
        args.leak = None
    data = batches(args)
    leak = args.leak
    for step in range(1, args.steps + 1):
        args.leak = leak if step >= args.leak_from else None
        x, y = (t.to(on) for t in next(data))
        features, logits = model(x)
        loss = F.cross_entropy(logits, y)  # leaks with --leak loss-list
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.leak == "hidden-state":
            state = state * torch.sigmoid(features.mean(0))  # leaks with --leak hidden-state
        elif args.leak == "loss-list":
            losses.append(loss)
        elif args.leak == "cache-dict":
            cache[step] = features.detach().clone()  # leaks with --leak cache-dict
        elif args.leak == "numpy-list":
            # 16 MiB a step outside every allocator snapdiff records.
            arrays.append(numpy.ones(4 << 20, dtype=numpy.float32))  # leaks with --leak numpy-list
        if step == args.raise_at:
            raise RuntimeError(f"failing on purpose at step {step}")
        if step == args.new_optimizer_at:
            # Drops the model and its optimizer for a new pair; says on
            # stderr whether the old optimizer was freed (nothing of the
            # job's holds it now).
            dropped = weakref.ref(opt)
            del model, opt, features, logits, loss
            gc.collect()
            print(f"old optimizer freed: {dropped() is None}", file=sys.stderr, flush=True)
            model = Net().to(on)
            opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        if args.progress:  # replaced whole, so that a reader never sees it empty
            with open(args.progress + ".part", "w") as f:
                f.write(str(step))
            os.replace(args.progress + ".part", args.progress)
        if step == args.wait_at:
            wait_for(args.wait_for)
        time.sleep(args.step_seconds)
    if args.accounting:
        account(model, opt, args.accounting)
    if not args.wait_at:
        wait_for(args.wait_for)


def wait_for(path):
    """Waits until `path` exists, at most 2 minutes (none when no path)."""
    deadline = time.monotonic() + 120
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def account(model, opt, path):
    """PyTorch's own view of the storages that must be live at the end:
    parameters, gradients and optimizer state, by data pointer."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()]
    for state in opt.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    with open(path, "w") as f:
        json.dump({str(k): v for k, v in storages.items()}, f)


def run_rank(rank, args):
    args.rank = rank
    if not args.gloo:
        os.environ["RANK"] = str(rank)
        train(args)
        return
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=args.gloo, rank=rank, world_size=args.ranks)
    train(args)
    dist.destroy_process_group()


def main():
    args = parse()
    args.rank = None
    if args.ranks:
        torch.multiprocessing.start_processes(
            run_rank, args=(args,), nprocs=args.ranks, start_method=args.rank_start_method
        )
    else:
        train(args)
    print("trained", file=sys.stderr)


if __name__ == "__main__":
    main()
