"""The callbacks for the Hugging Face Trainer and PyTorch Lightning, with
the real packages, on CUDA where torch sees it (as the callbacks record)
and else on the CPU: a tiny model built from a config (nothing
downloaded), random data, and a leak a forward hook injects. The leak's
line and its growth a step are named; the same run without it has no
suspect."""

import inspect
import os

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
KEEP_LINE = None  # the line of `kept.append(...)` below, for the assertions
kept = []


def keep_activations(module, inputs, output):
    hidden = output[0] if isinstance(output, tuple) else output
    kept.append(hidden.detach() * 1)  # THE LEAK


KEEP_LINE = inspect.getsource(keep_activations).count("\n") + keep_activations.__code__.co_firstlineno - 1


def need(module):
    if os.environ.get("SNAPDIFF_REQUIRE_RAY"):  # CI installs every framework
        return __import__(module)
    return pytest.importorskip(module)


def the_leak(report):
    """The suspect at the hook's line, or None."""
    for s in report["suspects"]:
        if s["culprit"]["file"] == __file__ and s["culprit"]["line"] == KEEP_LINE:
            return s
    return None


@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_the_trainer_callback_names_the_leak_and_its_growth(tmp_path, leak):
    transformers = need("transformers")
    from snapdiff.integrations.transformers import SnapdiffCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    kept.clear()
    if leak:
        model.transformer.h[0].register_forward_hook(keep_activations)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 100, (64, 16))]
    callback = SnapdiffCallback(tmp_path / "snapshots", every=1, warmup=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=10, per_device_train_batch_size=2,
        logging_steps=1, report_to=[], use_cpu=not ON_CUDA, save_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    found = the_leak(callback.report)
    if not leak:
        assert callback.report["suspects"] == [], callback.report["suspects"]
        return
    assert found, callback.report
    # One [2, 16, 64] float32 activation a step.
    assert found["growth_per_step"] == 2 * 16 * 64 * 4
    logged = [h for h in trainer.state.log_history if "snapdiff/suspected_bytes" in h]
    assert logged and logged[-1]["snapdiff/suspected_bytes"] > 0
    assert any(k.startswith("snapdiff/live_bytes/keep_activations") for k in logged[-1])
    names = os.listdir(tmp_path / "snapshots")
    assert "manifest.jsonl" in names and sum(n.endswith(".pickle") for n in names) == 10


@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_the_lightning_callback_names_the_leak_and_logs_it(tmp_path, leak):
    lightning = need("lightning")
    from snapdiff.integrations.lightning import SnapdiffCallback, SnapdiffLeak

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(32, 32)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    module = Tiny()
    kept.clear()
    if leak:
        module.layer.register_forward_hook(keep_activations)
    data = torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=4)
    callback = SnapdiffCallback(tmp_path / "snapshots", every=1, warmup=2, max_leak="256")
    trainer = lightning.Trainer(
        max_steps=10, accelerator="gpu" if ON_CUDA else "cpu", devices=1,
        callbacks=[callback], enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, log_every_n_steps=1,
        logger=lightning.pytorch.loggers.CSVLogger(tmp_path / "logs"),
    )
    if leak:
        with pytest.raises(SnapdiffLeak, match=r"a step kept after warm-up, over the 256 B allowed \(max_leak\)"):
            trainer.fit(module, data)
    else:
        trainer.fit(module, data)
    found = the_leak(callback.report)
    if not leak:
        assert callback.report["suspects"] == [], callback.report["suspects"]
        return
    assert found and found["growth_per_step"] == 4 * 32 * 4  # one [4, 32] float32 a step
    metrics = next((tmp_path / "logs").rglob("metrics.csv")).read_text()
    assert "snapdiff/suspected_bytes" in metrics
    assert "snapdiff/live_bytes/keep_activations" in metrics


def test_the_callbacks_import_without_their_frameworks():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['transformers'] = None; sys.modules['lightning'] = None; "
        "sys.modules['pytorch_lightning'] = None\n"
        "from snapdiff.integrations.transformers import SnapdiffCallback as A\n"
        "from snapdiff.integrations.lightning import SnapdiffCallback as B\n"
        "A(); B(); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr
