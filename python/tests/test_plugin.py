"""The wheel as users get it: its pytest plugin on real PyTorch programs
(CPU tensors, through the CPU recorder), its Python API, and its command.

Run against an installed wheel: `python -m pytest python/tests` (`.ci/run`
builds the wheel, installs it in a fresh virtual environment and runs this).
"""

import json
import re
import os
import subprocess
import sys

import pytest

import snapdiff
from snapdiff._cli import one_trend

MODEL = """
import pytest
import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
optimizer = torch.optim.AdamW(model.parameters())
batch = torch.randn(32, 64)
kept = []
cache = []

def train_step(keep=False, periodic=False, step=0):
    loss = model(batch).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if keep:
        kept.append(torch.ones(4096))  # LEAKS 16 KiB A STEP
    if periodic:
        cache.append(torch.ones(4096))
        if len(cache) == 3:
            cache.clear()
"""


def write_tests(pytester, body):
    return pytester.makepyfile(test_training=MODEL + body)


def leak_line(path):
    lines = path.read_text().splitlines()
    return next(i + 1 for i, l in enumerate(lines) if "LEAKS 16 KiB A STEP" in l)


def test_a_leaking_step_fails_naming_the_line_and_the_bytes(pytester):
    path = write_tests(pytester, """
@pytest.mark.snapdiff(max_leak="1 KiB", warmup=2, steps=8)
def test_train_step_does_not_leak(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step(keep=True)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "16.0 KiB a step kept after warm-up, over the 1.00 KiB a step allowed" in out, out
    # The line, its path cut from the left where the table is narrow.
    assert f"{path.name}:{leak_line(path)}" in out, out
    assert "16.0 KiB" in out, out
    # Fitted to 100 columns: pytest knows no terminal width for it.
    table = [l for l in out.splitlines() if l[:1] in "┌│╞└"]
    assert table and max(len(l) for l in table) <= 100, "\n".join(table)


@pytest.mark.parametrize("checkout", ["snapdiff", "lightning"])
def test_a_project_in_a_folder_named_like_a_library_keeps_its_lines(pytester, checkout):
    """A clone named `snapdiff` or `lightning` is the user's code: the leak
    is named at its line, not at torch's or as "no frame of your code"."""
    folder = pytester.mkdir(checkout).joinpath("tests")
    folder.mkdir()
    path = folder / "test_training.py"
    path.write_text(MODEL + """
@pytest.mark.snapdiff(max_leak="1 KiB", warmup=2, steps=8)
def test_train_step_does_not_leak(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step(keep=True)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", str(path))
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert f"{path.name}:{leak_line(path)}" in out, out
    assert "no frame of your code" not in out, out


BASELINE_TEST = """
import pytest
import torch

held = []

@pytest.mark.snapdiff(baseline="memory/step.json", warmup=1, steps=3)
def test_step(snapdiff_steps):
    for _ in snapdiff_steps:
        held[:] = [torch.ones(SIZE)]  # THE BUFFER
"""


def test_a_baseline_is_written_then_checked_naming_the_line_that_rose(pytester):
    def run_with(size, *flags):
        path = pytester.makepyfile(test_baseline=f"SIZE = {size}\n" + BASELINE_TEST)
        return path, pytester.runpytest_subprocess("-p", "no:cacheprovider", *flags)

    _, result = run_with(1 << 18)
    result.assert_outcomes(passed=1)
    written = pytester.path / "memory" / "step.json"
    kept = written.read_text()
    assert '"snapdiff_baseline": 1' in kept and str(pytester.path) not in kept, kept
    # The same test again: within the baseline.
    run_with(1 << 18)[1].assert_outcomes(passed=1)
    # The buffer 3 MiB larger: over, at its line.
    path, result = run_with(1 << 20)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    line = next(i + 1 for i, l in enumerate(path.read_text().splitlines()) if "THE BUFFER" in l)
    assert "memory rose over the baseline" in out, out
    assert f"test_baseline.py:{line}  at the peak" in out, out
    # Updated on request, it passes again.
    run_with(1 << 20, "--snapdiff-update-baselines")[1].assert_outcomes(passed=1)
    assert written.read_text() != kept
    run_with(1 << 20)[1].assert_outcomes(passed=1)


def test_max_growth_limits_what_is_kept_in_all(pytester):
    path = write_tests(pytester, """
@pytest.mark.snapdiff(max_growth="64 KiB", warmup=2, steps=8)
def test_over(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step(keep=True)

@pytest.mark.snapdiff(max_growth="1 MiB", warmup=2, steps=8)
def test_under(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step(keep=True)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    out = result.stdout.str()
    assert "KiB kept after warm-up, over the 64.0 KiB allowed (max_growth)" in out, out
    assert f"{path}:{leak_line(path)}" in out, out


def test_a_steady_step_passes(pytester):
    write_tests(pytester, """
@pytest.mark.snapdiff(max_growth="0 B", warmup=2, steps=8)
def test_train_step_does_not_leak(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step()
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_memory_that_rises_and_falls_passes(pytester):
    write_tests(pytester, """
@pytest.mark.snapdiff(max_growth="0 B", warmup=2, steps=10)
def test_train_step_does_not_leak(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step(periodic=True)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_snapdiff_dir_keeps_the_snapshots_of_failing_tests(pytester, tmp_path):
    write_tests(pytester, """
@pytest.mark.snapdiff(max_leak="1 KiB", warmup=1, steps=4)
def test_leaks(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step(keep=True)
""")
    kept = tmp_path / "kept"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--snapdiff-dir={kept}")
    result.assert_outcomes(failed=1)
    (folder,) = list(kept.iterdir())
    assert len(list(folder.glob("*.pickle"))) == 5
    assert (folder / "manifest.jsonl").exists()


def test_recording_and_the_python_api(tmp_path):
    import torch

    model = torch.nn.Linear(32, 32)
    kept = []
    with snapdiff.recording(tmp_path, every=1) as rec:
        for _ in range(8):
            model(torch.randn(4, 32)).sum().backward()
            kept.append(torch.ones(1024))
            rec.step()
    names = sorted(os.listdir(tmp_path))
    assert f"pid{os.getpid()}-step8.pickle" in names, names
    assert "manifest.jsonl" in names
    trend = snapdiff.trend(str(tmp_path))
    assert trend.suspects, trend
    top = trend.suspects[0]
    assert top.site.culprit.file == __file__
    assert top.growth_per_step == 4096
    files = rec.files()
    comparison = snapdiff.compare(files[1], files[-2])
    assert comparison.groups[0].delta_bytes > 0
    assert comparison.groups[0].site.culprit.file == __file__
    # A second run into the same folder judges its own dumps only (the
    # first run's stay, under their names).
    with snapdiff.recording(tmp_path, every=1) as again:
        for _ in range(3):
            kept.append(torch.ones(16))
            again.step()
    mine = again.files()
    assert len(mine) >= 3 and not set(mine) & set(files), (mine, files)
    assert all(os.path.exists(f) for f in mine + files)


def test_results_read_as_the_commands_text_and_repr_in_one_line(tmp_path):
    """`str()` of a result is the command's own text, with the options it
    was made with; `repr()` is one short line; `Suspect.culprit` is there."""
    import torch

    kept = []
    with snapdiff.recording(tmp_path, every=1) as rec:
        for _ in range(8):
            kept.append(torch.ones(1024))
            rec.step()
    files = rec.files()
    trend = snapdiff.trend(files, warmup=3)
    cli = subprocess.run([snapdiff._cli.binary(), "trend", "--color", "never", "--warmup", "3",
                          "--", *files], capture_output=True, text=True).stdout
    assert str(trend) == cli.rstrip("\n")
    assert "the first 3 as warm-up" in str(trend)
    top = trend.suspects[0]
    assert top.culprit is top.site.culprit and top.culprit.file == __file__
    assert repr(top) == f"<Suspect {top.culprit}: 4.00 KiB a step>"
    assert str(top).startswith(f"{top.culprit}: 4.00 KiB a step, ")
    for result in (trend, snapdiff.compare(files[0], files[-1]), snapdiff.peak(files[-1]), top):
        shown = repr(result)
        assert shown.startswith("<") and "\n" not in shown and len(shown) < 200, shown
    assert repr(trend).startswith("<Trend of 8 checkpoints: 1 site keeps growing, ")
    few = snapdiff.trend(files[:3])
    assert few.no_verdict and repr(few) == "<Trend of 3 checkpoints: no verdict>"
    # In a notebook, the page is made with the same warm-up.
    import html

    text, page = html.unescape(trend._repr_html_()).split("<iframe", 1)
    assert "the first 3 as warm-up" in text
    assert '"warmup":3' in page


def test_growth_under_a_kilobyte_a_step_is_no_suspect_beside_a_real_leak(tmp_path):
    """A few bytes a step (a framework's counter, a logged scalar) beside a
    leak of kilobytes is left out, with a note; alone, it is the suspect."""
    import torch

    kept, counters = [], []
    with snapdiff.recording(tmp_path / "both", every=1) as both:
        for _ in range(8):
            kept.append(torch.ones(1024))  # 4 KiB a step: the leak
            counters.append(torch.zeros(2))  # 8 B a step: bookkeeping
            both.step()
    trend = snapdiff.trend(both.files())
    assert [s.growth_per_step for s in trend.suspects] == [4096], trend.suspects
    assert "1 site growing less than 1 KiB a step left out" in " ".join(trend.notes)
    with snapdiff.recording(tmp_path / "alone", every=1) as alone:
        for _ in range(8):
            counters.append(torch.zeros(2))  # the only growth
            alone.step()
    assert [s.growth_per_step for s in snapdiff.trend(alone.files()).suspects] == [8]


def test_flame_graphs_start_where_the_program_does(tmp_path):
    """Under pytest, dozens of frames of the interpreter, pytest and pluggy
    run the test: the folded stacks fold them into one, then the test."""
    import torch

    kept = []
    with snapdiff.recording(tmp_path / "dumps", every=1) as rec:
        for _ in range(2):
            kept.append(torch.ones(1024))
            rec.step()
    folded = tmp_path / "stacks.folded"
    subprocess.run([snapdiff._cli.binary(), "flamegraph", "--folded", "-o", str(folded),
                    rec.files()[-1]], check=True)
    mine = [line for line in folded.read_text().splitlines()
            if "test_flame_graphs_start_where_the_program_does" in line]
    assert mine, folded.read_text()
    for line in mine:
        first, second = line.split(";")[:2]
        assert re.fullmatch(r"\((\d+) frames running the program\)", first), line
        assert second.startswith("test_flame_graphs_start_where_the_program_does "), line
        assert "pluggy" not in line and "_pytest" not in line, line


def test_one_run_tells_one_story_in_every_view(tmp_path):
    """The text, `--json`, the page, the notebook view and the Python result
    of one run, made with the same warm-up, agree on the headline, the
    growth, the rate, the warm-up and the culprit."""
    import html
    import torch

    kept = []
    with snapdiff.recording(tmp_path / "dumps", every=1) as rec:
        for _ in range(9):
            kept.append(torch.ones(2048))  # 8 KiB a step
            rec.step()
    files = rec.files()
    cli = [snapdiff._cli.binary(), "trend", "--color", "never", "--warmup", "3", "--"]
    text = subprocess.run(cli + files, capture_output=True, text=True).stdout
    as_json = one_trend(json.loads(subprocess.run(
        cli[:-1] + ["--json", "--"] + files, capture_output=True, text=True).stdout))
    page_file = tmp_path / "report.html"
    subprocess.run([snapdiff._cli.binary(), "report", "--warmup", "3", "-o", str(page_file),
                    "--", *files], check=True)
    result = snapdiff.trend(files, warmup=3)
    notebook_text, notebook_page = html.unescape(result._repr_html_()).split("<iframe", 1)

    def page_data(page):
        return json.loads(page.split('<script id="data" type="application/json">')[1]
                          .split("</script>")[0])

    top = as_json["suspects"][0]
    assert top["growth_per_step"] == 8192 and as_json["warmup"] == 3
    for shown in (text, notebook_text, str(result)):
        assert "1 site keeps growing" in shown, shown
        assert "the first 3 as warm-up" in shown, shown
        assert "8.00 KiB" in shown and f"{os.path.basename(__file__)}:" in shown, shown
    for data in (page_data(page_file.read_text()), page_data(notebook_page)):
        t = data["trend"]
        assert (t["warmup"], t["no_verdict"]) == (3, None)
        [s] = t["suspects"]
        assert s["growth_bytes"] == top["growth_bytes"]
        assert s["growth_per_step"] == top["growth_per_step"]
        assert s["culprit"] == top["culprit"]
    [s] = result.suspects
    assert (s.growth_bytes, s.growth_per_step) == (top["growth_bytes"], 8192)
    assert (s.culprit.file, s.culprit.line) == (top["culprit"]["file"], top["culprit"]["line"])


def test_a_leak_that_grows_once_an_epoch_is_named_and_one_time_allocations_are_not(tmp_path):
    """A validation metric that keeps each evaluation's probabilities and is
    never reset (the torchmetrics pattern), dumped every optimizer step:
    its memory rises once every 4 steps. Three one-time allocations at
    separate points of the same run are no leak."""
    import torch

    model = torch.nn.Linear(64, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    metric_state, loaded = [], []
    with snapdiff.recording(tmp_path / "dumps", every=1) as rec:
        for step in range(48):
            loss = model(torch.randn(16, 64)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 4 == 3:  # an evaluation every 4 steps
                with torch.no_grad():
                    metric_state.append(model(torch.randn(256, 64)).softmax(-1))  # EPOCH LEAK
            if step in (10, 25, 40):
                loaded.append(torch.zeros(4096))  # ONE-TIME
            rec.step()
    trend = snapdiff.trend(rec.files())
    lines = open(__file__).read().splitlines()
    epoch_line = next(i + 1 for i, l in enumerate(lines) if "# EPOCH LEAK" in l)
    assert [(s.culprit.file, s.culprit.line) for s in trend.suspects] == [(__file__, epoch_line)]
    assert trend.suspects[0].growth_per_step == pytest.approx(256 * 8 * 4 / 4, rel=0.2)
    assert "grows in steps: about once every 4 steps" in str(trend), str(trend)


def test_memory_outside_the_recorded_sites_is_said_and_not_an_all_clear(tmp_path):
    """A loop whose tensors hold still while it keeps a 16 MiB numpy array
    a step: no site is a suspect, and the result says the process grows."""
    import numpy
    import torch

    model = torch.nn.Linear(64, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with snapdiff.recording(tmp_path / "dumps", every=1) as rec:
        for _ in range(12):
            loss = model(torch.randn(16, 64)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            kept.append(numpy.ones(4 << 20, dtype=numpy.float32))
            rec.step()
    trend = snapdiff.trend(rec.files())
    assert trend.suspects == []
    assert trend.outside_grows()
    assert trend.outside["process"]["growth_per_step"] == pytest.approx(16 << 20, rel=0.2)
    assert "memory outside the sites does" in repr(trend)
    assert "the growth is outside what snapdiff records" in str(trend), str(trend)


def test_a_suspect_carries_what_pytorch_recorded_with_it():
    # Written by CPython's pickler in the newest layout (fixtures/make_torch_format.py).
    path = os.path.join(os.path.dirname(__file__), "../../fixtures/torch-format/newest-step6.pickle")
    top = snapdiff.trend(path).suspects[0]
    assert top.site.culprit.line == 31
    assert top.site.recorded == {
        "compiled_regions": ["Torch-Compiled Region: 0/1"],
        "metadata": ["phase=train"],
    }


def test_python_m_snapdiff_is_the_command():
    done = subprocess.run(
        [os.sys.executable, "-m", "snapdiff", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0
    assert done.stdout.startswith("snapdiff "), done.stdout


FIXTURES = os.path.join(os.path.dirname(__file__), "../../../shared/fixtures/torch")


@pytest.mark.skipif(not os.environ.get("SNAPDIFF_CARGO_BIN"), reason="SNAPDIFF_CARGO_BIN not set")
def test_the_wheels_command_says_what_the_cargo_build_says():
    cargo = os.environ["SNAPDIFF_CARGO_BIN"]
    wheel = snapdiff._cli.binary()
    assert os.path.realpath(wheel) != os.path.realpath(cargo)
    names = sorted(n for n in os.listdir(FIXTURES) if n.endswith(".pickle"))
    assert names
    for name in names:
        path = os.path.join(FIXTURES, name)
        for command in (["summary"], ["trend"], ["peak"]):
            outs = [
                subprocess.run([b, *command, path, "--json"], capture_output=True, text=True)
                for b in (wheel, cargo)
            ]
            assert outs[0].returncode == outs[1].returncode, (name, command)
            assert json.loads(outs[0].stdout) == json.loads(outs[1].stdout), (name, command)


def test_leaving_the_loop_early_still_judges_the_steps_taken(pytester):
    path = write_tests(pytester, """
@pytest.mark.snapdiff(max_leak="1 KiB", warmup=2, steps=10)
def test_leaks_then_breaks(snapdiff_steps):
    for i in snapdiff_steps:
        train_step(keep=True)
        if i == 7:
            break

@pytest.mark.snapdiff(max_leak="1 KiB", warmup=2, steps=10)
def test_breaks_at_once(snapdiff_steps):
    for _ in snapdiff_steps:
        break
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "16.0 KiB a step kept after warm-up" in out, out
    assert f"{path}:{leak_line(path)}" in out, out
    assert "left the snapdiff_steps loop after 0 of 12 steps" in out, out


def test_stacks_end_at_the_test_function(pytester):
    write_tests(pytester, """
@pytest.mark.snapdiff(max_leak="1 KiB", warmup=1, steps=4)
def test_leaks(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step(keep=True)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "from test_leaks" in out, out
    assert "_pytest/" not in out and "pluggy/" not in out, out


def test_a_bad_max_leak_is_an_error_that_leaves_nothing(pytester, tmp_path, monkeypatch):
    write_tests(pytester, """
@pytest.mark.snapdiff(max_leak="lots")
def test_bad(snapdiff_steps):
    for _ in snapdiff_steps:
        train_step()
""")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert "max_leak='lots'" in result.stdout.str()
    assert not any(p.name.startswith("snapdiff-pytest-") for p in temp.iterdir())


def test_paths_are_never_read_as_options(tmp_path):
    real = os.path.join(FIXTURES, "snapviewer-memory.pickle")
    if not os.path.exists(real):
        pytest.skip("../shared/fixtures is not beside the repository")
    dashed = tmp_path / "-h"
    with pytest.raises(RuntimeError, match="-h"):
        snapdiff.peak(str(dashed))
    with pytest.raises(RuntimeError) as error:
        snapdiff.compare(real, str(tmp_path / "-x.pickle"))
    assert "-x.pickle" in str(error.value) and "Usage" not in str(error.value)
    copy = tmp_path / "-copy.pickle"
    copy.write_bytes(open(real, "rb").read())
    assert snapdiff.peak(copy).devices == snapdiff.peak(real).devices
    assert snapdiff.trend(os.fsencode(tmp_path)).checkpoints == snapdiff.trend(tmp_path).checkpoints


def test_compare_of_two_runs_gives_each_runs_peak(tmp_path):
    """Two captured runs of one job, the second keeping more a step: two
    runs, the net change split, and each trace's peak as `peak` finds it."""
    from snapdiff._cli import binary

    job = tmp_path / "job.py"
    job.write_text(
        "import sys, torch\n"
        "kept = []\n"
        "for step in range(10):\n"
        "    x = torch.ones(1 << 16)\n"
        "    kept.append(torch.ones(int(sys.argv[1])))\n"
    )
    files = []
    for name, size in (("a", 256), ("b", 1024)):
        out = tmp_path / name
        subprocess.run([binary(), "capture", "-o", out, "--no-report", "--", sys.executable, job,
                        str(size)], check=True, capture_output=True)
        files.append(str(next(out.glob("*.pickle"))))
    result = snapdiff.compare(*files)
    assert result.runs == 2, result
    assert result.grown_bytes == 10 * (1024 - 256) * 4, result
    peaks = [
        json.loads(subprocess.run([binary(), "peak", f, "--json"], check=True, capture_output=True,
                                  text=True).stdout)["devices"][0]["allocated_bytes"]
        for f in files
    ]
    assert [result.peak_before, result.peak_after] == peaks
    assert peaks[1] > peaks[0]
