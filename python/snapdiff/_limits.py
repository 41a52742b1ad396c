"""What a leak check may keep, and the error raised when training keeps
more: shared by the pytest plugin and the training callbacks, and free of
both pytest and the frameworks, so that each imports without the others."""

import json
import re

from snapdiff._cli import one_trend, run

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
    `options` holds at most one of them; neither is `default` in all.

    The command judges by it: `args()` passes it through as `--max-growth`,
    and `trend --json` says its verdict (`limit`), which `over` and `says`
    read. No rule of "over" is kept here."""

    def __init__(self, options, default=0):
        given = {k: v for k, v in options.items() if k in ("max_growth", "max_leak")
                 and v is not None}
        if len(given) > 1:
            raise ValueError("give max_growth or max_leak, not both")
        self.name = "max_growth" if "max_leak" not in given else "max_leak"
        value = given.get(self.name, default)
        # `max_growth` takes the command's text ("1 MiB", "256 B/step",
        # "4 KiB/checkpoint"); `max_leak` is a size a step.
        size, per = value, ("step" if self.name == "max_leak" else "")
        if isinstance(value, str) and "/" in value and self.name == "max_growth":
            size, per = (part.strip() for part in value.split("/", 1))
        try:
            if per not in ("", "step", "checkpoint"):
                raise ValueError(f"{value!r}: a limit is in all, /step or /checkpoint")
            self.bytes = None if value is None else parse_size(size)
        except ValueError as e:
            raise ValueError(f"{self.name}={e}") from None
        self.per = per

    def args(self):
        """`--max-growth` as the command reads it (none without a limit)."""
        if self.bytes is None:
            return []
        return ["--max-growth", f"{self.bytes}/{self.per}" if self.per else str(self.bytes)]

    def over(self, report):
        """Whether `report` (`snapdiff trend --json` given `args()`) keeps
        more than allowed (never, without a limit)."""
        return bool(self.bytes is not None and report.get("limit", {}).get("over"))

    def says(self, report):
        """`8.00 KiB a step kept after warm-up, over the 256 B a step allowed
        (max_leak); most by forward (model.py:42), 6.00 KiB a step`."""
        text = f"{report['limit']['said']} ({self.name})"
        if report["suspects"]:
            top = report["suspects"][0]
            c = top["culprit"]
            where = f"{c['file']}:{c['line']}" if c.get("line") else c["file"]
            rate = top.get("growth_per_step")
            rate = (f"{size_text(rate)} a step" if rate is not None
                    else f"{size_text(top['growth_per_checkpoint'])} a checkpoint")
            text += f"; most by {c['name']} ({where}), {rate}"
        return text


def judge(paths, warmup, limit):
    """`snapdiff trend --json` of `paths` (files, or a folder) with
    `warmup`, judged against `limit` by the command: the report, its
    `limit` the verdict `Limit.over` reads. None when the files hold
    several processes (no one verdict)."""
    _, out, _ = run(["trend", "--warmup", str(warmup), "--json", "--top", "0",
                     *limit.args(), "--", *paths])
    return one_trend(json.loads(out))
