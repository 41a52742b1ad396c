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
def test_the_lightning_callback_names_the_leak_and_logs_it(tmp_path, leak, capsys):
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
        with pytest.raises(SnapdiffLeak) as raised:
            trainer.fit(module, data)
        # The limit, the measured rate and the line, and the verdict said
        # once: in the error, not printed before it too.
        said = str(raised.value)
        assert "a step kept after warm-up, over the 256 B a step allowed (max_leak)" in said, said
        assert f"most by keep_activations ({__file__}:{KEEP_LINE}), 512 B a step" in said, said
        assert said.count("keeps growing") == 1, said
        assert "keeps growing" not in capsys.readouterr().out
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


@pytest.mark.parametrize("missing", [("transformers", "lightning", "pytorch_lightning"),
                                     ("pytest",)], ids=["frameworks", "pytest"])
def test_the_callbacks_import_without_their_frameworks_or_pytest(missing):
    import subprocess
    import sys

    code = (
        f"import sys; sys.modules.update(dict.fromkeys({missing!r}))\n"
        "import snapdiff\n"
        "from snapdiff.integrations import transformers as t, lightning as l\n"
        "assert t.SnapdiffLeak is l.SnapdiffLeak is snapdiff.SnapdiffLeak\n"
        "t.SnapdiffCallback(max_growth='1 MiB'); l.SnapdiffCallback(max_leak='1 KiB')\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def tiny_trainer(transformers, tmp_path, callback, steps, model_hook=None):
    """A Trainer of a two-layer GPT-2 built from a config, on random data."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    if model_hook is not None:
        model.transformer.h[0].register_forward_hook(model_hook)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 100, (512, 16))]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=2,
        logging_steps=1, report_to=[], use_cpu=not ON_CUDA, save_strategy="no",
        disable_tqdm=True,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])


def installed():
    """What of snapdiff's a training could leave behind: the dispatch mode
    (the CPU recorder), the handlers of SIGTERM and SIGUSR1 (compared with
    those before it: another test's Ray installs its own), snapdiff's threads."""
    import signal
    import threading

    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return {
        "dispatch mode": _get_current_dispatch_mode(),
        "SIGTERM": signal.getsignal(signal.SIGTERM),
        "SIGUSR1": signal.getsignal(signal.SIGUSR1),
        "threads": [t.name for t in threading.enumerate() if t.name.startswith("snapdiff")],
    }


def test_the_trainer_callback_into_an_unwritable_folder_warns_and_training_goes_on(
        tmp_path, capfd):
    transformers = need("transformers")
    from snapdiff.integrations.transformers import SnapdiffCallback

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    callback = SnapdiffCallback(blocker / "snapshots", every=1, warmup=1)
    trainer = tiny_trainer(transformers, tmp_path, callback, steps=4)
    before = installed()
    trainer.train()
    assert trainer.state.global_step == 4
    warned = [line for line in capfd.readouterr().err.splitlines() if "snapdiff:" in line]
    assert len(warned) == 1 and "training goes on without snapshots" in warned[0], warned
    assert callback.report is None
    assert installed() == before


@pytest.mark.parametrize("framework", ["transformers", "lightning"])
def test_a_training_exception_leaves_nothing_installed(tmp_path, framework):
    module = need(framework)
    calls = []
    before = installed()

    def fail_at_third_step(mod, inputs, output):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("failing on purpose")

    if framework == "transformers":
        from snapdiff.integrations.transformers import SnapdiffCallback

        callback = SnapdiffCallback(tmp_path / "snapshots", every=1)
        trainer = tiny_trainer(module, tmp_path, callback, steps=10, model_hook=fail_at_third_step)
        with pytest.raises(RuntimeError, match="failing on purpose"):
            trainer.train()
    else:
        from snapdiff.integrations.lightning import SnapdiffCallback

        class Tiny(module.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(32, 32)
                self.layer.register_forward_hook(fail_at_third_step)

            def training_step(self, batch, batch_idx):
                return self.layer(batch).square().mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        callback = SnapdiffCallback(tmp_path / "snapshots", every=1)
        trainer = module.Trainer(
            max_steps=10, accelerator="gpu" if ON_CUDA else "cpu", devices=1,
            callbacks=[callback], enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, logger=False,
        )
        with pytest.raises(RuntimeError, match="failing on purpose"):
            trainer.fit(Tiny(), torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=4))
    # The recorder, the handlers and the dump thread are gone: a later loop
    # runs as it would without snapdiff.
    assert installed() == before
    import threading

    assert not [t.name for t in threading.enumerate() if t.name.startswith("snapdiff")]


TRAINER_SCRIPT = """
import sys, time, torch, transformers
from snapdiff.integrations.transformers import SnapdiffCallback

class Slow(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)

torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100,
                                 n_positions=32, bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config)
data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 100, (512, 16))]
args = transformers.TrainingArguments(output_dir=sys.argv[2], max_steps=100000,
    per_device_train_batch_size=2, report_to=[], use_cpu=True, save_strategy="no",
    disable_tqdm=True, logging_steps=1000)
trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                               callbacks=[SnapdiffCallback(sys.argv[1], every=2), Slow()])
trainer.train()
print("training returned", flush=True)
"""


def test_the_trainer_callback_keeps_sigterm_and_serves_sigusr1(tmp_path):
    """SIGUSR1 asks for a dump now; SIGTERM takes the exit dump and ends the
    job by SIGTERM, as it would have without the callback."""
    need("transformers")
    import json
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "snapshots"
    job = subprocess.Popen(
        [sys.executable, "-c", TRAINER_SCRIPT, str(folder), str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )

    def lines():
        try:
            return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]
        except FileNotFoundError:
            return []

    def wait_for(what, within=120):
        deadline = time.monotonic() + within
        while not what():
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, lines()
            time.sleep(0.05)

    try:
        wait_for(lambda: len(lines()) >= 2)
        job.send_signal(signal.SIGUSR1)
        wait_for(lambda: any(line["reason"] == "signal" for line in lines()), within=30)
        signalled = time.monotonic()
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=30)
    finally:
        job.kill()
    took = time.monotonic() - signalled
    assert job.returncode == -signal.SIGTERM, err[-2000:]
    assert took < 3, f"ended {took:.1f} s after SIGTERM"
    assert "training returned" not in out
    assert [line["reason"] for line in lines()].count("exit") == 1
