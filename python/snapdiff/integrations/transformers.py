"""`SnapdiffCallback` for the Hugging Face `Trainer`:

    from snapdiff.integrations.transformers import SnapdiffCallback
    trainer = Trainer(..., callbacks=[SnapdiffCallback("snapshots", every=50)])

Dumps every N optimizer steps (and on SIGUSR1), per rank, into the folder;
adds the live bytes of the top growing sites to each log (`snapdiff/...`,
so they reach the loggers that run after it and the trainer state's
`log_history`); at the end of training prints the verdict on rank 0 and,
with `max_growth` (in all after warm-up) or `max_leak` (a step), raises
`snapdiff.SnapdiffLeak` when the suspects keep more. A fault of its own
never stops training; everything it installs is undone when training ends
or a training step raises. Imports without transformers installed."""

import sys
import weakref

from snapdiff._limits import SnapdiffLeak
from snapdiff.integrations._watch import Watch

try:
    from transformers import TrainerCallback as _Base
except ImportError:  # the class still imports; Trainer needs transformers
    _Base = object  # type: ignore[misc,assignment]

__all__ = ["SnapdiffCallback", "SnapdiffLeak"]


class SnapdiffCallback(_Base):
    """See the module's documentation."""

    def __init__(self, folder="snapdiff-snapshots", every=10, warmup=1, max_growth=None,
                 max_leak=None, owners=False):
        self.watch = Watch(folder, every, warmup, max_growth, max_leak, owners)
        self._trainer = None  # a weak reference, while its step is wrapped

    @property
    def report(self):
        """The final verdict (`snapdiff trend --json`), once training ended."""
        return self.watch.report

    def on_train_begin(self, args, state, control, **kwargs):
        self.watch.start()
        if self.watch.recording is not None:
            self._stop_with_the_step()

    def _stop_with_the_step(self):
        """The Trainer tells its callbacks nothing when training raises, so
        its `training_step` (where out-of-memory and most errors happen) is
        wrapped: when it raises, the watch is undone before the error goes
        on. The trainer is the `self` of `Trainer.train` up the stack; that
        frame's locals are read once, before its loop begins (reading them
        stores a copy on the frame, which holds nothing the frame does not)."""
        frame = sys._getframe(1)
        while frame is not None and not (
            frame.f_code.co_name == "train"
            and frame.f_globals.get("__name__", "").startswith("transformers.")
        ):
            frame = frame.f_back
        trainer = frame.f_locals.get("self") if frame is not None else None
        del frame
        step = getattr(trainer, "training_step", None)
        if step is None:
            return
        def training_step(*args, **kwargs):
            try:
                return step(*args, **kwargs)
            except BaseException:
                self._unwrap_the_step()
                self.watch.stop()
                raise

        trainer.training_step = training_step
        self._trainer = weakref.ref(trainer)

    def _unwrap_the_step(self):
        trainer = self._trainer() if self._trainer is not None else None
        self._trainer = None
        if trainer is not None:
            trainer.__dict__.pop("training_step", None)

    def on_step_end(self, args, state, control, **kwargs):
        if self.watch.step():
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.watch.metrics and logs is not None:
            logs.update(self.watch.metrics)
            if state.log_history:
                state.log_history[-1].update(self.watch.metrics)

    def on_train_end(self, args, state, control, **kwargs):
        self._unwrap_the_step()
        text, leak = self.watch.finish()
        if text is None:
            return
        if leak is not None:
            raise leak  # its message holds the verdict: said once
        if state.is_world_process_zero:
            print(text)

    def __getattr__(self, name):
        # Without transformers installed, every other event is a no-op.
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)
