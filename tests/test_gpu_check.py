"""``experiments/gpu_check.sh`` as a dry run on the CPU (``GPU_CHECK_DEVICE=cpu``), so the
script a lent GPU runs unattended is known to work before one is lent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specrl.profile.schema import load_profile

REPO = Path(__file__).resolve().parent.parent


def _run_script(env: dict, timeout: int) -> subprocess.CompletedProcess:
    """``experiments/gpu_check.sh`` under ``env``, its output captured."""
    argv = ["bash", str(REPO / "experiments" / "gpu_check.sh")]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # about 2 minutes on 2 cores; run with `pytest -m slow`
def test_gpu_check_dry_run_writes_every_figure(tmp_path):
    out = tmp_path / "out"
    env = os.environ | {"GPU_CHECK_DEVICE": "cpu", "OUT": str(out), "PYTHON": sys.executable}
    done = _run_script(env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "device.txt").read_text().startswith("cpu (dry run) torch ")
    tests = (out / "tests.txt").read_text()
    assert re.search(r"\d+ passed", tests) and not re.search(r"\d+ (failed|errors?)\b", tests)
    bench = json.loads((out / "bench_engine_cpu.json").read_text())
    assert bench["batch_sizes"] == [1, 4] and bench["new_tokens"] == 16
    for by_k in bench["tokens_per_s"].values():
        assert sorted(by_k) == [str(k) for k in range(bench["k_max"] + 1)]
        assert all(v > 0 for v in by_k.values())
    profile = load_profile(out / "profile-cpu.json")
    assert profile.batch_sizes == [1, 2] and profile.fingerprint["device"].startswith("cpu")
    shown = (out / "profile-cpu-show.txt").read_text()
    assert "| batch | off | K=1 |" in shown and "acceptance by position" in shown


def test_gpu_check_goes_on_past_a_failed_step_and_names_it(tmp_path):
    """A lent GPU is used once: a benchmark that fails and a profile that times out leave the
    next steps to run, and the script exits 1 naming both. A ``timeout`` shim stands in for
    the build, benchmark, profile and tests steps (the models are not run)."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "timeout").write_text(
        "#!/usr/bin/env bash\n"
        'case "$*" in\n'
        '  *" models build "*) echo "build ran"; exit 0 ;;\n'
        '  *" bench engine "*) echo "bench ran"; exit 3 ;;\n'
        '  *" profile --device "*) echo "profile ran"; exit 124 ;;\n'
        '  *pytest*) echo "tests ran: $*"; exit 0 ;;\n'
        "esac\n"
        "exit 99\n"
    )
    (shims / "timeout").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    (out / "profile-cpu.json").write_text("{}")  # an earlier run's: not shown as this one's
    env = os.environ | {
        "GPU_CHECK_DEVICE": "cpu",
        "OUT": str(out),
        "PYTHON": sys.executable,
        "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
    }
    done = _run_script(env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.rstrip().endswith("gpu_check: failed: bench profile")
    assert (out / "build.txt").read_text() == "build ran\n"
    bench = (out / "bench_engine_cpu.txt").read_text()
    assert bench == "bench ran\ngpu_check: bench failed (exit 3)\n"
    profile = (out / "profile-cpu.txt").read_text()
    assert profile == "profile ran\ngpu_check: profile timed out after 240 s\n"
    assert not (out / "profile-cpu-show.txt").exists()  # no profile to show
    tests = (out / "tests.txt").read_text()
    head = f"tests ran: -k 15 150 env SPECRL_TEST_DEVICE=cpu {sys.executable} -m pytest "
    assert tests.startswith(head)
    assert tests.endswith(" tests/test_engine.py tests/test_runner.py tests/test_sampling.py\n")


def test_the_gpu_steps_need_neither_gymnasium_nor_stable_baselines3_nor_wandb(
    micro_pair_paths, tmp_path
):
    """The GPU image has torch and transformers but none of these three: the command line
    still builds, and a profile and an engine benchmark run, on the micro pair here."""
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    profile = tmp_path / "p.json"
    bench = tmp_path / "b.json"
    code = f"""
import sys
for name in ("gymnasium", "stable_baselines3", "wandb"):
    sys.modules[name] = None  # import raises ImportError
from specrl.cli import main
grid = ["--batch-sizes", "1", "--contexts", "8", "--reps", "1", "--k-max", "2"]
pair = ["--target", {target!r}, "--draft", {draft!r}]
assert main(["profile", *pair, *grid, "--acceptance-rows", "1", "--out", {str(profile)!r}]) == 0
args = ["--batch-sizes", "1", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1"]
assert main(["bench", "engine", *pair, *args, "--json", {str(bench)!r}]) == 0
import specrl.envs
try:
    specrl.envs.SurrogateSpecEnv
except ImportError as err:
    print("envs need:", err.name)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.endswith("envs need: gymnasium\n")
    assert load_profile(profile).batch_sizes == [1]
    assert json.loads(bench.read_text())["batch_sizes"] == [1]
