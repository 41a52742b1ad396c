#!/usr/bin/env bash
# What `snapdiff capture` costs a CUDA job: bench/cuda_capture.py's steps
# per second alone and under capture in each setting (a dump every 50
# steps, but for no-step-dumps), alternated, ROUNDS rounds (default 3);
# and how long one step dump held the job, from the hook's manifest.
# Needs a GPU and torch built for CUDA. SNAPDIFF: the command (default:
# the release build); STEPS: timed steps a run (default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
snapdiff=${SNAPDIFF:-target/release/snapdiff}
steps=${STEPS:-300}
dumps=$(mktemp -d)
trap 'rm -rf "$dumps"' EXIT

rate() { grep -o '"steps_per_s": [0-9.]*' | cut -d' ' -f2; }

# The step dumps of folder $1: how many, and the mean seconds each held the job.
held() {
    python3 - "$1/manifest.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [e["seconds"] for e in steps if e.get("reason") == "step" and "seconds" in e]
print(f"{len(steps)} step dumps, {sum(steps) / max(len(steps), 1):.3f} s each")
PY
}

# LABEL, then capture's options.
captured() {
    local label=$1
    local folder=$dumps/$label
    shift
    local r
    r=$("$snapdiff" capture -o "$folder" "$@" --no-report -- \
        python3 bench/cuda_capture.py "$steps" 2>/dev/null | rate)
    printf '  %-16s %7.1f steps/s  %s\n' "$label" "$r" "$(held "$folder")"
}

for round in $(seq "${ROUNDS:-3}"); do
    rm -rf "${dumps:?}"/*
    echo "round $round"
    printf '  %-16s %7.1f steps/s\n' alone "$(python3 bench/cuda_capture.py "$steps" | rate)"
    captured capture --every 50
    captured no-stacks --every 50 --no-stacks
    captured no-step-dumps --every 100000
    captured owners --every 50 --owners
done
