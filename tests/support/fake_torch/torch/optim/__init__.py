"""Stand-in for torch.optim (see torch/__init__.py)."""
from . import optimizer  # noqa: F401
from .optimizer import SGD  # noqa: F401
