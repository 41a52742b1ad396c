"""THE ONE STAND-IN OF THE TESTS: the CUDA calls of real torch, which need a GPU.

There is no GPU here or in CI, so tests of the hook's CUDA path put this
folder on PYTHONPATH. It imports the real torch (so the hook finds torch
already imported, as when a script or a .pth file imports it first) and
replaces exactly these, logging each call as a JSON line to
$CUDA_STANDIN_LOG:

- torch.cuda.is_available: True;
- torch.cuda._lazy_call: runs the hook's call at once (CUDA counts as
  initialised); torch's own queued calls (seeding the CUDA RNG) are dropped,
  as there is no device for them;
- torch.cuda.current_device: 0;
- torch.cuda.memory._record_memory_history: logged;
- torch.cuda.memory._dump_snapshot: copies $CUDA_STANDIN_SNAPSHOT, a real
  snapshot that PyTorch wrote on a GPU, to the path asked for;
- torch._C._cuda_attach_out_of_memory_observer: logged.

Everything else is the real torch.
"""

import json
import os
import shutil

import torch


def _log(call, **details):
    with open(os.environ["CUDA_STANDIN_LOG"], "a") as f:
        f.write(json.dumps({"call": call, **details}) + "\n")


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=0, **_):
    _log("_record_memory_history", enabled=enabled, context=context, stacks=stacks,
         max_entries=max_entries)


def _dump_snapshot(filename="dump_snapshot.pickle"):
    _log("_dump_snapshot", filename=filename)
    shutil.copyfile(os.environ["CUDA_STANDIN_SNAPSHOT"], filename)


def _attach_out_of_memory_observer(observer):
    _log("_cuda_attach_out_of_memory_observer")


torch.cuda.is_available = lambda: True
def _lazy_call(call, **kwargs):
    if getattr(call, "__module__", "").startswith("snapdiff"):
        call()


torch.cuda._lazy_call = _lazy_call
torch.cuda.current_device = lambda: 0
torch.cuda.memory._record_memory_history = _record_memory_history
torch.cuda.memory._dump_snapshot = _dump_snapshot
torch._C._cuda_attach_out_of_memory_observer = _attach_out_of_memory_observer
