#!/usr/bin/env bash
# GPU readiness check on one GPU: 4 workers x 0.25 GPU vs 1 worker (quickstart and a MobileNet paper slice),
# GPU utilisation, determinism on CUDA, FedBABU paper-scale slice, packed training (engine.pack) against
# sequential on the cross-device workload. Results: $OUT/gpu_check.json + .log.
#   benchmarks/gpu_check.sh                   on a GPU machine (273 s on an H200 before the packed part, install included)
#   benchmarks/gpu_check.sh --parts packed    the packed part alone (issue 27)
#   benchmarks/gpu_check.sh --cpu             tiny rounds on CPU workers: tests the script itself
# Data: FEDSIM_DATA (default .gpudata/, made by benchmarks/gpu_subset.py). A machine without ray or pydantic
# gets them from .whl/ (made by benchmarks/gpu_wheels.sh: wheels plus ray-*-slim.tar.xz, a ray wheel without
# its Java, RLlib, Serve, Tune, Train and dashboard web client, which fedsim never uses): unpacked into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fedsim-gpu-check}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
if [ -d .whl ] && ! "$PYTHON" -c "import ray, pydantic" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  "$PYTHON" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" .whl/ray-*-slim.tar.xz /tmp/site
  export PYTHONPATH=/tmp/site
fi
# Ray workers inherit these: fedsim from this checkout, the data subset, a private data cache.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export FEDSIM_DATA=${FEDSIM_DATA:-$PWD/.gpudata} FEDSIM_CACHE=${FEDSIM_CACHE:-/tmp/fedsim-gpu-cache}
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # also set by each GPU worker; here for anything that runs before
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt" || true
timeout 530 "$PYTHON" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
