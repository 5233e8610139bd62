#!/usr/bin/env bash
# The engine on a CUDA machine, prepared in advance so a lent GPU is used without setup:
# the engine, runner and sampler tests on the GPU, then the engine benchmark. Under five minutes.
# Figures land in $OUT (default: ./gpu_check_out).
# GPU_CHECK_DEVICE=cpu is a dry run of every step on a CPU machine (a smaller benchmark), to
# check the script itself where no GPU is lent.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_out}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
mkdir -p "$OUT"
python -c "import torch" 2>/dev/null || pip install -q torch
pip install -q -e ".[test]"
GPU_CHECK_DEVICE="$DEVICE" python - <<'PY' | tee "$OUT/device.txt"
import os, torch, transformers
if os.environ["GPU_CHECK_DEVICE"] == "cuda":
    assert torch.cuda.is_available(), "no CUDA device visible to torch"
    name = torch.cuda.get_device_name(0)
else:
    name = "cpu (dry run)"
print(name, "torch", torch.__version__, "transformers", transformers.__version__)
PY
specrl models build --preset small
SPECRL_TEST_DEVICE="$DEVICE" timeout 150 python -m pytest -q -p no:cacheprovider \
    tests/test_engine.py tests/test_runner.py tests/test_sampling.py 2>&1 | tee "$OUT/tests.txt"
BENCH=(--repeats 2)
if [ "$DEVICE" = cpu ]; then BENCH=(--repeats 1 --batch-sizes 1,4 --new-tokens 16); fi
timeout 120 specrl bench engine --device "$DEVICE" "${BENCH[@]}" \
    --json "$OUT/bench_engine_$DEVICE.json" 2>&1 | tee "$OUT/bench_engine_$DEVICE.txt"
