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


def _run_script(env: dict, timeout: int, *part: str) -> subprocess.CompletedProcess:
    """``experiments/gpu_check.sh [PART]`` under ``env``, its output captured."""
    argv = ["bash", str(REPO / "experiments" / "gpu_check.sh"), *part]
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


def _shimmed_env(tmp_path: Path) -> dict:
    """A dry run's environment in which a ``timeout`` shim stands in for the build, benchmark,
    profile and tests steps (the models are not run): the benchmark fails and the profile
    times out."""
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
    return os.environ | {
        "GPU_CHECK_DEVICE": "cpu",
        "OUT": str(out),
        "PYTHON": sys.executable,
        "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
    }


def test_gpu_check_goes_on_past_a_failed_step_and_names_it(tmp_path):
    """A lent GPU is used once: a profile that times out and a benchmark that fails leave the
    next steps to run, and the script exits 1 naming both."""
    env = _shimmed_env(tmp_path)
    out = Path(env["OUT"])
    (out / "profile-cpu.json").write_text("{}")  # an earlier run's: not shown as this one's
    done = _run_script(env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.rstrip().endswith("gpu_check: failed: profile bench")
    assert (out / "build.txt").read_text() == "build ran\n"
    bench = (out / "bench_engine_cpu.txt").read_text()
    assert bench == "bench ran\ngpu_check: bench failed (exit 3)\n"
    profile = (out / "profile-cpu.txt").read_text()
    assert profile == "profile ran\ngpu_check: profile timed out after 480 s\n"
    assert not (out / "profile-cpu-show.txt").exists()  # no profile to show
    tests = (out / "tests.txt").read_text()
    head = f"tests ran: -k 15 150 env SPECRL_TEST_DEVICE=cpu {sys.executable} -m pytest "
    assert tests.startswith(head)
    assert tests.endswith(" tests/test_engine.py tests/test_runner.py tests/test_sampling.py\n")


def test_gpu_check_runs_in_two_parts_that_each_fit_a_device_command(tmp_path):
    """``profile`` runs the build, profile and table steps; ``engine`` the build, benchmark
    and tests, and leaves the profile part's files alone; their limits each sum to under a
    device command's 600 s; another part name is refused."""
    env = _shimmed_env(tmp_path)
    out = Path(env["OUT"])
    done = _run_script(env, 300, "profile")
    assert done.returncode == 1 and done.stderr.rstrip().endswith("gpu_check: failed: profile")
    assert not (out / "bench_engine_cpu.txt").exists() and not (out / "tests.txt").exists()
    done = _run_script(env, 300, "engine")
    assert done.returncode == 1 and done.stderr.rstrip().endswith("gpu_check: failed: bench")
    assert (out / "profile-cpu.txt").read_text().startswith("profile ran\n")
    assert (out / "tests.txt").read_text().startswith("tests ran: -k 15 150 ")
    script = (REPO / "experiments" / "gpu_check.sh").read_text()
    limits = {m[0]: int(m[1]) for m in re.findall(r"step (\w+) (\d+) ", script)}
    assert limits["build"] + limits["profile"] + limits["show"] < 600
    assert limits["build"] + limits["bench"] + limits["tests"] < 600
    done = _run_script(env, 60, "everything")
    assert done.returncode == 2 and "unknown part 'everything'" in done.stderr


def test_the_gpu_steps_need_neither_gymnasium_nor_stable_baselines3_nor_wandb_nor_tyro(
    micro_pair_paths, tmp_path
):
    """The GPU image has torch and transformers but none of these (tyro's absence stopped
    the first lent GPU's run): the command line still builds, a profile and an engine
    benchmark run, on the micro pair here, and a command that needs one says which."""
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    profile = tmp_path / "p.json"
    bench = tmp_path / "b.json"
    code = f"""
import sys
for name in ("gymnasium", "stable_baselines3", "wandb", "tyro"):
    sys.modules[name] = None  # import raises ModuleNotFoundError
from specrl.cli import main
grid = ["--batch-sizes", "1", "--contexts", "8", "--reps", "1", "--k-max", "2"]
pair = ["--target", {target!r}, "--draft", {draft!r}]
assert main(["profile", *pair, *grid, "--acceptance-rows", "1", "--out", {str(profile)!r}]) == 0
args = ["--batch-sizes", "1", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1"]
assert main(["bench", "engine", *pair, *args, "--json", {str(bench)!r}]) == 0
assert main(["train", "--timesteps", "8"]) == 2
import specrl.envs
try:
    specrl.envs.SurrogateSpecEnv
except ImportError as err:
    print("envs need:", err.name)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.endswith("envs need: gymnasium\n")
    assert "specrl: error: `specrl train` needs the package 'tyro'" in done.stderr
    assert load_profile(profile).batch_sizes == [1]
    assert json.loads(bench.read_text())["batch_sizes"] == [1]
