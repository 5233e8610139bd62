#!/usr/bin/env bash
# The engine on a CUDA machine, prepared in advance so a lent GPU is used without setup, in
# two parts that each fit one 600 s device command:
#   bash experiments/gpu_check.sh profile   the default pair's check, a hardware profile of it
#                                           (`specrl profile --device cuda`) and its table:
#                                           limits 45 + 480 + 30 s
#   bash experiments/gpu_check.sh engine    the pair's check, the engine benchmark, then the
#                                           engine, runner and sampler tests on the GPU:
#                                           limits 45 + 240 + 150 s
#   bash experiments/gpu_check.sh           both, the profile first (a machine without that limit)
# A step that fails or times out does not stop the next, and the script exits 1 at the end
# naming it. Figures land in $OUT (default: gpu_check_out/ in the repository root; the
# script works from there, so a relative OUT is under it too).
# Offline: it installs nothing that imports already. specrl itself is installed (editable,
# no dependencies, no index, no build isolation) only when it does not import from this
# checkout; PYTHONPATH=. alone would not do, since specrl.envs and specrl.policies live in
# envs/ and policies/. Where even that install fails (no setuptools), it runs from a mirror
# of the checkout in which specrl/envs and specrl/policies are links to those folders.
# GPU_CHECK_DEVICE=cpu is a dry run of every step on a CPU machine (a smaller benchmark and
# a tiny profile of the micro pair), to check the script itself where no GPU is lent.
set -euo pipefail
PART="${1:-all}"
case "$PART" in
    profile) STEPS=" build profile show " ;;
    engine) STEPS=" build bench tests " ;;
    all) STEPS=" build profile show bench tests " ;;
    *) echo "gpu_check: unknown part '$PART'; choose profile, engine or none (both)" >&2; exit 2 ;;
esac
export PYTHONUNBUFFERED=1  # each file holds what its step printed, even if it is cut short
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_out}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
# The Python that holds torch: on the GPU image that is `python3` (there may be no `python`).
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

ROOT="$PWD"
# Does specrl, with specrl.envs and specrl.policies, come from this checkout's files? (Found,
# not imported: the steps below need neither gymnasium nor stable-baselines3 nor wandb, which
# a GPU image may lack.) Quiet while there are other ways to try; not on the last.
from_here() {
    ROOT="$ROOT" "$PYTHON" - <<'PY'
import importlib.util, os, specrl.cli
for name, folder in (("specrl", "specrl"), ("specrl.envs", "envs"), ("specrl.policies", "policies")):
    origin = importlib.util.find_spec(name).origin
    assert os.path.samefile(origin, os.path.join(os.environ["ROOT"], folder, "__init__.py"))
PY
}
if ! from_here 2>/dev/null; then
    # What the benchmark and the profile need; the tests step needs pytest as well.
    if "$PYTHON" -c "import torch, transformers, tokenizers, safetensors, numpy, tqdm" 2>/dev/null; then
        "$PYTHON" -m pip install -q --no-deps --no-index --no-build-isolation -e . || true
    else
        echo "gpu_check: dependencies missing; installing them needs the network" >&2
        "$PYTHON" -m pip install -q -e ".[test]" || echo "gpu_check: the install failed" >&2
    fi
fi
if ! from_here 2>/dev/null; then
    mirror="$(mktemp -d)"
    mkdir "$mirror/specrl"
    ln -s "$ROOT"/specrl/* "$mirror/specrl/"
    ln -s "$ROOT/envs" "$mirror/specrl/envs"
    ln -s "$ROOT/policies" "$mirror/specrl/policies"
    ln -s "$ROOT/tests" "$ROOT/pyproject.toml" "$mirror/"
    cd "$mirror"
    from_here || { echo "gpu_check: specrl does not import from $ROOT (above: why)" >&2; exit 1; }
    echo "running specrl from $mirror (links into $ROOT)"
fi
SPECRL=("$PYTHON" -m specrl.cli)  # works installed or from the mirror alike

GPU_CHECK_DEVICE="$DEVICE" "$PYTHON" - <<'PY' | tee "$OUT/device.txt"
import os, torch, transformers
if os.environ["GPU_CHECK_DEVICE"] == "cuda":
    assert torch.cuda.is_available(), "no CUDA device visible to torch"
    name = torch.cuda.get_device_name(0)
else:
    name = "cpu (dry run)"
print(name, "torch", torch.__version__, "transformers", transformers.__version__)
PY

# Each step's output goes to its file as it runs (what a lent machine cut short still comes
# back), and a failed step does not stop the next: a lent GPU is used once. The figures come
# first, the tests last; the script fails at the end if any step did.
failed=()
step() {  # step NAME SECONDS FILE COMMAND...
    local name=$1 limit=$2 file=$3 rc=0
    shift 3
    timeout -k 15 "$limit" "$@" 2>&1 | tee "$file" || rc=$?
    if [ "$rc" -ne 0 ]; then
        failed+=("$name")
        local why="failed (exit $rc)"
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            why="timed out after ${limit} s"
        fi
        echo "gpu_check: $name $why" | tee -a "$file" >&2
    fi
}
# A file left by an earlier run must not pass for this one's (only this part's files go).
gone=("$OUT/build.txt")
case "$STEPS" in *" profile "*)
    gone+=("$OUT/profile-$DEVICE".{json,txt} "$OUT/profile-$DEVICE-show.txt") ;;
esac
case "$STEPS" in *" bench "*) gone+=("$OUT/bench_engine_$DEVICE".{json,txt} "$OUT/tests.txt") ;; esac
rm -f "${gone[@]}"
# The shipped pair verifies in seconds; one that failed its hash check would start an hour of
# CPU training, which the limit cuts short.
step build 45 "$OUT/build.txt" "${SPECRL[@]}" models build --preset small
# Past the workloads' 128 rows: a small pair on a large GPU may stay memory-bound there, and
# the profile's table should show where (or whether) speculation stops paying. On the H200
# the 3-round profile at these ten sizes takes about 6.5 minutes, 3.5 of them the acceptance
# pass (docs/gpu.md).
PROFILE=(--reps 3 --batch-sizes 1,2,4,8,16,32,64,128,256,512)
# One repeat (and its warm-up) at three sizes, 44 configurations: 33 of them took 88 s on the
# H200, where the default eight sizes and two repeats ran past 120 s.
BENCH=(--repeats 1 --batch-sizes 1,16,128)
if [ "$DEVICE" = cpu ]; then
    PROFILE=(--preset micro --batch-sizes 1,2 --contexts 16 --reps 1 --acceptance-rows 8)
    BENCH=(--repeats 1 --batch-sizes 1,4 --new-tokens 16)
fi
case "$STEPS" in *" profile "*)
    step profile 480 "$OUT/profile-$DEVICE.txt" "${SPECRL[@]}" profile --device "$DEVICE" \
        "${PROFILE[@]}" --out "$OUT/profile-$DEVICE.json"
    if [ -f "$OUT/profile-$DEVICE.json" ]; then
        step show 30 "$OUT/profile-$DEVICE-show.txt" \
            "${SPECRL[@]}" profile --show "$OUT/profile-$DEVICE.json"
    fi
    ;;
esac
case "$STEPS" in *" bench "*)
    step bench 240 "$OUT/bench_engine_$DEVICE.txt" "${SPECRL[@]}" bench engine \
        --device "$DEVICE" "${BENCH[@]}" --json "$OUT/bench_engine_$DEVICE.json"
    step tests 150 "$OUT/tests.txt" env SPECRL_TEST_DEVICE="$DEVICE" "$PYTHON" -m pytest -q \
        -p no:cacheprovider tests/test_engine.py tests/test_runner.py tests/test_sampling.py
    ;;
esac
if [ "${#failed[@]}" -ne 0 ]; then
    echo "gpu_check: failed: ${failed[*]}" >&2
    exit 1
fi
