#!/usr/bin/env python3
"""End-to-end: reading a PyTorch snapshot pickle, snapdiff against CPython.

    cargo build --release
    python3 bench/pickle_read.py                 # the large generated pickle
    python3 bench/pickle_read.py --fixtures      # the real files in ../shared/fixtures/torch
    python3 bench/pickle_read.py --in-process    # the real files, without process start-up

For each file it reports the best of --runs runs of:
  - CPython: `pickle.load` of the file, timed inside the interpreter (so
    interpreter start-up is not counted), and the process's peak RSS;
  - snapdiff: `snapdiff summary --json FILE` as a whole process, wall clock
    and peak RSS (reading dominates; the summary is a single pass; the peak
    is taken with GNU time, see run_measured);
  - the same for the file converted to .snap, and the two file sizes.
The large pickle is made by fixtures/make_torch_format.py --large (CPython's
pickler, frames shared as PyTorch shares them) and cached under target/bench/.

--in-process compares the reading alone, in --rounds rounds that alternate
CPython's `pickle.loads` of the file's bytes (best of many loads over a
second, with the garbage collector on as it is for users, and again with it
off) and snapdiff's `read_bytes` (the read_speed example, best of many reads
over a second); each figure is the best over the rounds.
"""

import argparse
import glob
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPDIFF = os.path.join(ROOT, "target", "release", "snapdiff")

CPYTHON_LOAD = """
import pickle, resource, sys, time
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    pickle.load(f)
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


GNU_TIME = "/usr/bin/time"


def run_measured(cmd):
    """Runs cmd twice; returns its wall seconds and its peak RSS in KiB.

    The peak comes from a second run under GNU time (Debian package `time`),
    whose own small process starts cmd: a child forked straight from this
    interpreter counts the interpreter's pages too, as Linux carries a
    process's peak across exec (about 14 MiB here, more than snapdiff takes
    for a small file). Without GNU time, that inflated figure is reported.
    """
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        sys.exit(f"failed: {' '.join(cmd)}")
    if not os.path.exists(GNU_TIME):
        return wall, usage.ru_maxrss
    out = subprocess.run([GNU_TIME, "-f", "%M", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}")
    return wall, int(out.stderr.split()[-1])


def cpython(path):
    out = subprocess.run([sys.executable, "-c", CPYTHON_LOAD, path], capture_output=True, text=True, check=True)
    secs, rss = out.stdout.split()
    return float(secs), int(rss)


def best(runs, f):
    results = [f() for _ in range(runs)]
    return min(r[0] for r in results), min(r[1] for r in results)


def mib(kib):
    return f"{kib / 1024:.0f} MiB"


def measure(path, runs):
    snap = os.path.join(ROOT, "target", "bench", os.path.basename(path) + ".snap")
    os.makedirs(os.path.dirname(snap), exist_ok=True)
    subprocess.run([SNAPDIFF, "convert", "--force", path, snap], check=True)
    py_t, py_rss = best(runs, lambda: cpython(path))
    sd_t, sd_rss = best(runs, lambda: run_measured([SNAPDIFF, "summary", "--json", path]))
    sn_t, sn_rss = best(runs, lambda: run_measured([SNAPDIFF, "summary", "--json", snap]))
    size, snap_size = os.path.getsize(path), os.path.getsize(snap)
    print(
        f"| {os.path.basename(path)} | {size / 2**20:.1f} MiB | {py_t * 1000:.0f} ms, {mib(py_rss)} "
        f"| {sd_t * 1000:.0f} ms, {mib(sd_rss)} | {py_t / sd_t:.1f}x "
        f"| {snap_size / 2**20:.2f} MiB ({size / snap_size:.0f}x smaller) | {sn_t * 1000:.0f} ms, {mib(sn_rss)} |"
    )


CPYTHON_LOADS = """
import gc, pickle, sys, time
data = open(sys.argv[1], "rb").read()
for gc_on in (True, False):
    gc.enable() if gc_on else gc.disable()
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < 1.0:
        t = time.perf_counter()
        pickle.loads(data)
        best = min(best, time.perf_counter() - t)
    print(best * 1000)
"""


def in_process(paths, rounds):
    subprocess.run(["cargo", "build", "--quiet", "--release", "-p", "snapdiff-format", "--example", "read_speed"], cwd=ROOT, check=True)
    read_speed = os.path.join(ROOT, "target", "release", "examples", "read_speed")
    best = {p: [float("inf")] * 3 for p in paths}
    for _ in range(rounds):
        for p in paths:
            out = subprocess.run([sys.executable, "-c", CPYTHON_LOADS, p], capture_output=True, text=True, check=True)
            gc_on, gc_off = (float(x) for x in out.stdout.split())
            out = subprocess.run([read_speed, p], capture_output=True, text=True, check=True)
            ours = float(out.stdout.split()[-1])
            b = best[p]
            best[p] = [min(b[0], gc_on), min(b[1], gc_off), min(b[2], ours)]
    print("| file | CPython `pickle.loads` (gc on) | (gc off) | snapdiff `read_bytes` | speed-up (gc on) | (gc off) |")
    print("|---|---|---|---|---|---|")
    for p in paths:
        gc_on, gc_off, ours = best[p]
        print(f"| {os.path.basename(p)} | {gc_on:.2f} ms | {gc_off:.2f} ms | {ours:.2f} ms | {gc_on / ours:.1f}x | {gc_off / ours:.1f}x |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixtures", action="store_true", help="measure ../shared/fixtures/torch/*.pickle")
    p.add_argument("--events", type=int, default=5_000_000, help="trace events in the large pickle")
    p.add_argument("--in-process", action="store_true", help="the fixtures, timed inside each process")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5, help="rounds of --in-process")
    args = p.parse_args()
    fixtures = sorted(os.path.normpath(p) for p in glob.glob(os.path.join(ROOT, "..", "shared", "fixtures", "torch", "*.pickle")))
    if args.in_process:
        in_process(fixtures, args.rounds)
        return
    if not os.path.exists(SNAPDIFF):
        sys.exit("build first: cargo build --release")
    print("| file | size | CPython pickle.load | snapdiff summary | speed-up | as .snap | snapdiff summary of .snap |")
    print("|---|---|---|---|---|---|---|")
    if args.fixtures:
        for path in fixtures:
            measure(path, args.runs)
    else:
        large = os.path.join(ROOT, "target", "bench", f"large-{args.events}.pickle")
        if not os.path.exists(large):
            os.makedirs(os.path.dirname(large), exist_ok=True)
            subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "make_torch_format.py"), "--large", str(args.events), "--out", large], check=True)
        measure(large, args.runs)


if __name__ == "__main__":
    main()
