"""Callbacks for training loops users did not write: the Hugging Face
`Trainer` (`snapdiff.integrations.transformers.SnapdiffCallback`) and
PyTorch Lightning (`snapdiff.integrations.lightning.SnapdiffCallback`).
Each module imports without its framework installed."""
