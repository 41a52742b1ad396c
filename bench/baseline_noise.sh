#!/usr/bin/env bash
# Run-to-run noise of `snapdiff check`'s figures, which its default
# tolerance (5% and 1 MiB) must hold: bench/noise_job.py captured twice
# with seed 0 and once with each of seeds 1-4, each run checked against the
# first at zero tolerance, so that every difference is printed.
#
#   bash bench/baseline_noise.sh
#
# Needs torch and transformers (pip install torch transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
snapdiff=$PWD/target/release/snapdiff
dir=target/baseline-noise
rm -rf "$dir" && mkdir -p "$dir"
for run in 0 0-again 1 2 3 4; do
  "$snapdiff" capture -o "$dir/$run" --every 5 --no-report -- python3 bench/noise_job.py "${run%-again}" > /dev/null 2>&1
  "$snapdiff" baseline "$dir/$run" -o "$dir/$run.json"
done
for run in 0-again 1 2 3 4; do
  echo "== run $run against run 0"
  "$snapdiff" check "$dir/0.json" "$dir/$run" --tolerance 0 --min-bytes 0 || true
done
