#!/usr/bin/env bash
# Every check that needs a CUDA device, one line each: `ok   NAME` or
# `FAIL NAME: why`. Run on a machine with an NVIDIA GPU, its driver, and
# torch built for CUDA (`pip install torch numpy`); record what it prints
# in docs/testing.md. Exit code: the number of checks that failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

# Runs check NAME as the rest of the arguments; its output goes to a log,
# whose last line is quoted when it fails.
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

device() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
}
echo "device: $(device 2>/dev/null || echo 'none found by nvidia-smi')"

cargo build --release --quiet || exit 1
snapdiff=target/release/snapdiff

# The runtime on cudarc: blocks on the device, its snapshot's layout.
check runtime-allocates-on-the-gpu \
    cargo test --release --quiet -p snapdiff-runtime --test allocator -- --ignored allocates_on_a_gpu
# The training workload's kernels (compiled by NVRTC) compute what the CPU does.
check kernels-match-the-cpu \
    cargo test --release --quiet -p snapdiff-train --test train -- --ignored cuda_kernels_compute_what_the_cpu_computes

# The built-in job on the GPU under capture: the leaking line is named.
leak_line=$(grep -n "leaks with --leak keep-activations" crates/train/src/model.rs | cut -d: -f1)
rust_job() {
    "$snapdiff" capture -o "$work/rust" --every 10 --no-report -- \
        "$snapdiff" train --backend cuda --steps 60 --leak keep-activations --log-every 0 &&
        "$snapdiff" trend "$work"/rust/*.snap | tee /dev/stderr | grep -q "model.rs:$leak_line"
}
check rust-job-on-cuda-names-its-leak rust_job

# Real PyTorch on CUDA under capture: dumps PyTorch's own viewer reads, and
# the leaking line named.
torch_leak_line=$(grep -n "leaks with --leak cache-dict" tests/support/torch_train.py | cut -d: -f1)
torch_job() {
    python3 -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'" &&
        "$snapdiff" capture -o "$work/torch" --every 5 --no-report -- \
            python3 tests/support/torch_train.py --steps 30 --leak cache-dict &&
        python3 - "$work"/torch/*.pickle <<'PY' &&
import pickle, sys
from torch.cuda import _memory_viz as viz
for path in sys.argv[1:]:
    snapshot = pickle.load(open(path, "rb"))
    viz.segsum(snapshot)
    viz.trace(snapshot)
PY
        "$snapdiff" trend "$work"/torch/*.pickle | tee /dev/stderr | grep -q "torch_train.py:$torch_leak_line"
}
check torch-capture-on-cuda torch_job

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
        "$snapdiff" oom "$work"/oom/*-oom.pickle | tee /dev/stderr | grep -q "oom.py:5"
}
check cuda-out-of-memory-dump oom_job

echo "$failed failed"
exit "$failed"
