"""snapdiff's pytest plugin: leak tests for a training step.

    @pytest.mark.snapdiff(max_growth="1 MiB", warmup=2, steps=10)
    def test_train_step_does_not_leak(snapdiff_steps):
        for _ in snapdiff_steps:
            train_step(model, batch)

The loop runs `warmup + steps` times, with PyTorch's memory recorded (CUDA
memory history, or the CPU recorder without a GPU) and a snapshot after each
step. When the test function returns (having run every step, or left the
loop early), `snapdiff trend` judges the snapshots after warm-up; the
test fails when the sites that keep growing kept more than `max_growth` in
all after warm-up (the limit that is `--max-growth` for the command and
`max_growth` in Rust; `max_leak`, its earlier form, is a limit per step),
with snapdiff's report (the line that holds the memory, the bytes per
step, its stack) as the failure message. `--snapdiff-dir DIR` keeps the
snapshots of failing tests in DIR, for `snapdiff report`.

`baseline="memory/test_step.json"` also checks the steps against a baseline
file (`snapdiff check`, a path relative to the test's file): the test fails
naming each site whose memory rose by more than 5% and 1 MiB. A missing
file is written, as is every test's under `--snapdiff-update-baselines`.
"""

import os
import re
import shutil
import tempfile

import pytest

from snapdiff._cli import run
from snapdiff._limits import MESSAGE_WIDTH, Limit, judge

def pytest_addoption(parser):
    parser.addoption(
        "--snapdiff-dir",
        metavar="DIR",
        help="keep the snapshots of failing snapdiff leak tests in DIR (for snapdiff report)",
    )
    parser.addoption(
        "--snapdiff-update-baselines",
        action="store_true",
        help="write the baseline files of snapdiff leak tests instead of checking them",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "snapdiff(max_growth='0 B', warmup=1, steps=5, baseline=None): a leak test; the "
        "snapdiff_steps fixture runs warmup + steps steps and fails the test when more than "
        "max_growth is kept after warm-up (max_leak: a limit per step instead), or when its "
        "memory rose over the baseline file",
    )


class Steps:
    """The steps of a leak test: iterate over it, one training step per item.
    The verdict is made when the test function returns, also when it left
    the loop early (`break`)."""

    def __init__(self, request, folder, limit, warmup, steps, baseline=None):
        self.request = request
        self.folder = folder
        self.limit = limit  # Limit: what may be kept, in all or per step
        self.warmup = warmup
        self.steps = steps
        self.baseline = baseline  # a baseline file to check against, or None
        self.report = None
        self.taken = 0
        self._loop = None

    def __iter__(self):
        if self._loop is not None:
            raise RuntimeError("snapdiff_steps is iterated once a test")
        self._loop = self._run()
        return self._loop

    def _run(self):
        from snapdiff._recording import Recording

        recording = Recording(self.folder, every=1)
        # Stacks end at the test function: its callers are pytest's.
        function = self.request.node.function
        recording.stack_root = (function.__code__.co_filename, function.__code__.co_name)
        recording.start()
        try:
            for i in range(self.warmup + self.steps):
                yield i
                # The objects are alive now: the dumps at the end of
                # warm-up and at the last step say who holds their live
                # blocks (and who gained some since), for the failure message.
                recording.dump_owners = i in (self.warmup, self.warmup + self.steps - 1)
                recording.step()
                self.taken += 1
        finally:
            recording.stop(final_dump=False)

    def finish(self):
        """Ends the loop if the test left it early, and judges the steps
        taken. Called once the test function has returned."""
        if self._loop is None or self.report is not None:
            return
        self._loop.close()
        wanted = self.warmup + self.steps
        if self.taken < self.warmup + 2:
            self.request.node._snapdiff_failed = True
            pytest.fail(
                f"snapdiff: the test left the snapdiff_steps loop after {self.taken} of "
                f"{wanted} steps; a verdict needs the {self.warmup} warm-up steps and at "
                "least 2 more",
                pytrace=False,
            )
        self.judge()

    def judge(self):
        args = ["trend", self.folder, "--warmup", str(self.warmup)]
        report = judge([self.folder], self.warmup, self.limit)
        self.report = report
        if self.limit.over(report):
            _, text, _ = run([*args, "--frames", "6", "--full-paths",
                              "--width", str(MESSAGE_WIDTH)])
            self.request.node._snapdiff_failed = True
            pytest.fail(f"snapdiff: {self.limit.says(report)}\n\n{text}", pytrace=False)
        if self.baseline is not None:
            self.check_baseline()

    def check_baseline(self):
        """Checks the steps against the baseline file, or writes it when it
        is missing or `--snapdiff-update-baselines` asks."""
        warmup = ["--warmup", str(self.warmup)]
        update = self.request.config.getoption("--snapdiff-update-baselines")
        if update or not os.path.exists(self.baseline):
            os.makedirs(os.path.dirname(self.baseline) or ".", exist_ok=True)
            run(["baseline", self.folder, "-o", self.baseline, "--force", *warmup])
            return
        code, text, _ = run(["check", self.baseline, self.folder, *warmup])
        if code == 1:
            self.request.node._snapdiff_failed = True
            pytest.fail(f"snapdiff: memory rose over the baseline\n\n{text}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Judges a leak test's steps once its function has returned, so that a
    failed verdict is the test's failure, whether or not it ran every step."""
    result = yield
    steps = getattr(item, "funcargs", {}).get("snapdiff_steps")
    if isinstance(steps, Steps):
        steps.finish()
    return result


@pytest.fixture
def snapdiff_steps(request):
    """The steps of a leak test; see the module's documentation."""
    marker = request.node.get_closest_marker("snapdiff")
    options = dict(marker.kwargs) if marker else {}
    # Options are checked before anything is made, so a bad one leaves nothing.
    limit = Limit(options)
    warmup, count = int(options.get("warmup", 1)), int(options.get("steps", 5))
    folder = tempfile.mkdtemp(prefix="snapdiff-pytest-")
    baseline = options.get("baseline")
    if baseline is not None:
        baseline = os.path.join(os.path.dirname(str(request.node.path)), os.fspath(baseline))
    steps = Steps(request, folder, limit=limit, warmup=warmup, steps=count, baseline=baseline)
    request.node._snapdiff_failed = False
    yield steps
    keep = request.config.getoption("--snapdiff-dir")
    if keep and request.node._snapdiff_failed:
        target = os.path.join(keep, re.sub(r"[^\w.-]+", "_", request.node.nodeid))
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target)
    shutil.rmtree(folder, ignore_errors=True)
