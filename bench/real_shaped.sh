#!/usr/bin/env bash
# snapdiff against CPython on real-shaped snapshots (deep mixed stacks,
# 20k distinct stacks, 1M blocks, 2M trace events), whole processes.
#
#   bash bench/real_shaped.sh          # the ~210 MB pair
#   BIG=1 bash bench/real_shaped.sh    # also 3M blocks and 6M events (~580 MB),
#                                      # and the ~1 GB file (fresh frame lists)
#
# Writes the inputs once with bench/make_real_shaped.py into
# target/real-shaped/, then prints, best of 3, wall time and peak resident
# memory (GNU time) of each task beside CPython doing the same on the same
# file in the same run, and of the commands that replay the trace or draw
# (peak, steps, oom, trend, report, flamegraph, pprof) on the pickle and
# its .snap. Needs ../shared/fixtures/torch (the frame vocabulary).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
snapdiff=$PWD/target/release/snapdiff
dir=target/real-shaped
if [ ! -f $dir/real-b.pickle ]; then
  python3 bench/make_real_shaped.py $dir
fi
for f in a b; do
  [ -f $dir/real-$f.snap ] || $snapdiff convert $dir/real-$f.pickle $dir/real-$f.snap
done
if [ -n "${BIG:-}" ] && [ ! -f $dir/x3/real-a.pickle ]; then
  python3 bench/make_real_shaped.py $dir/x3 --only-a --blocks 3000000 --events 6000000
fi
if [ -n "${BIG:-}" ] && [ ! -f $dir/big/real-a.pickle ]; then
  python3 bench/make_real_shaped.py $dir/big --fresh-lists --only-a --blocks 1150000 --events 2300000
fi

# The Python way of comparing: load both pickles, group live blocks by a
# hash of their frames, and take the differences.
python_compare='
import pickle, sys
from collections import Counter
def groups(path):
    with open(path, "rb") as f:
        snap = pickle.load(f)
    g = Counter()
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "inactive":
                key = hash(tuple((fr["name"], fr["filename"], fr["line"]) for fr in b["frames"]))
                g[key] += b["requested_size"]
    return g
a, b = groups(sys.argv[1]), groups(sys.argv[2])
grown = {k: b[k] - a.get(k, 0) for k in b if b[k] > a.get(k, 0)}
print(len(grown), sum(grown.values()))
'

time_it() {
  local best=""
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %M" -o /tmp/snapdiff-bench-time "$@" > /tmp/snapdiff-bench-out || [ $? -eq 1 ]
    # The last line: GNU time first says so when the command exits 1.
    read -r secs kib < <(tail -1 /tmp/snapdiff-bench-time)
    if [ -z "$best" ] || awk "BEGIN{exit !($secs < ${best%% *})}"; then best="$secs $kib"; fi
  done
  printf '%6.2f s %6d MiB  %s\n' "${best%% *}" $(( ${best##* } / 1024 )) "$*"
}

ls -l $dir/real-a.pickle $dir/real-b.pickle $dir/real-a.snap $dir/real-b.snap
time_it python3 -c 'import pickle, sys; pickle.load(open(sys.argv[1], "rb"))' $dir/real-a.pickle
time_it $snapdiff summary $dir/real-a.pickle
time_it python3 -c "$python_compare" $dir/real-a.pickle $dir/real-b.pickle
time_it $snapdiff compare $dir/real-a.pickle $dir/real-b.pickle
time_it $snapdiff compare $dir/real-a.snap $dir/real-b.snap
# The memory gate between two runs: a baseline of one, the other checked.
$snapdiff baseline $dir/real-a.pickle -o /tmp/snapdiff-bench-baseline.json --force
time_it $snapdiff baseline $dir/real-a.pickle -o /tmp/snapdiff-bench-baseline.json --force
time_it $snapdiff check /tmp/snapdiff-bench-baseline.json $dir/real-b.pickle
time_it $snapdiff check /tmp/snapdiff-bench-baseline.json $dir/real-b.snap
wc -c /tmp/snapdiff-bench-baseline.json
# The commands that replay the trace or draw, on the pickle and its .snap.
for f in $dir/real-a.pickle $dir/real-a.snap; do
  for task in peak steps oom trend; do
    time_it $snapdiff $task $f
  done
  time_it $snapdiff report -f -o /tmp/snapdiff-bench.html $f
  time_it $snapdiff flamegraph -f -o /tmp/snapdiff-bench.svg $f
  time_it $snapdiff pprof -f -o /tmp/snapdiff-bench.pb.gz $f
done
# The pickle compressed, as users keep them.
[ -f $dir/real-a.pickle.gz ] || gzip -6 -k $dir/real-a.pickle
[ -f $dir/real-a.pickle.zst ] || zstd -q -3 -k $dir/real-a.pickle
ls -l $dir/real-a.pickle.gz $dir/real-a.pickle.zst
time_it $snapdiff summary $dir/real-a.pickle.gz
time_it $snapdiff summary $dir/real-a.pickle.zst
time_it python3 -c 'import gzip, pickle, sys; pickle.load(gzip.open(sys.argv[1]))' $dir/real-a.pickle.gz
$snapdiff compare --json $dir/real-a.snap $dir/real-b.snap > /tmp/snapdiff-bench-json || [ $? -eq 1 ]
echo "compare --json: $(stat -c %s /tmp/snapdiff-bench-json) bytes"
$snapdiff compare --json --top 0 $dir/real-a.snap $dir/real-b.snap > /tmp/snapdiff-bench-json || [ $? -eq 1 ]
echo "compare --json --top 0: $(stat -c %s /tmp/snapdiff-bench-json) bytes"
if [ -n "${BIG:-}" ]; then
  ls -l $dir/x3/real-a.pickle
  time_it python3 -c 'import pickle, sys; pickle.load(open(sys.argv[1], "rb"))' $dir/x3/real-a.pickle
  time_it $snapdiff summary $dir/x3/real-a.pickle
  ls -l $dir/big/real-a.pickle
  time_it python3 -c 'import pickle, sys; pickle.load(open(sys.argv[1], "rb"))' $dir/big/real-a.pickle
  time_it $snapdiff summary $dir/big/real-a.pickle
fi
