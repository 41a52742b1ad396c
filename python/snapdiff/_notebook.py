"""Notebooks: results shown as HTML, and the IPython extension.

`%load_ext snapdiff`, then

    %%snapdiff --every 1 --warmup 1
    for batch in loader:
        train_step(batch)

records the cell's PyTorch memory (CUDA, or the CPU recorder without a
GPU), dumps every N optimizer steps, and shows the verdict under the cell;
`%snapdiff report FILE...` shows a report inline.

The HTML is the offline report's page (`snapdiff report`), inside a
sandboxed `<iframe srcdoc>`: it fetches nothing, and its script cannot
reach the notebook; every text from a file is escaped by the report
itself, and the page as a whole by `html.escape` here.
"""

import argparse
import html
import os
import shlex
import shutil
import tempfile
import weakref

from snapdiff._cli import run


def report_html(files, text=None, options=()):
    """The offline report of `files` (made with the trend's `options`) as
    HTML for a notebook: the report's text (escaped) and its page in a
    sandboxed frame."""
    folder = tempfile.mkdtemp(prefix="snapdiff-notebook-")
    try:
        out = os.path.join(folder, "report.html")
        code, _, err = run(["report", "-o", out, *options, "--", *files], check=False)
        page = open(out, encoding="utf-8").read() if code == 0 else None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    parts = ['<div class="snapdiff">']
    if text:
        parts.append(f"<pre>{html.escape(text)}</pre>")
    if page is not None:
        parts.append(
            '<iframe sandbox="allow-scripts" style="width:100%;height:900px;border:0" '
            f'srcdoc="{html.escape(page, quote=True)}"></iframe>'
        )
    elif err:
        parts.append(f"<pre>{html.escape(err.strip())}</pre>")
    parts.append("</div>")
    return "".join(parts)


def text_of(command, files, options=()):
    """`snapdiff COMMAND OPTIONS FILES` as text."""
    _, out, err = run([command, "--color", "never", *options, "--", *files], check=False)
    return out or err


_PARSER = argparse.ArgumentParser(prog="%%snapdiff", add_help=False)
_PARSER.add_argument("--every", type=int, default=1)
_PARSER.add_argument("--warmup", type=int, default=1)


def cell_file_names(extra=()):
    """{file: name}: the file the kernel compiled each cell run so far into
    (`/tmp/ipykernel_PID/3137782118.py`) and the name IPython gives cell N
    (`<ipython-input-N-3137782118>`), which snapdiff shows as IPython does,
    `cell In[N]`. `extra` holds (number, code) pairs of code run without
    history (the magic's cell). Empty outside IPython."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        history = list(enumerate(shell.history_manager.input_hist_raw))
        names = {}
        for number, code in [*history, *extra]:
            # History keeps a cell without its last newlines; the kernel
            # named its file after the cell as typed, most often with one.
            for typed in (code, code + "\n") if code else ():
                path = shell.compile.get_code_name(typed, typed, number)
                stem = os.path.splitext(os.path.basename(path))[0]
                names[path] = f"<ipython-input-{number}-{stem}>"
        return names
    except Exception:
        return {}


def running_cell():
    """The number IPython shows for the cell running now, `In[N]`: the last
    one its history holds (IPython 8 and 9 both store a cell before running
    it; their `execution_count` differ inside it, by one)."""
    from IPython import get_ipython

    return len(get_ipython().history_manager.input_hist_raw) - 1


class _Verdict:
    """What the cell magic shows: the trend's text and report. The dumps
    it reads lie in `folder`, removed when the verdict is dropped or the
    kernel exits."""

    def __init__(self, files, warmup, folder=None):
        self.files = files
        self.warmup = warmup
        if folder is not None:
            weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)

    def options(self):
        return ["--warmup", str(self.warmup)]

    def text(self):
        return text_of("trend", self.files, self.options())

    def _repr_html_(self):
        return report_html(self.files, self.text(), self.options())

    def __repr__(self):
        return self.text()


def snapdiff_magic(line, cell=None):
    """`%%snapdiff [--every N] [--warmup K]` records the cell;
    `%snapdiff report FILE...` shows a report."""
    from IPython import get_ipython
    from IPython.display import HTML, display

    if cell is None:
        words = shlex.split(line)
        if not words or words[0] != "report" or len(words) < 2:
            print("usage: %snapdiff report FILE...  (or %%snapdiff [--every N] [--warmup K] on a cell)")
            return None
        display(HTML(report_html(words[1:], text_of("trend", words[1:]))))
        return None
    args = _PARSER.parse_args(shlex.split(line))
    import torch.optim.optimizer as optimizer

    from snapdiff._recording import Recording

    folder = tempfile.mkdtemp(prefix="snapdiff-cell-")
    # Steps are optimizer steps, counted as capture counts them.
    recording = Recording(folder, every=args.every)
    # A first line in place of the magic's, so that lines are the cell's
    # own (a blank one would be stripped).
    code = "# %%snapdiff\n" + cell
    ran = [(running_cell(), code)]
    # The dumps name the cells' files as IPython numbers the cells.
    recording.file_names = lambda: cell_file_names(ran)
    recording.start()
    hook = recording.count_steps_of(optimizer)
    try:
        get_ipython().run_cell(code)
    finally:
        hook.remove()
        recording.stop(final_dump=False)
    files = recording.files()
    if len(files) < args.warmup + 3:
        shutil.rmtree(folder, ignore_errors=True)
        print(
            f"snapdiff: the cell took {recording.steps} optimizer steps and {len(files)} dumps; "
            f"a verdict needs {args.warmup + 3} (--every {args.every}, --warmup {args.warmup})"
        )
        return None
    return _Verdict(files, args.warmup, folder)


def load(ipython):
    """Registers `%snapdiff` and `%%snapdiff`."""
    ipython.register_magic_function(snapdiff_magic, magic_kind="line_cell", magic_name="snapdiff")
