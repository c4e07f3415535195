#!/usr/bin/env bash
# The GPU check on a lent device machine, from the repository root; see bench/gpu_check.py.
# Expects the bundled SmolLM2 GGUF at $GGUF (carried in parts: a call may carry 64 MiB) and the wheels
# the GPU image lacks in .gpu/whl.  Results and logs go to $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 KVCHAT_MODEL_CACHE_DIR=/tmp/models
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -m bench.gpu_check prepare --gguf "$GGUF" --cache-dir /tmp/models || exit 1
# The CPU kernels' tests are for CPUs; everything else of the engine and session memory runs on CUDA.
timeout 240 python3 -m pytest -q -p no:cacheprovider --durations=10 tests/engine tests/memory/sessions \
  --ignore=tests/engine/test_cpu_kernels.py 2>&1 | tee "$OUT/pytest.log"
timeout 300 python3 -m bench.gpu_check measure --cache-dir /tmp/models --out "$OUT/gpu.json" 2>&1 \
  | tee "$OUT/measure.log"
