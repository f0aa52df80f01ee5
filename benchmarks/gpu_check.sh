#!/usr/bin/env bash
# The checks that need a GPU, in one short run on a lent GPU machine (DESIGN: "GPU checks"), where
# python3 holds a CUDA torch, pytest and xxhash but no MLflow or DVC: the trace's half of a run is
# checked in-process (benchmarks/scripts/gpu_trace_check.py), then the trace's step-time benchmark
# and the device fingerprints'. A few minutes on an H200. Figures go to $OUT (or the folder given)
# for the closing note.
#   bash benchmarks/gpu_check.sh [OUT_DIR]        (--cpu after it: try it on CPU tensors)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/cascade-gpu-check}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 benchmarks/scripts/gpu_trace_check.py "${@:2}" 2>&1 | tee "$out/gpu_trace_check.txt"
code=${PIPESTATUS[0]}
device=cuda
[[ " $* " == *" --cpu "* ]] && device=cpu
(cd benchmarks && python3 bench_trace.py --device "$device") 2>&1 | tee "$out/bench_trace.txt"
code=$((code | PIPESTATUS[0]))
(cd benchmarks && python3 bench_device_fingerprint.py) 2>&1 | grep -v '^USDT' | tee "$out/bench_device_fingerprint.txt"
code=$((code | PIPESTATUS[0]))
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/nvidia_smi.csv" 2>&1 || true
exit "$code"
