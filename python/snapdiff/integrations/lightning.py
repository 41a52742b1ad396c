"""`SnapdiffCallback` for PyTorch Lightning:

    from snapdiff.integrations.lightning import SnapdiffCallback
    trainer = lightning.Trainer(..., callbacks=[SnapdiffCallback("snapshots", every=50)])

Dumps every N optimizer steps (and on SIGUSR1), per rank, into the folder;
logs the live bytes of the top growing sites through the module's logger
(`snapdiff/...`, wherever the trainer logs: TensorBoard, W&B, CSV); at the
end of training logs the verdict (and prints it on rank 0) and, with
`max_growth` (in all after warm-up) or `max_leak` (a step), raises
`snapdiff.SnapdiffLeak` when the suspects keep more. A fault of its own
never stops training; everything it installs is undone when training ends
or raises. Imports without Lightning installed."""

from snapdiff._limits import SnapdiffLeak
from snapdiff.integrations._watch import Watch

try:
    from lightning.pytorch import Callback as _Base
except ImportError:
    try:
        from pytorch_lightning import Callback as _Base  # type: ignore[assignment]
    except ImportError:  # the class still imports; a Trainer needs Lightning
        _Base = object  # type: ignore[misc,assignment]

__all__ = ["SnapdiffCallback", "SnapdiffLeak"]


class SnapdiffCallback(_Base):
    """See the module's documentation."""

    def __init__(self, folder="snapdiff-snapshots", every=10, warmup=1, max_growth=None,
                 max_leak=None, owners=False):
        self.watch = Watch(folder, every, warmup, max_growth, max_leak, owners)
        self._steps = 0

    @property
    def report(self):
        """The final verdict (`snapdiff trend --json`), once training ended."""
        return self.watch.report

    def on_train_start(self, trainer, pl_module):
        self.watch.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # Optimizer steps, not batches (gradient accumulation steps less).
        while self._steps < trainer.global_step:
            self._steps += 1
            if self.watch.step():
                for name, value in self.watch.metrics.items():
                    pl_module.log(name, float(value), on_step=True, on_epoch=False)

    def on_exception(self, trainer, pl_module, exception):
        self.watch.stop()

    def on_train_end(self, trainer, pl_module):
        text, leak = self.watch.finish()
        if text is None:
            return
        if trainer.logger is not None:
            trainer.logger.log_metrics(
                {"snapdiff/suspected_bytes": float(self.watch.report["suspected_bytes"])},
                step=trainer.global_step,
            )
        if leak is not None:
            raise leak  # its message holds the verdict: said once
        if trainer.is_global_zero:
            print(text)
