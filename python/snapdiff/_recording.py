"""`snapdiff.recording(folder, every=10)`: recording from Python, without
the command, with the dumps `snapdiff capture` would write.

It drives the capture hook's own machinery (`hook/snapdiff_capture.py`):
the same file names (`rank{R}-step{N}.pickle`, `pid{P}-...` without a
rank), the same `manifest.jsonl`, PyTorch's memory history on CUDA, and the
CPU recorder when torch sees no CUDA device. Steps are counted by
`Recording.step()`, not by an optimizer.
"""

import json
import os
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

from snapdiff._api import LiveSite, PathArg, live_sites
from snapdiff._cli import run_json


def _capture_module():
    # Imported when a recording starts, not with snapdiff: it imports torch.
    from snapdiff.hook import snapdiff_capture

    return snapdiff_capture


class _Settings:
    """What `snapdiff capture` would have put in the environment."""

    def __init__(self, folder, every, max_entries, stacks):
        self.dir = str(folder)
        self.every = int(every or 0)
        self.entries = int(max_entries)
        self.stacks = bool(stacks)
        self.interval = None
        self.requests = None
        self.stack_root = None
        self.file_names = None
        self.owners = False


class Recording:
    """A recording in progress; see `recording`."""

    def __init__(
        self,
        folder: PathArg,
        every: int = 10,
        max_entries: int = 100000,
        stacks: bool = True,
        owners: bool = False,
    ) -> None:
        import torch

        os.makedirs(folder, exist_ok=True)
        self.folder = str(folder)
        capture = _capture_module()
        self._capture = capture.Capture(
            torch, _Settings(folder, every, max_entries, stacks), deferred=False
        )
        # Each dump followed by its owners file, as `capture` does.
        self._capture.settings.owners = bool(owners)

    def start(self) -> "Recording":
        self._capture.start_recording()
        return self

    @property
    def stack_root(self) -> Optional[Tuple[str, str]]:
        """Where stacks end: `(file, function)` of the frame whose callers
        are left out (a test function's are pytest's); None: the whole stack."""
        return self._capture.settings.stack_root

    @stack_root.setter
    def stack_root(self, frame: Optional[Tuple[str, str]]) -> None:
        self._capture.settings.stack_root = frame

    @property
    def dump_owners(self) -> bool:
        """Whether each dump is followed by its owners file (what keeps its
        live tensors alive), as `capture` does; settable between
        dumps."""
        return bool(self._capture.settings.owners)

    @dump_owners.setter
    def dump_owners(self, on: bool) -> None:
        self._capture.settings.owners = bool(on)

    @property
    def file_names(self) -> Optional[Callable[[], Dict[str, str]]]:
        """What gives the names the dumps' frames' files take (a notebook's
        cells: `<ipython-input-3-...>` for `cell 3`); None: their own."""
        return self._capture.settings.file_names

    @file_names.setter
    def file_names(self, names: Optional[Callable[[], Dict[str, str]]]) -> None:
        self._capture.settings.file_names = names

    def dump_on_signals(self) -> None:
        """Dumps from a thread of its own, and on SIGUSR1 and at SIGTERM as
        `capture` does; the signals only where this is the main thread."""
        self._capture.install_dump_thread()
        try:
            self._capture.install_signals()
        except Exception:
            pass  # off the main thread: dumps still come every N steps

    def count_steps_of(self, optimizer: Any) -> Any:
        """Counts `optimizer`'s steps as training steps (a dump every
        `every`), as capture counts them; returns the hook's handle, whose
        `remove()` stops counting."""
        capture = self._capture
        return optimizer.register_optimizer_step_post_hook(capture.guarded(capture.after_step))

    @property
    def steps(self) -> int:
        """Steps counted so far."""
        return self._capture.steps

    def step(self) -> None:
        """Counts one training step; dumps when the step count is a
        multiple of `every`."""
        self._capture.steps += 1
        every = self._capture.settings.every
        if every > 0 and self._capture.steps % every == 0:
            self._capture.dump("step")

    def dump(self, reason: str = "step") -> None:
        """Dumps a snapshot now (`reason` ends up in its name unless "step")."""
        self._capture.dump(reason)

    def stop(self, final_dump: bool = True) -> None:
        """Dumps once more (`-exit`) and stops recording: the recorder, the
        dump thread and any signal handler installed for it are undone.
        Stopping again does nothing."""
        capture = self._capture
        if capture.stopped:
            return
        if final_dump:
            capture.dump("exit")
        capture.stopped = True  # CUDA's recording, if not begun, never begins
        capture.uninstall()
        capture.recording = False
        if capture.cpu is not None:
            capture.cpu.stop()
        else:
            try:
                capture.torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass

    def owners(self) -> List[LiveSite]:
        """What keeps the live tensors alive now, site by site: the sites
        holding live memory, most first, each with its owners (`held_by`,
        the owner of more blocks first), attributed by `snapdiff summary`
        as every report does (see `snapdiff.hook.snapdiff_owners`)."""
        from snapdiff.hook import snapdiff_owners

        capture = self._capture
        with tempfile.TemporaryDirectory(prefix="snapdiff-owners-") as folder:
            path = os.path.join(folder, "now.pickle")
            blocks = capture.write(path, blocks=True)
            found = snapdiff_owners.find(capture.torch, blocks)
            with open(os.path.join(folder, "now.owners.json"), "w") as f:
                json.dump(found, f)
            return live_sites(run_json("summary", [path]))

    def files(self) -> List[str]:
        """The snapshots this recording has written so far, in step order
        (not those of earlier runs into the same folder)."""
        return [os.path.join(self.folder, n) for n in self._capture.written]

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def recording(
    folder: PathArg,
    every: int = 10,
    max_entries: int = 100000,
    stacks: bool = True,
    owners: bool = False,
) -> Recording:
    """Records PyTorch's memory in `folder` while the `with` block runs::

        with snapdiff.recording("snapshots", every=10) as rec:
            for batch in loader:
                train_step(batch)
                rec.step()

    then `snapdiff trend snapshots` (or `snapdiff.trend("snapshots")`).
    Without a CUDA device, CPU tensors are recorded instead. With
    `owners=True` each dump is followed by what keeps its tensors alive,
    which `snapdiff trend` shows as "held by" (`rec.owners()` asks now).
    """
    return Recording(folder, every, max_entries, stacks, owners)
