"""`snapdiff watch` following a generated job of 1,000 ranks as it runs:
each round, every rank's next dump appears in its node's folder (a hard
link: in place at once, as capture's rename puts it), and the round ends
when the watch's `/metrics` says it has read them all. Prints, a round a
line, how long the watch took to read and judge the round's dumps (the
cost of an update, per dump), and its resident memory, which stays flat
once each rank's series reaches `--keep-checkpoints`. The round's time includes the wait for the next
poll (200 ms); its CPU time is the watch's own.

    python3 bench/watch.py [RANKS] [STEPS] [KEEP]    (1000 20 8 by default)

`SNAPDIFF=PATH` runs another build's binary (to compare two builds).

Writes the job once (bench/make_fleet.rs, from the real training trace in
../shared/fixtures/torch) into target/fleet/watch-RANKS-STEPS/. Needs
`pip install prometheus-client`. Exits 1 when the final verdict is not the
generator's truth.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "..", "shared", "fixtures", "torch", "cs336-medium-128-training.pickle")


def run(*args, **kwargs):
    subprocess.run(args, check=True, cwd=ROOT, **kwargs)


def make_job(ranks, steps):
    folder = os.path.join(ROOT, "target", "fleet", f"watch-{ranks}-{steps}")
    truth = os.path.join(folder, "truth.json")
    if not os.path.exists(truth):
        os.makedirs(folder, exist_ok=True)
        with open(truth + ".partial", "w") as out:
            run(os.path.join(ROOT, "target/release/examples/make_fleet"), SOURCE, str(ranks),
                str(steps), os.path.join(folder, "job"), stdout=out)
        os.replace(truth + ".partial", truth)
    with open(truth) as f:
        return folder, json.load(f)


def dumps_read(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "snapdiff_dumps_read":
                return int(sample.value)
    return 0


def cpu_seconds(pid):
    """User and system CPU time of the process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def resident_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        kib = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
    return kib / 1024


def main():
    defaults = [1000, 20, 8]
    given = [int(a) for a in sys.argv[1:4]]
    ranks, steps, keep = given + defaults[len(given):]
    run("cargo", "build", "--release", "-q")
    run("cargo", "build", "--release", "-q", "--example", "make_fleet")
    folder, truth = make_job(ranks, steps)
    job, live = os.path.join(folder, "job"), os.path.join(folder, "live")
    shutil.rmtree(live, ignore_errors=True)
    by_step = {}
    for node in sorted(os.listdir(job)):
        os.makedirs(os.path.join(live, node))
        for name in os.listdir(os.path.join(job, node)):
            dump = re.search(r"-step(\d+)", name)
            if dump is None:
                # The writer's manifest, there from the job's start.
                os.link(os.path.join(job, node, name), os.path.join(live, node, name))
                continue
            by_step.setdefault(int(dump.group(1)), []).append((node, name))
    watch = subprocess.Popen(
        [os.environ.get("SNAPDIFF", os.path.join(ROOT, "target/release/snapdiff")), "watch", live, "--poll", "200ms",
         "--no-status", "--keep-checkpoints", str(keep), "--metrics", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = watch.stderr.readline()
    url = re.search(r"metrics at (\S+)", line).group(1)
    print(f"machine: {os.cpu_count()} cores; {ranks} ranks in {len(os.listdir(job))} folders, "
          f"{steps} dumps each, --keep-checkpoints {keep}")
    print(f"{'round':>5} {'dumps':>7} {'seconds':>8} {'CPU s':>6} {'CPU ms a dump':>14} "
          f"{'RSS MiB':>8}")
    done = 0
    for n, step in enumerate(sorted(by_step), 1):
        started, cpu = time.perf_counter(), cpu_seconds(watch.pid)
        for node, name in by_step[step]:
            os.link(os.path.join(job, node, name), os.path.join(live, node, name))
        done += len(by_step[step])
        while dumps_read(url) < done:
            time.sleep(0.02)
        seconds, cpu = time.perf_counter() - started, cpu_seconds(watch.pid) - cpu
        print(f"{n:>5} {done:>7} {seconds:>8.2f} {cpu:>6.2f} "
              f"{1000 * cpu / len(by_step[step]):>14.2f} {resident_mib(watch.pid):>8.1f}",
              flush=True)
    watch.send_signal(signal.SIGINT)
    out, _ = watch.communicate(timeout=600)
    print(next((l for l in out.splitlines() if " read from " in l), "(no verdict)"))
    leaking = sorted({r for leak in truth["leaks"] for r, _ in leak["ranks"]})
    right = f"{ranks - len(leaking)} steady, {len(leaking)} leaking" in out and all(
        f"rank{r}" in out for r in leaking
    )
    print("verdict: " + ("the generator's truth" if right else "NOT the generator's truth"))
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
