"""A CPU training loop whose memory PyTorch itself can account for: each
step makes and frees 2 MiB of temporaries, grows one tensor by 1 MiB with
`resize_` (the leak), swaps another's storage with `set_`, and runs a sparse
embedding's backward. At the end it writes the bytes of the storages of every
live tensor, as PyTorch reports them (strided tensors' alone, and with the
parts of sparse ones), to the file given as its argument."""

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
    storages = {}  # data pointer -> bytes, of strided tensors
    parts = {}  # the same of sparse tensors' indices and values
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor):
            continue
        if obj.layout == torch.strided:
            tensors, into = [obj], storages
        elif obj.layout == torch.sparse_coo:
            tensors, into = [obj._indices(), obj._values()], parts
        else:
            continue
        for t in tensors:
            s = t.untyped_storage()
            if s.nbytes():
                into[s.data_ptr()] = s.nbytes()
    with open(sys.argv[1], "w") as f:
        # The most that is live at once: during the last `resize_`, the
        # grown tensor's old and new storages (10 and 11 MiB: it allocates
        # the new one, copies, frees the old), the swapped storage (1 MiB)
        # and the embedding with its gradient (under 64 KiB). (The two
        # temporaries and `set_`'s two storages make 13 MiB with the grown
        # tensor.)
        peak_bound = (10 + 11 + 1) * MiB + 64 * 1024
        strided = sum(storages.values())
        json.dump({
            "strided_bytes": strided,
            "live_bytes": strided + sum(parts.values()),
            "peak_bound": peak_bound,
        }, f)


if __name__ == "__main__":
    main()
