#!/usr/bin/env bash
# Builds what tests/gpu/run.sh runs, into target/gpu/bin: the release
# `snapdiff` and the two test programs with GPU checks, under fixed names.
# With --pack, also target/gpu.tar.xz, for a GPU machine without Rust:
#   tar -xJf target/gpu.tar.xz -C target && SNAPDIFF_GPU_BIN=target/gpu/bin tests/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

out=target/gpu/bin
mkdir -p "$out"
cargo build --release --quiet
cp target/release/snapdiff "$out/snapdiff"

# Copies the test program of TARGET in PACKAGE to $out/NAME.
test_program() {
    local package=$1 target=$2 name=$3
    local exe
    exe=$(cargo test --release --quiet --no-run -p "$package" --test "$target" --message-format=json |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("profile", {}).get("test"):
        print(m["executable"])')
    cp "$exe" "$out/$name"
}
test_program snapdiff-runtime allocator allocator-tests
test_program snapdiff-train train train-tests

if [ "${1:-}" = --pack ]; then
    tar -C target -cf - gpu/bin | xz -T0 -6 >target/gpu.tar.xz
    echo "target/gpu.tar.xz: $(du -h target/gpu.tar.xz | cut -f1)"
fi
