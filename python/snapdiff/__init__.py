"""snapdiff finds GPU memory leaks in training jobs: the line of code whose
memory keeps growing, step after step.

This package comes with the `snapdiff` command (`python -m snapdiff` runs
it too) and gives Python:

- `compare(before, after)`, `trend(files)`, `peak(file)`: the command's
  reports as dataclasses (sites with their culprit line, bytes, blocks and
  series);
- `fleet(paths, engine=None)`: one verdict for a job of many ranks, read
  here or, with `engine="ray"`, by Ray tasks where the files are;
- `recording(folder, every=10)`: PyTorch's memory history on, with dumps
  every N steps named as `snapdiff capture` names them (the CPU recorder
  when there is no GPU), and `Recording.owners()`: each site's live memory
  now and what keeps it alive (`LiveSite`);
- `snapdiff.integrations.transformers.SnapdiffCallback` and
  `snapdiff.integrations.lightning.SnapdiffCallback` for loops a framework
  runs;
- in notebooks, results shown as the offline report, and `%load_ext
  snapdiff` for the `%%snapdiff` cell magic;
- `SnapdiffLeak`, what the callbacks raise when training keeps more than
  their `max_growth` (or `max_leak` a step);
- a pytest plugin: `@pytest.mark.snapdiff(max_growth="1 MiB", warmup=2,
  steps=10)` and the `snapdiff_steps` fixture fail a test whose steps keep
  memory.
"""

from snapdiff._api import (
    Comparison,
    Culprit,
    DevicePeak,
    Group,
    LiveSite,
    Peak,
    Site,
    Suspect,
    Trend,
    compare,
    peak,
    trend,
)
from snapdiff._fleet import Fleet, FleetLeak, Imbalance, OutsideGrowth, RankVerdict, fleet
from snapdiff._limits import SnapdiffLeak
from snapdiff._recording import Recording, recording


def load_ipython_extension(ipython):
    """`%load_ext snapdiff`: the `%%snapdiff` cell magic and `%snapdiff
    report FILE...` (see `snapdiff._notebook`)."""
    from snapdiff._notebook import load

    load(ipython)


__all__ = [
    "Comparison",
    "Culprit",
    "DevicePeak",
    "Fleet",
    "FleetLeak",
    "Group",
    "Imbalance",
    "LiveSite",
    "OutsideGrowth",
    "Peak",
    "RankVerdict",
    "Recording",
    "Site",
    "SnapdiffLeak",
    "Suspect",
    "Trend",
    "compare",
    "fleet",
    "peak",
    "recording",
    "trend",
]
