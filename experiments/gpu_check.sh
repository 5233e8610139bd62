#!/usr/bin/env bash
# The engine on a CUDA machine, prepared in advance so a lent GPU is used without setup:
# the engine and sampler tests on the GPU, then the engine benchmark. Under five minutes.
# Figures land in $OUT (default: ./gpu_check_out).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
python -c "import torch" 2>/dev/null || pip install -q torch
pip install -q -e ".[test]"
python - <<'PY' | tee "$OUT/device.txt"
import torch, transformers
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print(torch.cuda.get_device_name(0), "torch", torch.__version__, "transformers", transformers.__version__)
PY
specrl models build --preset small
SPECRL_TEST_DEVICE=cuda timeout 150 python -m pytest -q -p no:cacheprovider \
    tests/test_engine.py tests/test_sampling.py 2>&1 | tee "$OUT/tests.txt"
timeout 120 specrl bench engine --device cuda --repeats 2 --json "$OUT/bench_engine_cuda.json" \
    2>&1 | tee "$OUT/bench_engine_cuda.txt"
