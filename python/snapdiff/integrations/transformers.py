"""`SnapdiffCallback` for the Hugging Face `Trainer`:

    from snapdiff.integrations.transformers import SnapdiffCallback
    trainer = Trainer(..., callbacks=[SnapdiffCallback("snapshots", every=50)])

Dumps every N optimizer steps (and on SIGUSR1), per rank, into the folder;
adds the live bytes of the top growing sites to each log (`snapdiff/...`,
so they reach the loggers that run after it and the trainer state's
`log_history`); at the end of training logs the verdict (and prints it on
rank 0) and, with `max_leak`, raises when the suspects keep more a step.
Imports without transformers installed."""

from snapdiff.integrations._watch import Watch

try:
    from transformers import TrainerCallback as _Base
except ImportError:  # the class still imports; Trainer needs transformers
    _Base = object


class SnapdiffLeak(RuntimeError):
    """Training kept more memory a step than `max_leak` allows."""


class SnapdiffCallback(_Base):
    """See the module's documentation."""

    def __init__(self, folder="snapdiff-snapshots", every=10, warmup=1, max_leak=None, owners=False):
        self.watch = Watch(folder, every, warmup, max_leak, owners)

    @property
    def report(self):
        """The final verdict (`snapdiff trend --json`), once training ended."""
        return self.watch.report

    def on_train_begin(self, args, state, control, **kwargs):
        self.watch.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.watch.step():
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.watch.metrics and logs is not None:
            logs.update(self.watch.metrics)
            if state.log_history:
                state.log_history[-1].update(self.watch.metrics)

    def on_train_end(self, args, state, control, **kwargs):
        text, over = self.watch.finish()
        if text is None:
            return
        from transformers.utils import logging

        logging.get_logger("snapdiff").warning("snapdiff: %s", text)
        if state.is_world_process_zero:
            print(text)
        if over:
            raise SnapdiffLeak(f"snapdiff: training keeps memory a step, over max_leak\n\n{text}")

    def __getattr__(self, name):
        # Without transformers installed, every other event is a no-op.
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)
