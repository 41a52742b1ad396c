#!/usr/bin/env bash
# End-to-end timings of compare and trend on large synthetic snapshots.
#
#   bash bench/analyze.sh
#
# Writes the inputs with `cargo run --release -p snapdiff-analyze --example
# make_large` into target/bench/ (once), then times whole `snapdiff`
# processes, best of 3, with peak memory. Needs GNU time (/usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
dir=target/bench
if [ ! -f $dir/trace-10m.snap ]; then
  cargo run --release -q -p snapdiff-analyze --example make_large -- $dir
fi
ls -l $dir/blocks-before.snap $dir/blocks-after.snap $dir/trace-10m.snap

time_it() {
  local best=""
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %M" -o /tmp/snapdiff-bench-time "$@" > /dev/null || [ $? -eq 1 ]
    # The last line: GNU time first says so when the command exits 1.
    read -r secs kib < <(tail -1 /tmp/snapdiff-bench-time)
    if [ -z "$best" ] || awk "BEGIN{exit !($secs < ${best%% *})}"; then best="$secs $kib"; fi
  done
  echo "${best%% *} s, peak $(( ${best##* } / 1024 )) MiB: $*"
}

time_it ./target/release/snapdiff compare $dir/blocks-before.snap $dir/blocks-after.snap --json
time_it ./target/release/snapdiff trend $dir/trace-10m.snap --json
