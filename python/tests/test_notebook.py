"""snapdiff in a notebook: a real notebook executed by `jupyter nbconvert
--execute` on real torch (CPU tensors), with `%load_ext snapdiff`, a
leaking cell and a clean one under `%%snapdiff`, and a result shown as
HTML. The saved page names the leaking line, and nothing for the clean
cell."""

import html
import json
import os
import re
import subprocess
import sys

import pytest

SETUP = """\
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batch = torch.randn(32, 64)
kept = []
def train_step():
    loss = model(batch).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

LEAKING = """\
%%snapdiff --every 1 --warmup 1
for step in range(6):
    train_step()
    kept.append(model(batch).detach() * 1)
"""

CLEAN = """\
%%snapdiff --every 1 --warmup 1
for step in range(6):
    train_step()
"""


def test_a_notebook_shows_the_leaking_cells_line_and_nothing_for_the_clean_one(tmp_path):
    if not os.environ.get("SNAPDIFF_REQUIRE_RAY"):  # CI installs nbconvert
        pytest.importorskip("nbconvert")
        pytest.importorskip("ipykernel")
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext snapdiff"),
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(LEAKING),
        nbformat.v4.new_code_cell(CLEAN),
    ]
    path = tmp_path / "leak.ipynb"
    nbformat.write(nb, path)
    # A kernel of this Python (the one snapdiff is installed in), not
    # whichever `python3` kernel the machine has.
    spec = tmp_path / "jupyter" / "kernels" / "snapdiff-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "snapdiff test", "language": "python",
    }))
    temp = tmp_path / "temp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.kernel_name=snapdiff-test", "--output", "ran.ipynb", str(path)],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "JUPYTER_PATH": str(tmp_path / "jupyter"), "TMPDIR": str(temp)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The cells' dumps are gone with the kernel.
    assert not [p.name for p in temp.glob("snapdiff-cell-*")]
    ran = nbformat.read(tmp_path / "ran.ipynb", as_version=4)
    leaking, clean = (cell.outputs for cell in ran.cells[2:4])
    leaking_html = "".join(o.get("data", {}).get("text/html", "") for o in leaking)
    clean_html = "".join(o.get("data", {}).get("text/html", "") for o in clean)
    # The verdict, escaped, and the offline report in a sandboxed frame.
    text = html.unescape(leaking_html)
    assert "1 site keeps growing" in text, leaking
    # Named as IPython names the cell (on IPython 8 and 9): its number, not
    # the kernel's file id, in the text and in the page.
    verdict, page = text.split("<iframe", 1)
    assert "cell In[3], line 4" in verdict, verdict[:2000]
    assert "ipython-input-3-" in page
    kernel_file = re.search(r"ipykernel_\d+/\d+\.py", page)
    assert not kernel_file, page[kernel_file.start() - 300:kernel_file.end() + 100]
    # The text's tables are laid out with the names they show.
    tables = re.findall(r"^┌.*?^└.*?$", verdict, flags=re.M | re.S)
    assert tables, verdict
    for table in tables:
        assert len({len(row) for row in table.splitlines()}) == 1, table
    assert '<iframe sandbox="allow-scripts"' in leaking_html
    assert "http://" not in text.split("srcdoc=")[0] and "https://" not in text.split("srcdoc=")[0]
    assert "nothing here looks like a leak" in html.unescape(clean_html), clean
    assert "cell In[" not in html.unescape(clean_html).split("<iframe")[0]
