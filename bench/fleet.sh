#!/usr/bin/env bash
# snapdiff fleet on generated jobs of 64, 1,024 and (RANKS="64 1024 10000")
# 10,000 ranks x 10 steps, whole
# processes: wall time and peak resident memory (GNU time) with 1 and 2
# threads, 2 threads from a cold cache beside `cat` of the files cold,
# Parquet bytes per rank, the Ray path against the direct one on a local
# cluster, and bytes per second per core against `trend`.
#
#   bash bench/fleet.sh             # RANKS="64 1024 10000" bash bench/fleet.sh
#
# Writes the jobs once (bench/make_fleet.rs, from the real training trace in
# ../shared/fixtures/torch) into target/fleet/. Needs GNU time; the Ray line
# needs `pip install ray pyarrow` and the package on PYTHONPATH (it sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
cargo build --release -q --example make_fleet
snapdiff=$PWD/target/release/snapdiff
source=../shared/fixtures/torch/cs336-medium-128-training.pickle
dir=target/fleet
sizes=${RANKS:-64 1024}
for ranks in $sizes; do
  if [ ! -f $dir/$ranks/truth.json ]; then
    mkdir -p $dir/$ranks
    target/release/examples/make_fleet $source $ranks 10 $dir/$ranks/job > $dir/$ranks/truth.json.partial
    mv $dir/$ranks/truth.json.partial $dir/$ranks/truth.json
  fi
done

# Best of three: "wall_s peak_rss_kib".
best() {
  local best="" out times
  times=$(mktemp)
  for _ in 1 2 3; do
    /usr/bin/time -o "$times" -f "%e %M" "$@" > /dev/null 2>&1 || true
    out=$(tail -1 "$times")
    if [ -z "$best" ] || awk -v a="${out% *}" -v b="${best% *}" 'BEGIN {exit !(a < b)}'; then
      best=$out
    fi
  done
  rm -f "$times"
  echo "$best"
}

# Drops the dumps under folder $1 from the page cache (bench/evict.py).
evict() {
  find "$1" -name '*.snap' -print0 | xargs -0 python3 bench/evict.py
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for ranks in $sizes; do
  bytes=$(du -sb $dir/$ranks/job | cut -f1)
  for threads in 1 2; do
    read -r wall rss < <(best $snapdiff fleet $dir/$ranks/job -j $threads)
    awk -v r=$ranks -v t=$threads -v w=$wall -v m=$rss -v b=$bytes 'BEGIN {
      printf "fleet %5d ranks, %d thread(s): %6.2f s, %5.1f MiB/s, peak RSS %5.1f MiB\n",
             r, t, w, b / w / 1048576, m / 1024 }'
  done
  # From a cold cache, beside `cat` of the same files cold.
  took=$(mktemp)
  evict $dir/$ranks/job
  /usr/bin/time -o $took -f %e $snapdiff fleet $dir/$ranks/job -j 2 > /dev/null 2>&1 || true
  cold=$(tail -1 $took)
  evict $dir/$ranks/job
  /usr/bin/time -o $took -f %e bash -c "find $dir/$ranks/job -name '*.snap' -print0 | xargs -0 cat > /dev/null"
  cat_cold=$(tail -1 $took)
  rm -f $took
  awk -v r=$ranks -v w=$cold -v c=$cat_cold 'BEGIN {
    printf "fleet %5d ranks, 2 threads, cold cache: %6.2f s; cat of the files cold: %.2f s\n", r, w, c }'
done

rm -rf $dir/1024/tables
$snapdiff export $dir/1024/job -o $dir/1024/tables 2>/dev/null || true
tables=$(du -sb $dir/1024/tables | cut -f1)
snapshots=$(du -sb $dir/1024/job | cut -f1)
awk -v t=$tables -v s=$snapshots 'BEGIN {
  printf "Parquet tables: %.1f KiB a rank, %.2f%% of its %.0f KiB of snapshots\n",
         t / 1024 / 1024, 100 * t / s, s / 1024 / 1024 }'
read -r wall rss < <(best $snapdiff fleet $dir/1024/tables -j 2)
echo "fleet of the 1,024 ranks' tables: $wall s, peak RSS $((rss / 1024)) MiB"
if [ -d $dir/10000/job ]; then
  rm -rf $dir/10000/tables
  $snapdiff export $dir/10000/job -o $dir/10000/tables 2>/dev/null || true
  read -r wall rss < <(best $snapdiff fleet $dir/10000/tables -j 2)
  echo "fleet of the 10,000 ranks' tables ($(du -sh $dir/10000/tables | cut -f1)): $wall s, peak RSS $((rss / 1024)) MiB"
  # 100,000 ranks as tables only (a million snapshots are not worth
  # writing): the 10,000 ranks' rows ten times over, renumbered.
  if python3 -c "import pyarrow" 2>/dev/null; then
    rm -rf $dir/100000/tables
    python3 bench/widen_tables.py $dir/10000/tables 10 $dir/100000/tables > /dev/null
    read -r wall rss < <(best $snapdiff fleet $dir/100000/tables -j 2)
    echo "fleet of 100,000 ranks' tables ($(du -sh $dir/100000/tables | cut -f1)): $wall s, peak RSS $((rss / 1024)) MiB"
  fi
fi

# trend, one thread: on one rank's ten dumps (the fleet's files), and on
# one file with a trace (the training fixture, a PyTorch pickle).
rank=($dir/1024/job/node0/rank1-step*.snap)
read -r wall rss < <(best env RAYON_NUM_THREADS=1 $snapdiff trend "${rank[@]}")
awk -v w=$wall -v b=$(cat "${rank[@]}" | wc -c) 'BEGIN {
  printf "trend on one rank (10 files, %.0f KiB), 1 thread: %.3f s, %.1f MiB/s\n", b / 1024, w, b / w / 1048576 }'
read -r wall rss < <(best env RAYON_NUM_THREADS=1 $snapdiff trend $source)
awk -v w=$wall -v b=$(stat -c %s $source) 'BEGIN {
  printf "trend on one file (%.1f MiB pickle), 1 thread: %.3f s, %.1f MiB/s\n", b / 1048576, w, b / w / 1048576 }'

if python3 -c "import ray, pyarrow" 2>/dev/null; then
  PATH=$PWD/target/release:$PATH PYTHONPATH=$PWD/python python3 - $dir/1024/job <<'PY'
import sys, time, ray, snapdiff
folder = sys.argv[1]
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
snapdiff.fleet(folder, engine="ray")  # workers started
for engine in (None, "ray"):
    start = time.perf_counter()
    result = snapdiff.fleet(folder, engine=engine)
    took = time.perf_counter() - start
    print(f"snapdiff.fleet(engine={engine!r}), local cluster of 2 CPUs: {took:.2f} s, "
          f"{result.leaking} leaking of {result.processes}")
PY
fi
