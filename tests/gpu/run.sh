#!/usr/bin/env bash
# Every check that needs a CUDA device, one line each: `ok   NAME` or
# `FAIL NAME: why`. Run on a machine with an NVIDIA GPU, its driver, and
# torch built for CUDA (`pip install torch numpy`, and transformers and
# lightning for the callbacks); record what it prints in docs/testing.md.
# Exit code: the number of checks that failed.
#
# It builds what it runs with tests/gpu/build.sh; on a GPU machine without
# Rust, set SNAPDIFF_GPU_BIN to that script's target/gpu/bin built
# elsewhere. SNAPDIFF_GPU_WORK, if set, is a folder where the checks' logs
# and dumps are kept.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [ -n "${SNAPDIFF_GPU_WORK:-}" ]; then
    work=$SNAPDIFF_GPU_WORK
    mkdir -p "$work"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
failed=0

# Runs check NAME as the rest of the arguments; its output goes to a log,
# whose last line is quoted when it fails. (Checks grep saved output, never
# a pipe: `grep -q` leaving early would fail the writer under pipefail.)
check() {
    local name=$1
    shift
    if "$@" >"$work/$name.log" 2>&1; then
        echo "ok   $name"
    else
        echo "FAIL $name: $(tail -n 1 "$work/$name.log")"
        failed=$((failed + 1))
    fi
}

# Runs the one ignored test NAME of test program PROGRAM; a name that
# matches no test fails instead of passing with nothing run. A failure ends
# with the panic's message, for `check` to quote.
one_test() {
    local program=$1 name=$2
    local log=$work/$name.test-output
    RUST_BACKTRACE=0 "$bin/$program" --ignored --exact "$name" --test-threads 1 >"$log" 2>&1
    cat "$log"
    grep -q "test result: ok. 1 passed" "$log" && return 0
    grep -A1 "panicked at" "$log" | tail -n 1
    return 1
}

echo "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
    echo 'none found by nvidia-smi')"
echo "torch: $(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -n 1)"

if [ -n "${SNAPDIFF_GPU_BIN:-}" ]; then
    bin=$(cd "$SNAPDIFF_GPU_BIN" && pwd)
else
    tests/gpu/build.sh || exit 1
    bin=$PWD/target/gpu/bin
fi
snapdiff=$bin/snapdiff

# The kernels are compiled by NVRTC, which cudarc opens by name
# (libnvrtc.so, libnvrtc.so.12, ...); a CUDA 13 toolkit has only the
# unversioned name, in its lib64.
toolkit=${CUDA_HOME:-/usr/local/cuda}/lib64
if [ -e "$toolkit/libnvrtc.so" ]; then
    export LD_LIBRARY_PATH="$toolkit${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# The runtime on cudarc: blocks on the device, its snapshot's layout.
check runtime-allocates-on-the-gpu one_test allocator-tests allocates_on_a_gpu
# The training workload's kernels (compiled by NVRTC) compute what the CPU does.
check kernels-match-the-cpu one_test train-tests cuda_kernels_compute_what_the_cpu_computes

# The built-in job on the GPU under capture: the leaking line is named.
leak_line=$(grep -n "leaks with --leak keep-activations" crates/train/src/model.rs | cut -d: -f1)
rust_job() {
    "$snapdiff" capture -o "$work/rust" --every 10 --no-report -- \
        "$snapdiff" train --backend cuda --steps 60 --leak keep-activations --log-every 0 &&
        "$snapdiff" trend "$work"/rust/*.snap >"$work/rust-trend.txt" &&
        cat "$work/rust-trend.txt" && grep -q "model.rs:$leak_line" "$work/rust-trend.txt"
}
check rust-job-on-cuda-names-its-leak rust_job

# Real PyTorch on CUDA under capture: dumps PyTorch's own viewer reads, the
# leaking line named, and the dict that keeps the leak alive.
torch_leak_line=$(grep -n "leaks with --leak cache-dict" tests/support/torch_train.py | cut -d: -f1)
torch_job() {
    python3 -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'" &&
        "$snapdiff" capture -o "$work/torch" --every 5 --owners --no-report -- \
            python3 tests/support/torch_train.py --device cuda --steps 30 --leak cache-dict &&
        python3 - "$work"/torch/*.pickle <<'PY' &&
import pickle, sys
from torch.cuda import _memory_viz as viz
for path in sys.argv[1:]:
    snapshot = pickle.load(open(path, "rb"))
    assert snapshot["segments"], f"{path}: no CUDA segments"
    viz.segsum(snapshot)
    viz.trace(snapshot)
PY
        "$snapdiff" trend "$work"/torch/*.pickle >"$work/torch-trend.txt" &&
        cat "$work/torch-trend.txt" && grep -q "torch_train.py:$torch_leak_line" "$work/torch-trend.txt"
}
check torch-capture-on-cuda torch_job
check torch-owners-on-cuda grep -q ": cache (a dict)" "$work/torch-trend.txt"

# A CUDA out-of-memory error under capture: the dump taken at the error,
# explained by `snapdiff oom`.
oom_job() {
    cat >"$work/oom.py" <<'PY'
import torch
kept = []
try:
    while True:
        kept.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    print(f"out of memory after {len(kept)} GiB")
PY
    "$snapdiff" capture -o "$work/oom" --no-report -- python3 "$work/oom.py" &&
        ls "$work"/oom/*-oom.pickle &&
        "$snapdiff" oom "$work"/oom/*-oom.pickle >"$work/oom.txt" &&
        cat "$work/oom.txt" && grep -q "oom.py:5" "$work/oom.txt"
}
check cuda-out-of-memory-dump oom_job

# The Hugging Face Trainer and Lightning callbacks, on CUDA (their tests use
# it when torch sees it), with this build's command. SNAPDIFF_REQUIRE_RAY is
# the Python suite's switch that fails, not skips, a missing framework.
integrations() {
    PATH="$bin:$PATH" PYTHONPATH="$PWD/python" SNAPDIFF_REQUIRE_RAY=1 \
        python3 -m pytest -q -p no:cacheprovider python/tests/test_integrations.py
}
check callbacks-on-cuda integrations

echo "$failed failed"
exit "$failed"
