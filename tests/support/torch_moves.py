"""A CPU training loop whose memory PyTorch itself can account for: each
step makes and frees 2 MiB of temporaries, grows one tensor by 1 MiB with
`resize_` (the leak), swaps another's storage with `set_`, and runs a sparse
embedding's backward. At the end it writes the bytes of the storages of every
live tensor, as PyTorch reports them, to the file given as its argument."""

import gc
import json
import sys

import torch

MiB = 1 << 20
FLOATS = MiB // 4


def main():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(1000, 16, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    grown = torch.empty(FLOATS)
    swapped = torch.empty(FLOATS)
    for step in range(1, 11):
        a = torch.ones(FLOATS)
        b = a * 2
        del a, b
        grown.resize_((step + 1) * FLOATS)  # leaks: grows by 1 MiB a step
        swapped.set_(torch.zeros(FLOATS).untyped_storage())
        opt.zero_grad()
        emb(torch.tensor([1, 2, 3])).sum().backward()
        opt.step()
    del opt
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.layout == torch.strided:
            s = obj.untyped_storage()
            if s.nbytes():
                storages[s.data_ptr()] = s.nbytes()
    with open(sys.argv[1], "w") as f:
        # The most that is live at once: the grown tensor (11 MiB at the end),
        # the swapped storage and its successor during `set_` (2 MiB), the two
        # temporaries (2 MiB; the grown tensor is 1 MiB smaller then), and the
        # embedding with its gradient (under 64 KiB).
        peak_bound = (11 + 2 + 2 - 1) * MiB + 64 * 1024
        json.dump({"live_bytes": sum(storages.values()), "peak_bound": peak_bound}, f)


if __name__ == "__main__":
    main()
