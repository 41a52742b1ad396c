# Put on PYTHONPATH by `snapdiff capture`, for that run only. Starts
# snapdiff_capture (beside this file) once the program imports torch, so that
# programs that never do pay nothing. Any other sitecustomize on the path
# still runs first. Nothing here may raise into the program.
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


def _chain_other_sitecustomize():
    """Runs the program's own sitecustomize, if any, as Python would have,
    and leaves it as `sitecustomize` in sys.modules, so that
    `import sitecustomize` finds the user's module, not this hook."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


def _start(torch):
    try:
        import snapdiff_capture

        snapdiff_capture.start(torch)
    except Exception as e:
        print(
            f"snapdiff: cannot start capture ({type(e).__name__}: {e}); "
            "the script runs without capture",
            file=sys.stderr,
        )


class _WhenTorchIsImported(importlib.abc.MetaPathFinder):
    """Calls `_start` right after `import torch` has finished."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_start(module):
            exec_module(module)
            _start(module)

        spec.loader.exec_module = exec_and_start
        return spec


def _write_status():
    """At exit, one line for `snapdiff capture` on what this process's
    capture came to (it says why, when nothing was dumped)."""
    path = os.environ.get("SNAPDIFF_STATUS")
    if not path:
        return
    try:
        import json

        capture = sys.modules.get("snapdiff_capture")
        if capture is not None:
            line = capture.status()
        else:
            line = {"pid": os.getpid(), "torch": "torch" in sys.modules}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    except Exception:
        pass


def _install():
    if not os.environ.get("SNAPDIFF_DIR"):
        return
    import atexit

    atexit.register(_write_status)
    if "torch" in sys.modules:
        _start(sys.modules["torch"])
    elif importlib.util.find_spec("torch") is None:
        print("snapdiff: torch is not installed; the script runs without capture", file=sys.stderr)
    else:
        sys.meta_path.insert(0, _WhenTorchIsImported())


try:
    _chain_other_sitecustomize()
finally:
    try:
        _install()
    except Exception as e:
        print(f"snapdiff: cannot start capture ({e}); the script runs without capture", file=sys.stderr)
