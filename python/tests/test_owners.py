""""Held by": what keeps leaked memory alive, found in the process that
holds it, on real PyTorch (CPU tensors, through the CPU recorder). Each
kind of owner is a leak of its own: through the pytest plugin's failure
message, and through `snapdiff capture --owners` and `trend --json`. The
same code without the leak names no owner."""

import gc
import json
import os
import re
import subprocess
import sys
import weakref

import pytest

import snapdiff
from snapdiff._cli import binary, one_trend

# Each case: (name, module-level setup, one step's code with the leak,
# the same step without it, a pattern the first owner must match).
CASES = [
    (
        "retained_graph",
        "",
        "total = total + model(batch).square().mean()  # eval without no_grad",
        "total = total + model(batch).square().mean().item()",
        r"^the autograd graph of .*: total$",
    ),
    (
        "module_list",
        "history = []",
        "history.append(model(batch).detach() * 1)",
        "history[:] = [model(batch).detach() * 1]",
        r"^{mod}\.history \(a list\)$",
    ),
    (
        "metrics_dict",
        "metrics = {}",
        "metrics[f'loss{step}'] = model(batch).detach() * 1",
        "metrics['loss'] = model(batch).detach() * 1",
        r"^{mod}\.metrics \(a dict\)$",
    ),
    (
        "hook_closure",
        "def make_hook(keep):\n    acts = []\n    def hook(mod, inp, out):\n"
        "        acts.append(out.detach() * 1)  # LEAK hook_closure\n"
        "        if not keep:\n            acts.clear()\n    return hook\n"
        "model.register_forward_hook(make_hook(LEAK))",
        "model(batch)",
        "model(batch)",
        r"closure `acts` \(a list\)$",
    ),
    (
        "lru_cache",
        "import functools\n@functools.lru_cache(maxsize=None)\ndef features(n):\n    return torch.ones(2048) * n  # LEAK lru_cache",
        "features(step)",
        "features(step % 2)",
        r"features \(lru_cache\)",
    ),
    (
        "reassigned_attribute",
        "class State:\n    def __init__(self):\n        self.last = None\n        self.previous = []\nstate = State()",
        "state.previous.append(state.last); state.last = model(batch).detach() * 1",
        "state.last = model(batch).detach() * 1",
        r"^{mod}\.state\.previous \(a list\)$",
    ),
    (
        "optimizer_params",
        "",
        "optimizer.add_param_group({'params': [torch.nn.Parameter(torch.ones(2048))]})",
        "model(batch)",
        r"^{mod}\.optimizer\.param_groups",
    ),
    (
        "reference_cycle",
        "import gc\ngc.disable()",
        "cycle = [torch.ones(2048)]; cycle.append(cycle); del cycle",
        "cycle = [torch.ones(2048)]; del cycle",
        r"^a reference cycle: gc would free it$",
    ),
    # Realistic shapes, behind a heap of a few hundred thousand objects.
    (
        "attention_store",
        "class AttentionStore:\n    def __init__(self):\n"
        "        self.step_store = {'down_cross': [], 'up_cross': []}\n"
        "    def __call__(self, attn, place):\n        self.step_store[place].append(attn)\n"
        "class Evaluation:\n    def __init__(self):\n        self.controller = AttentionStore()\n"
        "attention_store_eval = Evaluation()",
        "attention_store_eval.controller(model(batch).detach() * 1, 'down_cross')",
        "attention_store_eval.controller(model(batch).detach() * 1, 'down_cross'); "
        "attention_store_eval.controller.step_store['down_cross'].clear()",
        r"^{mod}\.attention_store_eval\.controller\.step_store\['down_cross'\] \(a list\)$",
    ),
    (
        "hooks_never_removed",
        "class Recorder:\n    def __call__(self, module, inputs, output):\n"
        "        self.output = output.detach() * 1  # LEAK hooks_never_removed",
        "model[2].register_forward_hook(Recorder()); model(batch)",
        "handle = model[2].register_forward_hook(Recorder()); model(batch); handle.remove()",
        r"^{mod}\.model\[2\]\._forward_hooks \(a dict\)$",
    ),
    (
        "metric_never_reset",
        "class Metric:\n    def __init__(self):\n        self.preds = []\n"
        "    def update(self, p):\n        self.preds.append(p)\n"
        "    def reset(self):\n        self.preds = []\n"
        "class Metrics:\n    def __init__(self):\n        self.metrics = {'val_auroc': Metric()}\n"
        "val_metrics = Metrics()",
        "val_metrics.metrics['val_auroc'].update(model(batch).detach().softmax(-1))",
        "val_metrics.metrics['val_auroc'].update(model(batch).detach().softmax(-1)); "
        "val_metrics.metrics['val_auroc'].reset()",
        r"^{mod}\.val_metrics\.metrics\['val_auroc'\]\.preds \(a list\)$",
    ),
    # Inside torch modules, named as users write them.
    (
        "submodule_metric",
        "class Auroc(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.preds = []\n"
        "class Classifier(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.head = torch.nn.Linear(8, 2)\n        self.val_auroc = Auroc()\n"
        "classifier = Classifier()",
        "classifier.val_auroc.preds.append(model(batch).detach() * 1)",
        "classifier.val_auroc.preds[:] = [model(batch).detach() * 1]",
        r"^{mod}\.classifier\.val_auroc\.preds \(a list\)$",
    ),
    (
        "layer_cache",
        "class Attention(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.cache = []\n"
        "class Decoder(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.layers = torch.nn.ModuleList([torch.nn.Identity() for _ in range(3)])\n"
        "        self.layers.append(torch.nn.Sequential(torch.nn.Identity()))\n"
        "        self.layers[3].attn = Attention()\n"
        "decoder = Decoder()",
        "decoder.layers[3].attn.cache.append(model(batch).detach() * 1)",
        "decoder.layers[3].attn.cache[:] = [model(batch).detach() * 1]",
        r"^{mod}\.decoder\.layers\[3\]\.attn\.cache \(a list\)$",
    ),
    (
        "server_results",
        "records = [{'id': i, 'tags': [i, str(i)]} for i in range(200_000)]\n"
        "class Server:\n    def __init__(self):\n        self.dataset = records\n"
        "        self.results = {}\n"
        "server = Server()",
        "server.results[f'req{step}'] = model(batch).detach() * 1",
        "server.results.clear(); server.results['req'] = model(batch).detach() * 1",
        r"^{mod}\.server\.results \(a dict\)$",
    ),
]

HEADER = """
import pytest
import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batch = torch.randn(32, 64)
"""


def module(case, leak):
    name, setup, leaking, clean, _ = case
    step = leaking if leak else clean
    return HEADER + f"LEAK = {leak}\n" + setup + f"""

@pytest.mark.snapdiff(max_growth="1 KiB", warmup=1, steps=5)
def test_{name}(snapdiff_steps):
    total = 0
    for step in snapdiff_steps:
        {step}
"""


@pytest.fixture
def loaded():
    """A CPU hog beside the test: owners are found at the default budget
    on a busy machine too."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    hog.kill()
    hog.wait()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_plugin_names_the_owner_first_and_nothing_without_the_leak(pytester, case, loaded):
    name, _, _, _, pattern = case
    pytester.makepyfile(**{f"test_{name}_leaks": module(case, True)})
    pytester.makepyfile(**{f"test_{name}_clean": module(case, False)})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    out = result.stdout.str()
    result.assert_outcomes(failed=1, passed=1)
    held = re.search(
        r"held by \(what kept them alive[^\n]*\n +1  (.*?): (\d+) blocks?, ([\d.]+ \w+)", out)
    assert held, out
    expected = pattern.format(mod=re.escape(f"test_{name}_leaks"))
    assert re.search(expected, held.group(1)), f"{held.group(1)!r} !~ {expected!r}\n{out}"
    # It holds all the line's blocks at the last checkpoint, exactly.
    blocks = re.search(r"\n +blocks( +\d+)+\n", out).group(1).split()[-1]
    live = re.search(r"\n +live( +[\d.]+ \w+)+\n", out).group(0).split()[-2:]
    if name == "reassigned_attribute":  # `state.last` holds the last one
        assert held.group(2) == str(int(blocks) - 1), out
    elif name not in ("retained_graph", "hook_closure"):
        assert (held.group(2), held.group(3)) == (blocks, " ".join(live)), out
    assert f"FAILED test_{name}_leaks.py::test_{name}" in out, out


SCRIPT = HEADER.replace("import pytest\n", "") + "LEAK = True\n" + "\n".join(c[1] for c in CASES) + """

def train(steps):
    total = 0
    for step in range(steps):
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
""" + "".join(f"        {c[2]}  # LEAK {c[0]}\n" for c in CASES) + """
train(8)
"""


def test_capture_owners_and_trend_name_each_leaks_owner(tmp_path, loaded):
    """Capture finds owners by default: no flag asks for them."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    dumps = tmp_path / "dumps"
    subprocess.run(
        [binary(), "capture", "--no-report", "-o", dumps, "--every", "1", "--",
         sys.executable, script],
        check=True, capture_output=True,
    )
    entries = [json.loads(l) for l in (dumps / "manifest.jsonl").read_text().splitlines()]
    assert all(e["owners"] == e["file"].replace(".pickle", ".owners.json") for e in entries)
    report = one_trend(json.loads(subprocess.run(
        [binary(), "trend", dumps, "--json", "--top", "0"], check=True, capture_output=True, text=True,
    ).stdout))
    lines = script.read_text().splitlines()
    owners = {}
    for s in report["suspects"]:
        m = re.search(r"# LEAK (\w+)", lines[s["culprit"]["line"] - 1])
        if m and s.get("held_by"):
            first = s["held_by"][0]
            container = f" (a {first['container']})" if first.get("container") else ""
            owners[m.group(1)] = first["owner"] + container
    for name, _, _, _, pattern in CASES:
        assert name in owners, f"{name}: no suspect with an owner in {owners}\n{report}"
        assert re.search(pattern.format(mod="train"), owners[name]), (name, owners[name])
    # compare says it too, for the sites that grew between two dumps.
    step = lambda p: int(re.search(r"-step(\d+)", p.name).group(1))
    dumped = sorted((p for p in dumps.glob("*.pickle") if "exit" not in p.name), key=step)
    cmp = json.loads(subprocess.run(
        [binary(), "compare", dumped[1], dumped[-1], "--json", "--top", "0"],
        check=True, capture_output=True, text=True,
    ).stdout)
    held = [h["owner"] for g in cmp["groups"] for h in g.get("held_by", [])]
    assert "train.history" in held and "train.metrics" in held, held
    # And fleet, which keeps each dump's owners by site.
    fleet = json.loads(subprocess.run(
        [binary(), "fleet", dumps, "--json", "--top", "0"], check=True, capture_output=True, text=True,
    ).stdout)
    held = {h["owner"] for leak in fleet["leaks"] for h in leak.get("held_by", [])}
    assert {"train.history", "train.metrics"} <= held, held
    text = subprocess.run([binary(), "fleet", dumps], check=True, capture_output=True, text=True).stdout
    # (Eight lines are shown; which of the 1 KiB ones depends on the run.)
    assert re.search(r"held by train\.[\w.']+ \(a (list|dict)\), \+1 block a step", text), text


def test_a_graph_whose_backward_ran_keeps_no_tensor(pytester):
    """`total_loss += loss` after `loss.backward()`: backward frees the
    saved tensors; the graph keeps only its nodes (host objects), so no
    device memory grows and the test passes."""
    pytester.makepyfile(test_backward=HEADER + """
@pytest.mark.snapdiff(max_growth="1 KiB", warmup=1, steps=5)
def test_backward_each_step(snapdiff_steps):
    total_loss = 0
    for _ in snapdiff_steps:
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss
""")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_search_keeps_nothing_alive_and_restores_the_collector():
    torch = pytest.importorskip("torch")
    from snapdiff.hook import snapdiff_owners

    held = [torch.ones(1024)]
    ref = weakref.ref(held[0])
    block = (held[0].untyped_storage().data_ptr(), 4096)
    gc.enable()
    found = snapdiff_owners.find(torch, [block])
    assert gc.isenabled()
    assert found["complete"]
    [owner] = found["blocks"].values()
    assert owner["owner"].endswith(": held[0]"), owner
    held.clear()
    assert ref() is None, "the search kept the tensor alive"
    gc.disable()
    snapdiff_owners.find(torch, [block])
    assert not gc.isenabled()
    gc.enable()


def test_the_search_stops_at_its_budget_and_says_so():
    torch = pytest.importorskip("torch")
    from snapdiff.hook import snapdiff_owners

    cycle = [torch.ones(16)]
    cycle.append(cycle)
    block = (cycle[0].untyped_storage().data_ptr(), 64)
    del cycle
    found = snapdiff_owners.find(torch, [block], seconds=1e-6)
    assert found["complete"] is False and found["blocks"] == {}
    gc.collect()


class _NoRepr:
    def __repr__(self):
        raise RuntimeError("a key whose repr raises")

    @property
    def shape(self):
        raise RuntimeError("and whose shape raises")


def test_dict_keys_are_named_without_their_repr():
    """An optimizer's state is keyed by parameters (whose repr formats
    their values), and a user's key may have a repr that raises: paths
    name such keys by type and shape, and the search goes on."""
    torch = pytest.importorskip("torch")
    from snapdiff.hook import snapdiff_owners

    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    odd = {_NoRepr(): torch.ones(100)}
    state = optimizer.state[model.weight]["exp_avg"]
    blocks = [
        (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        for t in (state, *odd.values())
    ]
    del state
    found = snapdiff_owners.find(torch, blocks)
    owners = sorted(o["owner"] for o in found["blocks"].values())
    assert len(owners) == 2, found
    assert any(o.endswith("optimizer.state[<Parameter 32x64>]['exp_avg']") for o in owners), owners
    assert any(o.endswith("odd[<_NoRepr>]") for o in owners), owners


def test_a_recording_with_owners_says_held_by_in_trend_and_its_report(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(64, 64)
    batch = torch.randn(16, 64)
    history = []
    with snapdiff.recording(tmp_path / "rec", every=1, owners=True) as rec:
        for _ in range(6):
            history.append(model(batch).detach() * 1)
            rec.step()
        now = rec.owners()
    # The site appending to `history` is held by it, as `summary` says.
    [kept] = [s for s in now if s.held_by and s.held_by[0]["owner"].endswith(": history")]
    assert kept.held_by[0]["blocks"] >= 6, now
    assert kept.culprit.file.endswith("test_owners.py"), kept
    report = one_trend(json.loads(subprocess.run(
        [binary(), "trend", tmp_path / "rec", "--json"], check=True, capture_output=True, text=True,
    ).stdout))
    [suspect] = report["suspects"]
    assert suspect["held_by"][0]["owner"].endswith(": history")
    assert suspect["held_by"][0]["blocks_per_step"] == 1
    page = tmp_path / "report.html"
    subprocess.run([binary(), "report", tmp_path / "rec", "-o", page], check=True)
    # The page, opened in a real browser, says it.
    import shutil
    browser = shutil.which("chromium")
    if browser is None:
        if os.environ.get("SNAPDIFF_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is missing")
        pytest.skip("apt-get install chromium")
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", f"file://{page}"],
        check=True, capture_output=True, text=True,
    ).stdout
    assert re.search(r'<li class="held-by">1: held by .*: history \(a list\): \d+ blocks', dom), dom[-3000:]


def _blocks(*tensors):
    return [(t.untyped_storage().data_ptr(), max(1, t.untyped_storage().nbytes())) for t in tensors]


def test_a_local_the_function_deletes_is_not_kept_by_the_search():
    """`frame.f_locals` would store a dict of the frame's locals on the
    frame (Python 3.11, 3.12), keeping a batch the loop deletes alive."""
    torch = pytest.importorskip("torch")
    from snapdiff.hook import snapdiff_owners

    def step():
        batch = torch.ones(1 << 16)
        ref = weakref.ref(batch)
        found = snapdiff_owners.find(torch, _blocks(batch))
        [owner] = found["blocks"].values()
        assert owner["owner"].startswith("step (test_owners.py:") and owner["owner"].endswith(": batch")
        del batch
        assert ref() is None, "the search kept the deleted local alive"

    step()


def test_a_step_the_search_saw_keeps_nothing_once_it_returns():
    """The search's own frames once held a list of every running frame
    (theirs included): a reference cycle that kept each step's frame, and
    its 8 MiB batch, alive after the step returned, until the collector
    ran; those batches were then named "a reference cycle"."""
    torch = pytest.importorskip("torch")
    from snapdiff.hook import snapdiff_owners

    def step(refs):
        batch = torch.ones(2 << 20)  # 8 MiB
        found = snapdiff_owners.find(torch, _blocks(batch))
        [owner] = found["blocks"].values()
        assert owner["owner"].endswith(": batch"), owner
        refs.append(weakref.ref(batch))

    refs = []
    enabled = gc.isenabled()
    gc.disable()  # as between two of the collector's runs
    try:
        for _ in range(4):
            step(refs)
        assert [r() is None for r in refs] == [True] * 4, "a returned step's batch is alive"
    finally:
        if enabled:
            gc.enable()


def test_a_tensor_held_in_a_numpy_object_array_is_held_path_unknown_not_cpp():
    """A numpy array of objects hides what it holds from the collector:
    the search cannot find the path, and must not say C++ code holds it."""
    torch = pytest.importorskip("torch")
    numpy = pytest.importorskip("numpy")
    from snapdiff.hook import snapdiff_owners

    held = numpy.empty(1, dtype=object)
    held[0] = torch.ones(1 << 12)
    found = snapdiff_owners.find(torch, _blocks(held[0]))
    [owner] = found["blocks"].values()
    assert owner["owner"].startswith("held, path unknown"), owner
    assert "C++ code (no Python object" not in owner["owner"]


class _Calls:
    """Counts the job's code the search runs: it must run none."""

    count = 0


class _LyingClass:
    @property
    def __class__(self):
        _Calls.count += 1
        raise RuntimeError("__class__ raises")

    def __init__(self, tensor):
        self.tensor = tensor


class _SlottedGetattr:
    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def __getattr__(self, name):
        _Calls.count += 1
        raise KeyError(name)

    def __getattribute__(self, name):
        _Calls.count += 1
        return object.__getattribute__(self, name)


class _NoIter(list):
    def __iter__(self):
        _Calls.count += 1
        raise RuntimeError("__iter__ raises")

    def __eq__(self, other):
        _Calls.count += 1
        raise RuntimeError("__eq__ raises")

    __hash__ = None


class _Key:
    def __hash__(self):
        return 7

    def __eq__(self, other):
        _Calls.count += 1 if other is not self else 0
        return other is self

    def __repr__(self):
        _Calls.count += 1
        raise RuntimeError("repr raises")

    @property
    def shape(self):
        _Calls.count += 1
        raise RuntimeError("shape raises")


class _Finalized:
    def __init__(self, tensor):
        self.tensor = tensor

    def __del__(self):
        _Calls.count += 1


def _strict_subclass(torch):
    class Strict(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            _Calls.count += 1
            import time
            time.sleep(1)
            raise RuntimeError("no torch function here")

    return Strict


def test_hostile_objects_are_never_run_and_never_end_the_search():
    """Objects whose attributes, iteration, comparison or torch functions
    raise (or sleep), a proxy, a list nested 100,000 deep, a list of ten
    million ints and a dict another thread grows: no code of theirs runs,
    and every block still gets its owner."""
    torch = pytest.importorskip("torch")
    import threading

    from snapdiff.hook import snapdiff_owners

    Strict = _strict_subclass(torch)
    plain = torch.ones(64)
    strict = torch.ones(64).as_subclass(Strict)
    deep = [torch.ones(64)]
    for _ in range(100_000):
        deep = [deep]
    global _HOSTILE
    _HOSTILE = {
        "lying": _LyingClass(torch.ones(64)),
        "slotted": _SlottedGetattr(torch.ones(64)),
        "noiter": _NoIter([torch.ones(64)]),
        "keyed": {_Key(): torch.ones(64)},
        "finalized": _Finalized(torch.ones(64)),
        "strict": strict,
        "proxy": weakref.proxy(plain),
        "deep": deep,
        "ints": list(range(10_000_000)),
        "plain": plain,
    }
    growing = {}
    stop = threading.Event()

    def grow():  # without bound in time, within 100,000 entries
        i = 0
        while not stop.is_set():
            growing[i] = i
            i += 1
            if i == 100_000:
                growing.clear()
                i = 0

    grower = threading.Thread(target=grow)
    grower.start()
    _HOSTILE["growing"] = growing
    tensors = [
        _HOSTILE["lying"].tensor,
        object.__getattribute__(_HOSTILE["slotted"], "tensor"),
        list.__getitem__(_HOSTILE["noiter"], 0),
        *_HOSTILE["keyed"].values(),
        _HOSTILE["finalized"].tensor,
        plain,
    ]
    inner = deep
    while isinstance(inner[0], list):
        inner = inner[0]
    tensors.append(inner[0])
    blocks = _blocks(*tensors)
    with torch._C.DisableTorchFunctionSubclass():
        blocks += _blocks(strict)
    del tensors, inner, deep, plain, strict  # named through _HOSTILE only
    before = _Calls.count
    try:
        found = snapdiff_owners.find(torch, blocks, seconds=30)
    finally:
        stop.set()
        grower.join()
    assert _Calls.count == before, "the search ran the job's code"
    assert found["complete"], found
    owners = sorted(o["owner"] for o in found["blocks"].values())
    assert len(owners) == len(blocks), owners
    prefix = "test_owners._HOSTILE"
    for expected in (
        f"{prefix}['lying'].tensor",
        f"{prefix}['slotted'].tensor",
        f"{prefix}['noiter'][0]",
        f"{prefix}['keyed'][<_Key>]",
        f"{prefix}['finalized'].tensor",
        f"{prefix}['strict']",
        f"{prefix}['plain']",
    ):
        assert any(o == expected or o.endswith(expected.split("_HOSTILE")[1]) for o in owners), (
            expected, owners)
    assert any("[0][0][0]" in o and "..." in o for o in owners), owners  # the deep list, cut
    del _HOSTILE


_HOSTILE = None


@pytest.mark.parametrize("kinds", [
    ("a global list", "a local list"),
    ("a dict", "a closure"),
    ("a bound method", "an attribute"),
    ("an lru_cache", "a global list"),
])
def test_of_two_owners_the_one_holding_more_blocks_comes_first(tmp_path, kinds):
    """`Recording.owners()` gives each site's owners, the owner of more
    blocks first, with exact blocks and bytes."""
    torch = pytest.importorskip("torch")
    import functools

    made = {}

    def holder(kind, n, size):
        tensors = [torch.ones(size) for _ in range(n)]
        if kind in ("a global list", "a local list"):
            made[kind] = list(tensors)
        elif kind == "a dict":
            made[kind] = {f"k{i}": t for i, t in enumerate(tensors)}
        elif kind == "a closure":
            def keep(kept=list(tensors)):
                return kept
            made[kind] = keep
        elif kind == "a bound method":
            made[kind] = list(tensors).append
        elif kind == "an attribute":
            made[kind] = type("Holder", (), {})()
            made[kind].kept = list(tensors)
        elif kind == "an lru_cache":
            @functools.lru_cache(maxsize=None)
            def cached(i):
                return tensors[i]
            for i in range(n):
                cached(i)
            made[kind] = cached
            tensors.clear()
        return n * size * 4

    with snapdiff.recording(tmp_path / "dumps", every=1000) as rec:
        small = holder(kinds[0], 3, 256)
        large = holder(kinds[1], 5, 128)
        sites = rec.owners()
    # Both holders' tensors come from one line of `holder`: one site, two
    # owners, the one of more blocks first.
    line = holder.__code__.co_firstlineno + 1
    [site] = [s for s in sites if s.culprit.line == line]
    groups = [g for g in site.held_by if g["kind"] in ("global", "local")]
    assert [g["blocks"] for g in groups[:2]] == [5, 3], site
    assert [g["bytes"] for g in groups[:2]] == [large, small], site


TWO_OWNERS = """
import functools
import torch
import snapdiff

class Holder:
    def __init__(self):
        self.kept = []

def route(kind):
    # Where one line's tensors go: (`put` for each, the owner's name).
    if kind == "a global list":
        store = GLOBAL_LIST
        return store.append
    if kind == "a dict":
        store = GLOBAL_DICT
        return lambda t: store.__setitem__(len(store), t)
    if kind == "a closure":
        kept = []
        def put(t, kept=kept):
            kept.append(t)
        CLOSURES.append(put)
        return put
    if kind == "an attribute":
        return HOLDER.kept.append
    if kind == "an lru_cache":
        @functools.lru_cache(maxsize=None)
        def cached(i, t=None):
            return t
        CACHES.append(cached)
        return lambda t: cached(len(CACHES) * 1000 + cached.cache_info().currsize, t)
    raise ValueError(kind)

GLOBAL_LIST, GLOBAL_DICT, CLOSURES, CACHES, HOLDER = [], dict(), [], [], Holder()
MORE, FEWER = route({more!r}), route({fewer!r})
with snapdiff.recording({folder!r}, every=1, owners=True) as rec:
    for step in range(6):
        for i in range(3):
            t = torch.ones(256) * step  # THE LINE
            (MORE if i < 2 else FEWER)(t)
        del t
        rec.step()
"""


@pytest.mark.parametrize("more,fewer", [
    ("a global list", "a dict"),
    ("a dict", "a closure"),
    ("an attribute", "a global list"),
    ("an lru_cache", "an attribute"),
])
def test_of_two_owners_of_one_line_the_one_holding_more_comes_first(tmp_path, more, fewer):
    """One line whose tensors go two places, two for one: "held by" names
    both, the owner of more blocks first, with its exact blocks and bytes."""
    script = tmp_path / "two.py"
    script.write_text(TWO_OWNERS.format(more=more, fewer=fewer, folder=str(tmp_path / "dumps")))
    subprocess.run([sys.executable, script], check=True, capture_output=True)
    report = snapdiff.trend(tmp_path / "dumps")
    line = next(i for i, l in enumerate(script.read_text().splitlines(), 1) if "THE LINE" in l)
    [suspect] = [s for s in report.suspects if s.site.culprit.line == line]
    first, second = suspect.held_by[:2]
    last = suspect.blocks[-1]
    assert (first["blocks"], second["blocks"]) == (last * 2 // 3, last // 3), suspect.held_by
    assert (first["bytes"], second["bytes"]) == (first["blocks"] * 1024, second["blocks"] * 1024)
    assert first["blocks_per_step"] == 2 and second["blocks_per_step"] == 1, suspect.held_by


def test_folders_pth_files_add_are_libraries_unless_they_hold_the_job(tmp_path, monkeypatch):
    from snapdiff.hook import snapdiff_owners

    site_folder, added, project = tmp_path / "site", tmp_path / "added", tmp_path / "project"
    for folder in (site_folder, added, project):
        folder.mkdir()
    # A package added by a .pth file, and an editable install of the
    # user's own project (the working folder).
    (site_folder / "extra.pth").write_text(f"# comment\nimport os\n{added}\n{project}\n")
    monkeypatch.setattr(snapdiff_owners.site, "getsitepackages", lambda: [str(site_folder)])
    monkeypatch.chdir(project)
    folders = snapdiff_owners._find_library_folders()
    assert os.path.join(str(added), "") in folders
    assert os.path.join(str(project), "") not in folders
    assert os.path.join(str(site_folder), "") in folders


def test_a_library_frames_local_is_not_named_when_the_users_code_holds_it_too():
    """A frame inside a library (torch's `layer_norm`, say) holding the
    user's tensor as an argument is not where the user looks: the user's
    own global is named."""
    torch = pytest.importorskip("torch")
    from snapdiff.hook import snapdiff_owners

    library = os.path.join(os.path.dirname(torch.__file__), "nn", "fake_functional.py")
    code = compile(
        "def layer_norm(weight, find):\n    return find()\n", library, "exec")
    namespace = {}
    exec(code, namespace)
    global _KEPT
    _KEPT = [torch.ones(64)]
    try:
        blocks = _blocks(_KEPT[0])
        found = namespace["layer_norm"](_KEPT[0], lambda: snapdiff_owners.find(torch, blocks))
        [owner] = found["blocks"].values()
        assert owner["owner"] == "test_owners._KEPT[0]", owner
    finally:
        del _KEPT


_KEPT = None


def _capture_entries(tmp_path, *flags, env=None):
    """The manifest entries and stderr of a capture of a short leaking job
    (10 steps, a dump each)."""
    script = tmp_path / "train.py"
    script.write_text(HEADER.replace("import pytest\n", "") + """
history = []
for step in range(10):
    history.append(model(batch).detach() * 1)
    optimizer.step()
""")
    dumps = tmp_path / "dumps"
    done = subprocess.run(
        [binary(), "capture", *flags, "--no-report", "-o", dumps, "--every", "1", "--",
         sys.executable, script],
        check=True, capture_output=True, text=True, env={**os.environ, **(env or {})},
    )
    lines = (dumps / "manifest.jsonl").read_text().splitlines()
    return [json.loads(l) for l in lines], done.stderr


def test_no_owners_turns_the_search_off(tmp_path):
    entries, _ = _capture_entries(tmp_path, "--no-owners")
    assert len(entries) == 11, entries
    assert not any("owners" in e for e in entries), entries
    assert not list((tmp_path / "dumps").glob("*.owners.json"))


def test_a_search_past_its_budget_spaces_the_next_ones_and_says_so_once(tmp_path):
    """A budget no search can keep: searches at dumps 1, 3, 7 (every
    other, then every fourth), and at the exit dump, always."""
    entries, stderr = _capture_entries(tmp_path, env={"SNAPDIFF_OWNERS_BUDGET": "0.000001"})
    searched = [i + 1 for i, e in enumerate(entries) if "owners" in e]
    assert searched == [1, 3, 7, 11], (searched, entries)
    assert entries[-1]["file"].endswith("-exit.pickle"), entries[-1]
    assert stderr.count("took its whole budget") == 1, stderr
    assert "every other dump" in stderr and "--no-owners" in stderr, stderr
    files = [json.loads((tmp_path / "dumps" / e["owners"]).read_text()) for e in entries if e.get("owners")]
    assert files and all(f["complete"] is False for f in files), files
