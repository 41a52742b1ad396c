"""A STAND-IN for the `torch` package, for testing `snapdiff capture`'s
Python start-up hook without PyTorch or a GPU.

It has just the names the hook calls. Each call is appended, as one JSON line,
to the file named by $FAKE_TORCH_LOG. `_dump_snapshot` writes a real PyTorch
snapshot pickle (the schema of `torch.cuda.memory._snapshot()`) in which a
site in the "user's" code holds one more 1 MiB block per dump: a leak for
`snapdiff trend` to find.
"""
import json
import os

from . import _C, cuda, optim  # noqa: F401


def _log(call, **args):
    path = os.environ.get("FAKE_TORCH_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"call": call, **args}) + "\n")
