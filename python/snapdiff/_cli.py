"""Running the `snapdiff` command that comes with this package."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any, Dict, Optional

#: More paths than this reach the command through a file (`--paths-from`),
#: never its command line, which the system bounds (30,000 paths raised
#: "Argument list too long").
PATHS_ON_COMMAND_LINE = 1000


def binary():
    """The path of the `snapdiff` command: the one this package was
    installed with (in the environment's scripts folder), else the first on
    PATH."""
    name = "snapdiff.exe" if os.name == "nt" else "snapdiff"
    here = os.path.join(sysconfig.get_path("scripts"), name)
    if os.path.isfile(here):
        return here
    found = shutil.which("snapdiff")
    if found is None:
        raise FileNotFoundError(
            "the snapdiff command is not installed: pip install torch-snapdiff"
        )
    return found


def run(args, check=True):
    """Runs `snapdiff ARGS`; returns (exit code, stdout, stderr). Exit
    codes 0, 1 (over a --max-growth limit) and 3 (fleet: no rank could be
    judged) are answers; 2 is an error, raised as RuntimeError with
    snapdiff's one-line message when `check`."""
    done = subprocess.run(
        [binary(), *map(_arg, args)], capture_output=True, text=True
    )
    if check and done.returncode not in (0, 1, 3):
        raise RuntimeError(done.stderr.strip() or f"snapdiff exited with {done.returncode}")
    return done.returncode, done.stdout, done.stderr


def run_with_paths(args, paths, check=True):
    """`run(ARGS -- PATHS)`; many paths go through a NUL-separated file
    given as `--paths-from` instead (`fleet` and `export` read it)."""
    paths = [_arg(p) for p in paths]
    if len(paths) <= PATHS_ON_COMMAND_LINE:
        return run([*args, "--", *paths], check)
    with tempfile.NamedTemporaryFile("wb", suffix=".paths", delete=False) as f:
        f.write(b"\0".join(os.fsencode(p) for p in paths))
    try:
        return run([*args, "--paths-from", f.name], check)
    finally:
        os.unlink(f.name)


def _arg(value):
    """A command-line argument: a path (`str`, `bytes` or `os.PathLike`) as
    the OS spells it, a number as text."""
    if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
        return os.fspath(value)
    return str(value)


def run_json(command, paths, options=()):
    """Runs `snapdiff COMMAND OPTIONS --json -- PATHS` and returns the parsed
    report. The paths come after `--`, so none is read as an option (a file
    named `-h`)."""
    _, out, _ = run([command, *options, "--json", "--top", "0", "--", *paths])
    return json.loads(out)


def main():
    """`python -m snapdiff ...`: the command, with its exit code."""
    args = [binary(), *sys.argv[1:]]
    if os.name == "nt":
        sys.exit(subprocess.call(args))
    os.execv(args[0], args)


def one_trend(report: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The trend of `snapdiff trend --json` when its files hold one
    process (`processes` has one entry), with the report's `frames` and
    `stacks` tables that its sites point into; None for several."""
    processes = report["processes"]
    if len(processes) != 1:
        return None
    trend = dict(processes[0]["trend"])
    trend["frames"], trend["stacks"] = report["frames"], report["stacks"]
    return trend
