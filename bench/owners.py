"""The cost of finding owners ("held by") in a large process: about a
million Python objects and ten thousand tensors, some in a growing list,
some in dicts of an object graph, some saved by a retained autograd graph.

    PYTHONPATH=python python3 bench/owners.py

Prints the search's time (best of 3) and what it found."""

import gc
import sys
import time
from collections import Counter

import torch

from snapdiff.hook import snapdiff_owners

# About a million ordinary objects: records of a dataset, say.
records = [{"id": i, "tags": [i, str(i)]} for i in range(330_000)]
history = [torch.ones(16) for _ in range(4_000)]
cache = {f"k{i}": {"value": torch.ones(8)} for i in range(4_000)}
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)])
batch = torch.randn(4, 32)


def main():
    total = 0
    for _ in range(250):
        total = total + model(batch).sum()  # keeps each step's graph
    blocks = {}
    for o in gc.get_objects():
        if issubclass(type(o), torch.Tensor):
            s = o.untyped_storage()
            blocks[s.data_ptr()] = max(1, s.nbytes())
    best = None
    for _ in range(3):
        found = snapdiff_owners.find(torch, list(blocks.items()), seconds=30)
        best = found if best is None or found["seconds"] < best["seconds"] else best
    kinds = Counter(o["kind"] for o in best["blocks"].values())
    print(
        f"{best['objects']:,} objects, {best['tensors']:,} tensors, {len(blocks):,} blocks: "
        f"{best['seconds']:.2f} s (complete: {best['complete']}, {best['visited']:,} objects "
        f"visited); owners by kind: {dict(kinds)}"
    )


main()
