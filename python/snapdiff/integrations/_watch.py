"""What both callbacks do: record, dump every N optimizer steps, judge, and
say the verdict; the frameworks only differ in how they call and log."""

import json
import os

from snapdiff._cli import run
from snapdiff.pytest_plugin import parse_size

# Suspects whose live bytes are logged as metrics each dump.
TOP_METRICS = 5


class Watch:
    """A recording of one process's PyTorch memory during training, with
    dumps every `every` optimizer steps into `folder` (named and listed in
    `manifest.jsonl` as `snapdiff capture` does, one set per rank)."""

    def __init__(self, folder, every, warmup, max_leak, owners):
        if every < 1:
            raise ValueError(f"every must be a positive number of steps, not {every!r}")
        self.folder = os.fspath(folder)
        self.every = every
        self.warmup = warmup
        # Bytes a step the suspects may keep; checked once training ends.
        self.max_leak = None if max_leak is None else parse_size(max_leak)
        self.owners = owners
        self.recording = None
        self.report = None
        self.metrics = {}
        self.dumps = 0

    def start(self):
        from snapdiff._recording import Recording

        self.recording = Recording(self.folder, every=self.every)
        self.recording._capture.settings.owners = self.owners
        self.recording.start()
        try:  # SIGUSR1 asks for a dump now, as under capture
            self.recording._capture.install_signals()
        except Exception:
            pass

    def step(self):
        """One optimizer step done; returns True when it dumped."""
        if self.recording is None:
            return False
        before = self.recording.steps
        self.recording.step()
        if self.recording.steps % self.every == 0 and self.recording.steps != before:
            self.dumps += 1
            self.metrics = self.judge_metrics()
            return True
        return False

    def judge(self):
        """`snapdiff trend --json` over this process's dumps so far."""
        mine = self.recording.files()
        if len(mine) < 2:
            return None
        code, out, _ = run(
            ["trend", "--warmup", str(self.warmup), "--json", "--top", "0", "--", *mine],
            check=False,
        )
        if code not in (0, 1) or not out.strip():
            return None
        report = json.loads(out)
        return None if "processes" in report else report

    def judge_metrics(self):
        """Live bytes of the top growing sites at the last dump, and their
        sum of growth, as metrics (`snapdiff/...`)."""
        report = self.judge()
        if report is None:
            return {}
        metrics = {"snapdiff/suspected_bytes": report["suspected_bytes"]}
        for s in report["suspects"][:TOP_METRICS]:
            c = s["culprit"]
            name = f"{c['name']} {os.path.basename(c['file'])}:{c['line']}"
            metrics[f"snapdiff/live_bytes/{name}"] = s["series"][-1]
        return metrics

    def finish(self):
        """Stops recording and judges all the dumps; returns the text report
        (None when there were too few dumps) and whether it is over
        `max_leak`."""
        if self.recording is None:
            return None, False
        self.recording.stop(final_dump=False)
        self.report = self.judge()
        if self.report is None:
            return None, False
        mine = self.recording.files()
        _, text, _ = run(["trend", "--warmup", str(self.warmup), "--", *mine], check=False)
        per_step = sum(
            s.get("growth_per_step") or s["growth_per_checkpoint"] for s in self.report["suspects"]
        )
        over = self.max_leak is not None and per_step > self.max_leak
        return text, over
