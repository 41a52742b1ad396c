#!/usr/bin/env bash
# Each reading figure beside its limit, measured in the same run: snapdiff
# against CPython's `pickle.load` and against walking the pickle's opcodes
# with nothing built (`opcode_floor`); `summary` and `fleet` against `dd`
# and `cat` of the same files, from the page cache and from a cold one
# (bench/evict.py); `check` against the program's own start.
#
#   bash bench/limits.sh            # on the machine as it is
#   BUSY=1 bash bench/limits.sh     # beside a second process spinning on a core
#
# Needs the inputs of bench/real_shaped.sh (target/real-shaped) and of
# bench/fleet.sh (target/fleet/1024); makes a 150 MiB real-shaped pickle
# into target/real-shaped/m150, and 32 ranks of PyTorch pickles from the
# latter into target/fleet/pickles. Wall times of whole processes, one
# run each: run the script three times.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
cargo build --release -q -p snapdiff-format --example opcode_floor
cargo build --release -q -p snapdiff-analyze --example check_speed
snapdiff=$PWD/target/release/snapdiff
shaped=target/real-shaped/real-a.pickle
shaped150=target/real-shaped/m150/real-a.pickle
snaps=target/fleet/1024/job
pickles=target/fleet/pickles
for need in $shaped $snaps; do
  [ -e $need ] || { echo "missing $need: run bench/real_shaped.sh and bench/fleet.sh first" >&2; exit 2; }
done
if [ ! -f $shaped150 ]; then
  python3 bench/make_real_shaped.py target/real-shaped/m150 --only-a --blocks 700000 --events 1400000 > /dev/null
fi
if [ ! -d $pickles ]; then
  for n in 0 1 2 3; do
    mkdir -p $pickles.partial/node$n
    for f in $snaps/node$n/*.snap; do
      $snapdiff convert "$f" $pickles.partial/node$n/"$(basename "$f" .snap)".pickle
    done
    sed 's/\.snap"/.pickle"/' $snaps/node$n/manifest.jsonl > $pickles.partial/node$n/manifest.jsonl
  done
  mv $pickles.partial $pickles
fi
if [ -n "${BUSY:-}" ]; then
  yes > /dev/null &
  hog=$!
  trap 'kill $hog' EXIT
fi

# Seconds and peak KiB of a whole process: "secs kib".
measure() {
  /usr/bin/time -f "%e %M" -o /tmp/snapdiff-limits-time "$@" > /dev/null 2>&1 || [ $? -eq 1 ]
  tail -1 /tmp/snapdiff-limits-time
}
# Seconds a run of a short command takes, the mean of 20.
mean_of_20() {
  local t0 t1
  t0=$(date +%s.%N)
  for _ in $(seq 20); do "$@" > /dev/null 2>&1 || [ $? -eq 1 ]; done
  t1=$(date +%s.%N)
  awk -v a=$t0 -v b=$t1 'BEGIN {print (b - a) / 20}'
}
bytes() { du -sbL "$@" | awk '{n += $1} END {print n}'; }
# Seconds one run of a command takes, its output dropped.
seconds() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > /dev/null 2>&1
  t1=$(date +%s.%N)
  awk -v a=$t0 -v b=$t1 'BEGIN {print b - a}'
}

echo "machine: $(nproc) cores, ${BUSY:+busy (a second process spinning), }$(date -u +%F)"
# summary of FILE beside pickle.load and the opcode floor; sets sd_s.
summary_line() {
  local file=$1 file_bytes py_s py_kib sd_kib floor_s
  file_bytes=$(bytes $file)
  read -r py_s py_kib < <(measure python3 -c 'import pickle, sys; pickle.load(open(sys.argv[1], "rb"))' $file)
  read -r sd_s sd_kib < <(measure $snapdiff summary $file)
  # Best of repeated walks, in milliseconds.
  floor_s=$(target/release/examples/opcode_floor $file | awk '{print $2 / 1000}')
  awk -v f=$file_bytes -v p=$py_s -v s=$sd_s -v k=$sd_kib -v o=$floor_s 'BEGIN {
    printf "summary of a %.0f MiB pickle: %.2f s; pickle.load %.2f s (%.1fx); opcodes alone %.3f s (%.1fx the floor); peak %.2fx the file\n",
           f / 1048576, s, p, p / s, o, s / o, k * 1024 / f }'
  local cold_s dd_cold dd_warm
  python3 bench/evict.py $file
  read -r cold_s _ < <(measure $snapdiff summary $file)
  python3 bench/evict.py $file
  dd_cold=$(seconds dd if=$file of=/dev/null bs=1M)
  dd_warm=$(seconds dd if=$file of=/dev/null bs=1M)
  awk -v f=$file_bytes -v s=$cold_s -v c=$dd_cold -v w=$dd_warm 'BEGIN {
    printf "  from a cold cache: %.2f s; dd of the file cold %.3f s (%.0f MiB/s), warm %.3f s (%.0f MiB/s)\n",
           s, c, f / c / 1048576, w, f / w / 1048576 }'
}
summary_line $shaped150
summary_line $shaped

# Seconds to read files from the page cache (a first read puts them there).
cat_warm() {
  cat "$@" > /dev/null
  seconds cat "$@"
}
# fleet -j 2 of the files named *.EXT under DIR, beside cat of the same;
# then both from a cold cache.
fleet_line() {
  local dir=$1 ext=$2 files bytes warm secs kib cold_s cold_cat
  files=$(find $dir -name "*.$ext" | wc -l)
  bytes=$(bytes $dir)
  warm=$(cat_warm $(find $dir -name "*.$ext"))
  read -r secs kib < <(measure $snapdiff fleet $dir -j 2)
  awk -v e=$ext -v n=$files -v b=$bytes -v s=$secs -v c=$warm 'BEGIN {
    printf "fleet -j 2 of %d .%s files (%.2f MiB each): %.2f s, %.0f files/s, %.0f MiB/s; cat of the same, warm: %.3f s, %.0f MiB/s (%.1fx)\n",
           n, e, b / n / 1048576, s, n / s, b / s / 1048576, c, b / c / 1048576, s / c }'
  python3 bench/evict.py $(find $dir -name "*.$ext")
  read -r cold_s _ < <(measure $snapdiff fleet $dir -j 2)
  python3 bench/evict.py $(find $dir -name "*.$ext")
  cold_cat=$(seconds cat $(find $dir -name "*.$ext"))
  awk -v n=$files -v b=$bytes -v s=$cold_s -v c=$cold_cat 'BEGIN {
    printf "  from a cold cache: %.2f s, %.0f files/s, %.0f MiB/s; cat %.3f s, %.0f MiB/s (%.1fx)\n",
           s, n / s, b / s / 1048576, c, b / c / 1048576, s / c }'
}
fleet_line $snaps snap
fleet_line $pickles pickle

$snapdiff baseline target/real-shaped/real-a.pickle -o /tmp/snapdiff-limits-baseline.json --force 2> /dev/null
read -r ck_s ck_kib < <(measure $snapdiff check /tmp/snapdiff-limits-baseline.json target/real-shaped/real-b.pickle)
step=$snaps/node0/rank0-step9.snap
$snapdiff baseline $step -o /tmp/snapdiff-limits-step.json --force 2> /dev/null
one_s=$(mean_of_20 $snapdiff check /tmp/snapdiff-limits-step.json $step)
start_s=$(mean_of_20 $snapdiff --version)
# check's own work on the dump, in-process: "... N ms in all".
work_ms=$(target/release/examples/check_speed $step | awk '{print $(NF - 3)}')
awk -v c=$ck_s -v s=$sd_s -v o=$one_s -v z=$start_s -v w=$work_ms 'BEGIN {
  printf "check of a 1M-block run: %.2f s (its summary %.2f s); of one step dump: %.1f ms (the program starting: %.1f ms; its work in-process: %.1f ms)\n",
         c, s, o * 1000, z * 1000, w }'
