"""What a leak check may keep, and the error raised when training keeps
more: shared by the pytest plugin and the training callbacks, and free of
both pytest and the frameworks, so that each imports without the others."""

import re

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4,
          "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
          "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}


# The columns the verdict's tables fit in where messages are read: test
# runners and logs, where no terminal says its width.
MESSAGE_WIDTH = 100


class SnapdiffLeak(RuntimeError):
    """Training kept more memory than its limit (`max_growth` in all after
    warm-up, or `max_leak` a step) allows."""


def parse_size(text):
    """`"1 MiB"`, `"512KiB"`, `4096` -> bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"{text!r}: expected a size such as '1 MiB' or 4096")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def size_text(n):
    """Bytes as `512 B`, `1.50 KiB`, `3.00 MiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


class Limit:
    """What may be kept: `max_growth` bytes in all after warm-up (the
    limit `--max-growth` is for the command), or `max_leak` bytes a step.
    `options` holds at most one of them; neither is `default` in all."""

    def __init__(self, options, default=0):
        given = {k: v for k, v in options.items() if k in ("max_growth", "max_leak")
                 and v is not None}
        if len(given) > 1:
            raise ValueError("give max_growth or max_leak, not both")
        self.in_all = "max_leak" not in given
        self.name = "max_growth" if self.in_all else "max_leak"
        value = given.get(self.name, default)
        try:
            self.bytes = None if value is None else parse_size(value)
        except ValueError as e:
            raise ValueError(f"{self.name}={e}") from None

    def kept(self, report):
        """What the verdict `report` (`snapdiff trend --json`) says the
        suspects kept, as this limit counts it: in all, or a step."""
        if self.in_all:
            return report["suspected_bytes"]
        return sum(s.get("growth_per_step") or s["growth_per_checkpoint"]
                   for s in report["suspects"])

    def over(self, report):
        """Whether `report` keeps more than allowed (never, without a limit)."""
        return self.bytes is not None and self.kept(report) > self.bytes

    def says(self, report):
        """`8.00 KiB a step kept after warm-up, over the 256 B allowed
        (max_leak); most by forward (model.py:42), 6.00 KiB a step`."""
        said = "kept after warm-up" if self.in_all else "a step kept after warm-up"
        text = (f"{size_text(self.kept(report))} {said}, over the "
                f"{size_text(self.bytes)} allowed ({self.name})")
        if report["suspects"]:
            top = report["suspects"][0]
            c = top["culprit"]
            where = f"{c['file']}:{c['line']}" if c.get("line") else c["file"]
            rate = top.get("growth_per_step")
            rate = (f"{size_text(rate)} a step" if rate is not None
                    else f"{size_text(top['growth_per_checkpoint'])} a checkpoint")
            text += f"; most by {c['name']} ({where}), {rate}"
        return text
