"""Stand-in for torch.cuda (see torch/__init__.py)."""
import os

from . import memory  # noqa: F401


def is_available():
    return os.environ.get("FAKE_TORCH_CUDA", "1") == "1"
