# Installed by `snapdiff capture` (on PYTHONPATH, for this run only): records
# PyTorch's CUDA memory history and dumps snapshot pickles into
# $SNAPDIFF_DIR every N optimizer steps, every interval, on SIGUSR1, at exit
# and on CUDA out-of-memory. Any other sitecustomize on the path still runs.
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


def _chain_other_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _warn(message):
    print(f"snapdiff: {message}; the script runs without capture", file=sys.stderr)


def _interval_seconds(text):
    text = text.strip()
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))
    for suffix, scale in units:
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * scale
    try:
        return float(text)
    except ValueError:
        return None


def _start(torch):
    """Called once torch is imported: starts recording, if CUDA is there."""
    if not torch.cuda.is_available():
        _warn("CUDA is not available to torch")
        return
    import atexit
    import itertools
    import signal
    import threading

    out_dir = os.environ["SNAPDIFF_DIR"]
    entries = int(os.environ.get("SNAPDIFF_TRACE_ENTRIES") or 100000)
    stacks = os.environ.get("SNAPDIFF_STACKS", "1") != "0"
    torch.cuda.memory._record_memory_history(
        enabled="all" if entries > 0 else "state",
        context="all" if stacks else None,
        stacks="python",
        max_entries=max(entries, 1),
    )
    counter = itertools.count()
    lock = threading.Lock()

    def dump(reason):
        with lock:
            name = f"torch-{os.getpid()}-{next(counter):04d}-{reason}.pickle"
            try:
                torch.cuda.memory._dump_snapshot(os.path.join(out_dir, name))
            except Exception as e:  # a failed dump must not stop training
                print(f"snapdiff: cannot write {name}: {e}", file=sys.stderr)

    atexit.register(dump, "exit")

    every = int(os.environ.get("SNAPDIFF_EVERY_STEPS") or 0)
    if every > 0 and hasattr(torch.optim.optimizer, "register_optimizer_step_post_hook"):
        steps = itertools.count(1)

        def after_step(optimizer, args, kwargs):
            n = next(steps)
            if n % every == 0:
                dump(f"step-{n:06d}")

        torch.optim.optimizer.register_optimizer_step_post_hook(after_step)

    interval = _interval_seconds(os.environ.get("SNAPDIFF_INTERVAL") or "")
    if interval:
        def tick():
            while True:
                threading.Event().wait(interval)
                dump("interval")

        threading.Thread(target=tick, name="snapdiff-interval", daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGUSR1)

        def on_usr1(signum, frame):
            dump("signal")
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGUSR1, on_usr1)

    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is not None:
        attach(lambda device, alloc, device_alloc, device_free: dump("oom"))


class _WhenTorchIsImported(importlib.abc.MetaPathFinder):
    """Starts recording right after `import torch`, so that scripts that
    never import it pay nothing."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_start(module):
            exec_module(module)
            try:
                _start(module)
            except Exception as e:
                _warn(f"cannot record memory history ({e})")

        loader.exec_module = exec_and_start
        return spec


def _install():
    if not os.environ.get("SNAPDIFF_DIR"):
        return
    if importlib.util.find_spec("torch") is None:
        _warn("torch is not installed")
        return
    if "torch" in sys.modules:
        _start(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _WhenTorchIsImported())


_chain_other_sitecustomize()
_install()
