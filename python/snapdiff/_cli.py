"""Running the `snapdiff` command that comes with this package."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig


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
            "the snapdiff command is not installed: pip install snapdiff"
        )
    return found


def run(args, check=True):
    """Runs `snapdiff ARGS`; returns (exit code, stdout, stderr). Exit
    codes 0 and 1 (over a --fail-over limit) are answers; 2 is an error,
    raised as RuntimeError with snapdiff's one-line message when `check`."""
    done = subprocess.run(
        [binary(), *map(str, args)], capture_output=True, text=True
    )
    if check and done.returncode not in (0, 1):
        raise RuntimeError(done.stderr.strip() or f"snapdiff exited with {done.returncode}")
    return done.returncode, done.stdout, done.stderr


def run_json(args):
    """Runs `snapdiff ARGS --json` and returns the parsed report."""
    _, out, _ = run([*args, "--json", "--top", "0"])
    return json.loads(out)


def main():
    """`python -m snapdiff ...`: the command, with its exit code."""
    args = [binary(), *sys.argv[1:]]
    if os.name == "nt":
        sys.exit(subprocess.call(args))
    os.execv(args[0], args)
