"""The cost of finding owners ("held by") in a process of real size: about
a million Python objects with transformers and a hundred other modules
imported, ten thousand tensors whose owners lie five or more references
from a module global or a live frame (an evaluation store never flushed,
a cache in a dict of objects, activations kept by forward hooks' closures,
a retained autograd graph), and a dataset of 330,000 records.

    PYTHONPATH=python python3 bench/owners.py [--load N]

`--load N` runs N busy processes beside it (the machine is loaded).
Prints the search's time (best of 3) and what it found, and exits 1 when
some block was left without an owner."""

import gc
import importlib
import multiprocessing
import pkgutil
import sys
import time
from collections import Counter

import torch
import transformers  # noqa: F401  (its globals are part of the heap)
from transformers.models.bert import modeling_bert  # noqa: F401

from snapdiff.hook import snapdiff_owners

# A hundred more modules of the standard library.
for info in list(pkgutil.iter_modules())[:400]:
    if len(sys.modules) > 2000 or info.name.startswith(("_", "idle", "tkinter", "turtle", "this")):
        continue
    try:
        importlib.import_module(info.name)
    except BaseException:
        pass


class Controller:
    def __init__(self):
        self.step_store = {"down_cross": [], "up_cross": []}


class Evaluation:
    def __init__(self):
        self.controller = Controller()


class App:
    def __init__(self):
        self.evaluation = Evaluation()
        self.cache = {f"k{i}": {"value": torch.ones(8)} for i in range(6_000)}


# A dataset of 330,000 records: a million objects with the modules.
records = [{"id": i, "tags": [i, str(i)]} for i in range(330_000)]
app = App()
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)])
batch = torch.randn(4, 32)


def keep_activations(store):
    def hook(module, inputs, output):
        store.append(output.detach() * 1)

    return hook


def main():
    for layer in model:  # each hook's list is reached only through its closure
        layer.register_forward_hook(keep_activations([]))
    total = 0
    for step in range(250):
        store = app.evaluation.controller.step_store
        store["down_cross"].append(torch.ones(16) * step)
        store["up_cross"].append(torch.ones(16) * step)
        del store
        total = total + model(batch).sum()  # keeps each step's graph
    blocks = {}
    for o in gc.get_objects():
        if type(o) in (torch.Tensor, torch.nn.Parameter):
            s = o.untyped_storage()
            blocks[s.data_ptr()] = max(1, s.nbytes())
    objects = len(gc.get_objects())
    best = None
    for _ in range(3):
        found = snapdiff_owners.find(torch, list(blocks.items()))
        best = found if best is None or found["seconds"] < best["seconds"] else best
    kinds = Counter(o["kind"] for o in best["blocks"].values())
    groups = Counter(o["group"] for o in best["blocks"].values())
    print(
        f"{objects:,} objects, {best['tensors']:,} tensors, {len(blocks):,} blocks: "
        f"{best['seconds']:.2f} s (complete: {best['complete']}, {best['visited']:,} objects "
        f"visited, {len(best['blocks']):,} blocks named); owners by kind: {dict(kinds)}"
    )
    for group, n in groups.most_common(6):
        print(f"  {n:6,}  {group}")
    return 0 if best["complete"] and len(best["blocks"]) == len(blocks) else 1


def busy():
    while True:
        pass


if __name__ == "__main__":
    load = int(sys.argv[sys.argv.index("--load") + 1]) if "--load" in sys.argv else 0
    hogs = [multiprocessing.Process(target=busy, daemon=True) for _ in range(load)]
    for hog in hogs:
        hog.start()
    time.sleep(0.5 if load else 0)
    try:
        sys.exit(main())
    finally:
        for hog in hogs:
            hog.terminate()
