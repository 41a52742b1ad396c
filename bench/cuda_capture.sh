#!/usr/bin/env bash
# What `snapdiff capture` costs a CUDA job: bench/cuda_capture.py's steps
# per second alone, under capture (a dump every 50 steps), and under
# capture with --owners; three rounds, the conditions alternated. Needs a
# GPU and torch built for CUDA. SNAPDIFF: the command (default: the
# release build).
set -euo pipefail
cd "$(dirname "$0")/.."
snapdiff=${SNAPDIFF:-target/release/snapdiff}
steps=${STEPS:-300}
dumps=$(mktemp -d)
trap 'rm -rf "$dumps"' EXIT

rate() { grep -o '"steps_per_s": [0-9.]*' | cut -d' ' -f2; }
for round in 1 2 3; do
    alone=$(python3 bench/cuda_capture.py "$steps" | rate)
    rm -rf "$dumps"/*
    captured=$("$snapdiff" capture -o "$dumps/c" --every 50 --no-report -- \
        python3 bench/cuda_capture.py "$steps" 2>/dev/null | rate)
    owners=$("$snapdiff" capture -o "$dumps/o" --every 50 --owners --no-report -- \
        python3 bench/cuda_capture.py "$steps" 2>/dev/null | rate)
    echo "round $round: alone $alone steps/s, captured $captured, with --owners $owners ($(ls "$dumps/c" | grep -c pickle) dumps)"
done
