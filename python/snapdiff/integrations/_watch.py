"""What both callbacks do: record, dump every N optimizer steps, judge, and
say the verdict; the frameworks only differ in how they call and log.

The job comes first: a fault of the watch's own (a folder it cannot make,
a verdict it cannot reach) is one warning and training goes on without
it; everything it installs (the recording, the CPU recorder, its signal
handlers and dump thread) is undone when training ends, normally or by an
exception."""

import os
import sys

from snapdiff._cli import run
from snapdiff._limits import MESSAGE_WIDTH, Limit, SnapdiffLeak, judge

# Suspects whose live bytes are logged as metrics each dump.
TOP_METRICS = 5


def warn(message):
    print(f"snapdiff: {message}", file=sys.stderr, flush=True)


class Watch:
    """A recording of one process's PyTorch memory during training, with
    dumps every `every` optimizer steps into `folder` (named and listed in
    `manifest.jsonl` as `snapdiff capture` does, one set per rank)."""

    def __init__(self, folder, every, warmup, max_growth=None, max_leak=None, owners=False):
        if every < 1:
            raise ValueError(f"every must be a positive number of steps, not {every!r}")
        self.folder = os.fspath(folder)
        self.every = every
        self.warmup = warmup
        # What the suspects may keep; checked once training ends.
        self.limit = Limit({"max_growth": max_growth, "max_leak": max_leak}, default=None)
        self.owners = owners
        self.recording = None
        self.report = None
        self.metrics = {}
        self.dumps = 0

    def start(self):
        """Starts recording, with SIGUSR1 asking for a dump and SIGTERM
        ending the job after its exit dump, as under `snapdiff capture`."""
        from snapdiff._recording import Recording

        try:
            recording = Recording(self.folder, every=self.every, owners=self.owners)
            recording.start()
        except Exception as e:
            warn(f"cannot record into {self.folder} ({type(e).__name__}: {e}); "
                 "training goes on without snapshots")
            return
        self.recording = recording
        recording.dump_on_signals()

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
        try:
            return judge(mine, self.warmup, self.limit)
        except (OSError, RuntimeError, ValueError) as e:
            warn(f"cannot judge the dumps ({e})")
            return None

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

    def stop(self):
        """Undoes everything `start` installed; safe to call again."""
        recording, self.recording = self.recording, None
        if recording is not None:
            recording.stop(final_dump=False)
        return recording

    def finish(self):
        """Stops recording and judges all the dumps; returns the text report
        (None when there were too few dumps) and the `SnapdiffLeak` to
        raise when the suspects kept more than the limit (else None)."""
        recording = self.stop()
        if recording is None:
            return None, None
        self.recording = recording  # for `judge`, which reads its files
        try:
            self.report = self.judge()
            if self.report is None:
                return None, None
            mine = recording.files()
            _, text, _ = run(["trend", "--warmup", str(self.warmup), "--width",
                              str(MESSAGE_WIDTH), "--", *mine], check=False)
        finally:
            self.recording = None
        if self.limit.over(self.report):
            return text, SnapdiffLeak(f"snapdiff: training keeps memory: "
                                      f"{self.limit.says(self.report)}\n\n{text}")
        return text, None
