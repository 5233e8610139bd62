"""`specrl sweep` (specrl.sweep): the spec refused before Ray starts, a sweep's summary and
best tables, a failed trial, a sweep killed with SIGKILL and resumed, and --address where no
cluster answers. Trials are runs of seconds on a synthetic profile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from wandb_reader import read_run

from specrl.cli import main
from specrl.errors import SpecrlError
from specrl.profile.synthetic import linear_profile
from specrl.sweep import tune
from specrl.sweep.spec import load_spec, spec_from_json
from specrl.sweep.trial import METRICS_FILE, run_trial, trial_dir
from specrl.train import train

REPO = Path(__file__).resolve().parent.parent
FORMATS = ("table.json", "table-vllm.json", "table-trtllm.json", "table-sglang.json")
TINY_TRAIN = {
    "total_timesteps": 512,
    "n_requests": 8,
    "max_batch": 8,
    "n_envs": 2,
    "n_steps": 64,
    "batch_size": 64,
    "n_epochs": 2,
    "net_arch": [8],
    "checkpoint_every": 128,
    "eval_every": 256,
    "eval_workloads": ["ramp"],
    "eval_episodes": 1,
    "warm_start_episodes": 1,
    "warm_start_epochs": 10,
}
"""A run of about 3 s: batch up to 8, 8-request traces, a network of 8 units."""


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "lin.json"
    linear_profile().save(path)
    return path


def tiny_spec(profile: Path, **changes) -> dict:
    """Two seeds of one tiny configuration, compared on one episode of ramp."""
    spec = {
        "profiles": [str(profile)],
        "workloads": [["ramp", "steady-2", "steady-8"]],
        "seeds": [0, 1],
        "train": dict(TINY_TRAIN),
        "compare": {"workloads": ["ramp"], "episodes": 1},
        "export": {"search": False},
        "wandb": "disabled",
    }
    spec.update(changes)
    return spec


def write_spec(path: Path, spec: dict) -> Path:
    is_yaml = path.suffix == ".yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False) if is_yaml else json.dumps(spec))
    return path


@pytest.fixture(scope="module")
def ray_session():
    """One Ray session for the in-process sweeps (run_sweep uses the one it finds)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def finished(ray_session, profile_path, tmp_path_factory):
    """An uninterrupted sweep of two seeds, wandb offline: (spec file, out, exit code)."""
    root = tmp_path_factory.mktemp("finished")
    spec = write_spec(root / "tiny.yaml", tiny_spec(profile_path, wandb="offline"))
    code = main(["sweep", str(spec), "--out", str(root / "out")])
    return spec, root / "out", code


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if the sweep gets as far as starting Ray."""

    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(tune, "start_ray", refuse)


BAD_SPECS = {
    "unknown key": ({"seed": [0]}, "unknown key seed; did you mean seeds?"),
    "unknown compare key": ({"compare": {"episode": 1}}, "unknown key compare.episode"),
    "no such TrainConfig field": (
        {"train": {"gama": 0.9}},
        "train.gama: TrainConfig has no field 'gama' (did you mean gamma?)",
    ),
    "a field set elsewhere": ({"train": {"seed": 3}}, "train.seed: not set here; list the seeds"),
    "empty seeds": ({"seeds": []}, "seeds is an empty list, and an empty grid has no trials"),
    "empty mixes": ({"workloads": []}, "workloads is an empty list"),
    "empty train axis": ({"train": {"gamma": []}}, "train.gamma is an empty list"),
    "empty profiles": ({"profiles": []}, "profiles is an empty list"),
    "missing profile": (
        {"profiles": ["nowhere/p.json"]},
        "profiles[0]: profile file nowhere/p.json not found",
    ),
    "value TrainConfig refuses": (
        {"train": {**TINY_TRAIN, "gamma": [0.99, 2.0]}},
        "train: gamma must be a number in (0.0, 1.0], got 2.0 (trial lin-",
    ),
    "mix not a list of lists": ({"workloads": ["ramp", "day"]}, "write [[ramp, day]]"),
    "unknown fleet key": (
        {"fleet": [{"acelerator": "accel:H200", "preset": "micro"}]},
        "unknown key fleet[0].acelerator; did you mean fleet[0].accelerator?",
    ),
    "fleet job without a pair": (
        {"fleet": [{"accelerator": "accel:H200"}]},
        "fleet[0]: fleet job on accel:H200: give preset (a default pair) or target and draft",
    ),
    "fleet job with a bad grid": (
        {"fleet": [{"accelerator": "a", "preset": "micro", "grid": {"reps": 0}}]},
        "fleet[0]: reps must be",
    ),
    "two fleet jobs writing one file": (
        {"fleet": [{"accelerator": a, "preset": "micro"} for a in ("accel:H200", "accel_H200")]},
        "fleet (the profile files its jobs write) repeats 'profile-micro-accel_H200.json'",
    ),
    "fleet not a list": ({"fleet": {"accelerator": "a"}}, "fleet must be a list of profiling"),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_a_bad_spec_is_refused_naming_the_key_before_ray_starts(
    case, tmp_path, profile_path, capsys, no_ray
):
    changes, message = BAD_SPECS[case]
    spec = write_spec(tmp_path / "bad.yaml", {**tiny_spec(profile_path), **changes})
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.startswith(f"specrl: error: {spec}: ")
    assert not (tmp_path / "out").exists()


def test_the_spec_grid_yaml_and_json_alike(tmp_path, profile_path):
    train = {**TINY_TRAIN, "net_arch": [[8], [4, 4]], "gamma": [0.9, 0.99]}
    spec_dict = tiny_spec(profile_path, seeds=[0, 1, 2], train=train)
    from_yaml = load_spec(write_spec(tmp_path / "s.yaml", spec_dict))
    from_json = load_spec(write_spec(tmp_path / "s.json", spec_dict))
    assert from_yaml.to_json() == from_json.to_json()
    trials = from_yaml.trials()
    assert len(trials) == 2 * 2 * 3  # net_arch x gamma x seeds
    assert from_yaml.axes == ("net_arch", "gamma")
    assert trials[0].name == "lin-ramp+steady-2+steady-8-net_arch=8,gamma=0.9-s0"
    assert trials[-1].settings == {"net_arch": [4, 4], "gamma": 0.99}
    assert trials[-1].config("r").net_arch == (4, 4)
    # A list field given one list is a value, not an axis.
    single = spec_from_json(tiny_spec(profile_path), source="s")
    assert single.axes == () and single.trials()[0].config("r").net_arch == (8,)


def test_an_out_holding_a_sweep_needs_resume(tmp_path, profile_path, capsys, no_ray):
    spec = write_spec(tmp_path / "s.yaml", tiny_spec(profile_path))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / tune.SPEC_FILE).write_text("{}")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 2
    assert "holds a sweep already" in capsys.readouterr().err
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--resume"]) == 2
    assert "holds a sweep of another spec" in capsys.readouterr().err


def test_a_resume_keeps_the_options_the_sweep_was_started_with(
    tmp_path, profile_path, capsys, no_ray
):
    spec = write_spec(tmp_path / "s.yaml", tiny_spec(profile_path))
    out = tmp_path / "out"
    out.mkdir()
    (out / tune.SPEC_FILE).write_text(json.dumps(load_spec(spec).to_json()))
    (out / tune.OPTIONS_FILE).write_text(json.dumps({"max_concurrent": 1, "cpus_per_trial": 1}))
    command = ["sweep", str(spec), "--out", str(out), "--resume"]
    assert main([*command, "--max-concurrent", "2"]) == 2
    assert (
        f"--max-concurrent 2: the sweep in {out} was started with --max-concurrent 1, and a "
        "resumed sweep keeps it" in capsys.readouterr().err
    )
    assert main([*command, "--cpus-per-trial", "2"]) == 2
    assert "--cpus-per-trial 2: the sweep in" in capsys.readouterr().err
    # Not given, or given as started: the saved options.
    assert tune._options(out, None, None, True) == {"max_concurrent": 1, "cpus_per_trial": 1}
    assert tune._options(out, 1, 1, True) == {"max_concurrent": 1, "cpus_per_trial": 1}
    assert tune._options(out, None, None, False) == {"max_concurrent": None, "cpus_per_trial": 1}


def test_an_address_where_no_cluster_answers_is_refused_within_30_s(
    tmp_path, profile_path, capsys, no_ray
):
    spec = write_spec(tmp_path / "s.yaml", tiny_spec(profile_path))
    clock = time.monotonic()
    args = ["sweep", str(spec), "--out", str(tmp_path / "out"), "--address", "127.0.0.1:1"]
    assert main(args) == 2
    assert time.monotonic() - clock < 30
    err = capsys.readouterr().err
    assert "--address 127.0.0.1:1: no Ray cluster answers there" in err
    assert "ray start --head" in err
    assert not (tmp_path / "out").exists()


def test_a_sweep_writes_mean_and_std_over_seeds_and_the_best_table_in_every_format(finished):
    spec, out, code = finished
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == []
    (row,) = summary["configurations"]
    assert (row["profile"], row["mix"], row["seeds"], row["finished"]) == (
        "lin",
        "ramp+steady-2+steady-8",
        [0, 1],
        [0, 1],
    )
    records = [
        json.loads((out / "trials" / f"lin-ramp+steady-2+steady-8-s{s}" / METRICS_FILE).read_text())
        for s in (0, 1)
    ]
    for key in ("ratio_engineer", "ratio_best_static", "ratio_off", "ramp/tokens_per_s"):
        values = [r["metrics"][key] for r in records]
        assert row["mean"][key] == pytest.approx(sum(values) / 2)
        assert row["std"][key] == pytest.approx(abs(values[0] - values[1]) / 2**0.5)
    header, line = (out / "summary.csv").read_text().splitlines()
    columns = header.split(",")
    assert columns[:5] == ["profile", "mix", "settings", "seeds", "finished"]
    assert "ratio_engineer/mean" in columns and "ratio_engineer/std" in columns
    assert float(line.split(",")[columns.index("ratio_engineer/mean")]) == pytest.approx(
        row["mean"]["ratio_engineer"]
    )
    best = summary["best"]["lin-ramp+steady-2+steady-8"]
    winner = max(records, key=lambda r: r["metrics"]["ratio_engineer"])
    assert best["trial"] == winner["trial"]["name"]
    for name in FORMATS:
        copied = out / "best" / "lin-ramp+steady-2+steady-8" / name
        assert copied.read_bytes() == (out / "trials" / best["trial"] / name).read_bytes()
    # wandb: one run per trial in the sweep's group, and the driver's summary table.
    for record in records:
        run = read_run(Path(record["wandb_run"]))
        assert (run.group, run.name, run.job_type) == ("tiny", record["trial"]["name"], "trial")
        assert run.summary["ratio_engineer"] == pytest.approx(record["metrics"]["ratio_engineer"])
    (summary_run,) = (out / "wandb").glob("offline-run-*")
    run = read_run(summary_run)
    assert (run.group, run.name) == ("tiny", "summary")
    assert (run.summary["summary/nrows"], run.summary["summary/ncols"]) == (1, len(columns))


def test_a_trial_that_raises_is_failed_in_the_summary_and_the_others_finish(
    ray_session, tmp_path, profile_path, capsys
):
    # max_len 8 passes TrainConfig but not training: a request of the presets is longer.
    train = {**TINY_TRAIN, "max_len": [384, 8]}
    spec = write_spec(tmp_path / "s.json", tiny_spec(profile_path, seeds=[0], train=train))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 1
    printed = capsys.readouterr().out
    failed_name = "lin-ramp+steady-2+steady-8-max_len=8-s0"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (failed,) = summary["failed"]
    assert failed["trial"] == failed_name
    assert failed["error"].startswith("SpecrlError: ") and "more than max_len 8" in failed["error"]
    assert f"FAILED {failed_name}: SpecrlError" in printed
    ok, bad = summary["configurations"]
    assert (ok["finished"], bad["finished"], bad["mean"]) == ([0], [], {})
    assert ok["std"]["ratio_engineer"] is None  # one seed: no spread
    other = tmp_path / "out" / "trials" / failed_name.replace("=8", "=384")
    assert (other / METRICS_FILE).is_file()


@pytest.mark.slow  # about 1 minute; a stopped trial's resume is in the default suite below
def test_a_sweep_killed_with_sigkill_resumes_without_retraining_finished_trials(
    finished, profile_path, tmp_path
):
    _, uninterrupted, _ = finished
    # The same trials as the uninterrupted sweep's, without wandb (seconds per run).
    spec = write_spec(tmp_path / "tiny.yaml", tiny_spec(profile_path))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "specrl.cli", "sweep", str(spec), "--out", str(out)]
    sweep = subprocess.Popen(
        [*command, "--max-concurrent", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its Ray processes in its own group, cleaned up below
    )
    try:
        deadline = time.monotonic() + 180
        while not list(out.glob(f"trials/*/{METRICS_FILE}")):
            assert sweep.poll() is None, "the sweep ended before any trial finished"
            assert time.monotonic() < deadline, "no trial finished in 180 s"
            time.sleep(0.2)
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
    finally:
        # Ray's agents outlive a killed driver: end what is left of its group.
        try:
            os.killpg(sweep.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not (out / "summary.json").exists()
    (done,) = [p.parent for p in out.glob(f"trials/*/{METRICS_FILE}")]
    before = {
        name: ((done / name).stat().st_mtime_ns, (done / name).read_bytes())
        for name in (METRICS_FILE, "run/model.zip", "run/summary.json", "table.json")
    }
    resumed = subprocess.run(
        [*command, "--max-concurrent", "1", "--resume"],
        capture_output=True,
        text=True,
        timeout=240,
        start_new_session=True,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for name, (mtime, data) in before.items():
        assert ((done / name).stat().st_mtime_ns, (done / name).read_bytes()) == (mtime, data)
    mine = json.loads((done / METRICS_FILE).read_text())
    theirs = json.loads((uninterrupted / "trials" / done.name / METRICS_FILE).read_text())
    assert mine["training"] == "trained"
    assert mine["metrics"] == theirs["metrics"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == [] and summary["configurations"][0]["finished"] == [0, 1]


def test_a_trial_continues_from_its_last_checkpoint_and_is_not_retrained(tmp_path, profile_path):
    from train_helpers import crash_after

    (trial,) = spec_from_json(tiny_spec(profile_path, seeds=[0]), source="s").trials()
    where = trial_dir(tmp_path, trial)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(trial.config(str(where / "run")), progress=False, callbacks=[crash_after(300)])
    assert sorted(p.name for p in (where / "run" / "checkpoints").iterdir())
    record = run_trial(trial, tmp_path)
    assert record["training"] == "resumed"
    assert sorted(record["exports"]) == ["native", "sglang", "trtllm", "vllm"]
    stamp = (where / METRICS_FILE).stat().st_mtime_ns
    assert run_trial(trial, tmp_path) == record  # finished: returned as it is
    assert (where / METRICS_FILE).stat().st_mtime_ns == stamp
    # Finished under other defaults (the observation of stop 68's runs): refused, not mixed
    # into the new trials' mean; the record and the run are left as they are.
    saved = json.loads((where / "run" / "config.json").read_text())
    (where / "run" / "config.json").write_text(
        json.dumps({**saved, "acceptance_estimate": "steps"})
    )
    with pytest.raises(
        SpecrlError, match=r"acceptance_estimate: 'steps' then, 'usable' now.*defaults changed"
    ):
        run_trial(trial, tmp_path)
    assert (where / METRICS_FILE).stat().st_mtime_ns == stamp
    (where / "run" / "config.json").write_text(json.dumps(saved))
    # Stopped after its final checkpoint, before its summary: on from the checkpoint before.
    for name in (METRICS_FILE, "run/summary.json", "run/model.zip"):
        (where / name).unlink()
    assert run_trial(trial, tmp_path)["training"] == "resumed"


def test_importing_specrl_and_building_the_command_line_import_no_ray():
    code = (
        "import sys, specrl, specrl.sweep, specrl.cli; specrl.cli.build_parser(); "
        "assert 'ray' not in sys.modules and 'yaml' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_experiment_script_shares_the_sweep(tmp_path, profile_path, no_ray):
    done = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "sweep.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--spec", "--out", "--address", "--max-concurrent", "--cpus-per-trial"):
        assert flag in done.stdout
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        import sweep as script
    finally:
        sys.path.remove(str(REPO / "experiments"))
    spec = write_spec(tmp_path / "s.yaml", {**tiny_spec(profile_path), "seeds": []})
    assert script.main(["--spec", str(spec), "--out", str(tmp_path / "out")]) == 2


def test_a_live_trial_on_a_profile_of_another_machine_is_refused_and_marked_failed(
    tmp_path, profile_path, micro_pair_paths, monkeypatch
):
    from specrl.sweep.summary import summarize

    monkeypatch.setenv("SPECRL_HOME", str(Path(micro_pair_paths.target_path).parents[2]))
    live = {**TINY_TRAIN, "env": "live", "preset": "micro", "n_envs": 1, "n_steps": 64}
    spec = spec_from_json(tiny_spec(profile_path, seeds=[0], train=live), source="s")
    (trial,) = spec.trials(tmp_path)
    with pytest.raises(SpecrlError, match="profile was measured on other hardware or another"):
        run_trial(trial, tmp_path)
    assert not trial_dir(tmp_path, trial).joinpath("run", "model.zip").exists()
    summary = summarize([trial], tmp_path)
    assert list(summary.failed) == [trial.name]
    assert summary.failed[trial.name].startswith(
        "SpecrlError: profile was measured on other hardware or another model pair (device: "
        "'synthetic' vs here 'cpu: "
    )
