"""PPO training: the training env's reward and observation, tiny runs that write a model,
checkpoints and a summary, resume after a crash and after ``kill -9``, refusals that write
nothing, wandb's offline history, and the experiment script's --help."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from train_helpers import assert_resumed_from, capture, crash_after, tiny
from wandb_reader import read_run

from specrl.envs import SurrogateSpecEnv
from specrl.envs.training import (
    PROBE,
    RateReference,
    TrainingEnv,
    apply_probe,
    policy_observation,
    profile_reference,
)
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.profile.synthetic import linear_profile
from specrl.train import TrainConfig, latest_checkpoint, load_config, train
from specrl.train.envs import make_training_env, new_reference
from specrl.train.to_table import check_fidelity, table_from_run
from specrl.workload import preset_trace, profile_workload_kwargs, temperature_band

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "linear.json"
    linear_profile().save(path)
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, profile_path) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(tiny(run_dir, profile_path), progress=False)
    return run_dir


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# ----------------------------------------------------------------------------- config


def test_config_rejects_bad_settings_with_the_field_name(tmp_path):
    for changes, words in (
        ({"batch_size": 4096}, "batch_size"),
        ({"workloads": ("ramp", "weekend")}, "workloads"),
        ({"workloads": ()}, "workloads"),
        ({"gamma": 0.0}, "gamma"),
        ({"wandb": "cloud"}, "wandb"),
        ({"net_arch": (8, 0)}, "net_arch"),
        ({"eval_seed": 1, "seed": 0}, "overlap"),
        ({"total_timesteps": 0}, "total_timesteps"),
    ):
        with pytest.raises(SpecrlError, match=words):
            TrainConfig(out=str(tmp_path), **changes)


def test_config_round_trips_through_json_and_rejects_unknown_fields(tmp_path):
    config = TrainConfig(out=str(tmp_path / "run"), net_arch=[16, 16], workloads=["ramp"])
    assert config.net_arch == (16, 16) and config.workloads == ("ramp",)
    assert TrainConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    with pytest.raises(SpecrlError, match="unknown fields \\['lr'\\]"):
        TrainConfig.from_json({**config.to_json(), "lr": 1e-3})
    with pytest.raises(SpecrlError, match="n_envs"):
        TrainConfig.from_json({**config.to_json(), "n_envs": "8"})


def test_the_mix_counts_each_workload_once_at_the_rows_it_serves(tmp_path):
    """A steady workload above max_batch serves at max_batch (the preset caps it), so two of
    them are one workload: the uniform mix keeps one, named for the rows it serves, and so
    does a config read back from a run written before."""
    from specrl.workload import preset_trace

    config = TrainConfig(out=str(tmp_path / "run"), max_batch=32)
    assert config.workloads == (
        "mixed", "ramp", "day", "bursts", "steady-1", "steady-8", "steady-32"
    )  # fmt: skip
    assert TrainConfig(out=str(tmp_path / "run")).workloads[-2:] == ("steady-64", "steady-128")
    old = {**config.to_json(), "workloads": ["steady-64", "ramp", "steady-128", "steady-32"]}
    assert TrainConfig.from_json(old).workloads == ("steady-32", "ramp")
    small = TrainConfig(out=str(tmp_path / "r"), max_batch=4, eval_workloads=["steady-8", "day"])
    assert small.eval_workloads == ("steady-4", "day")
    for name in ("steady-64", "steady-128"):
        capped = preset_trace(name, peak=32, seed=3)
        assert capped.requests == preset_trace("steady-32", peak=32, seed=3).requests


# ----------------------------------------------------------------------------- the env


def test_training_env_centres_each_step_at_the_rate_reached_at_its_batch_size(profile_path):
    config = tiny(Path("unused"), profile_path, shape_catchup=False)
    reference = new_reference(config, linear_profile())
    env = make_training_env(config, linear_profile(), reference)
    other = make_training_env(config, linear_profile(), reference)
    assert other.reference is env.reference
    obs, _ = env.reset(seed=3)
    assert obs.shape == (3,) and env.observation_space.contains(obs)
    for k in (2, 0, 4, 1, 4, 4):
        before = [reference.rate(rows) for rows in range(9)]
        obs, reward, *_, info = env.step(k)
        rows = max(info["batch"], 1)
        rho = before[rows]
        assert reward == pytest.approx((info["committed"] - rho * info["step_time_s"]) / rows)
        assert reference.rate(rows) != rho  # the step is added after its reward
        full = SurrogateSpecEnv._get_obs(env.unwrapped)  # the env's own observation
        assert info["k"] == k  # fresh estimate: no probe
        assert obs[0] == pytest.approx(np.log(max(round(full[0] * 8), 1)) / np.log(8))
        assert obs[1] == pytest.approx(full[2]) and obs[2] == 0.0
    assert env.env_seconds > 0


def test_training_env_observation_is_policy_observation_of_the_envs_own(profile_path):
    """The training env computes its three entries straight from its state; they must equal
    ``policy_observation`` of the full observation exactly, fresh and stale."""
    config = tiny(Path("unused"), profile_path, workloads=("ramp",), n_requests=24)
    env = make_training_env(config, linear_profile())
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=1)
    seen_stale = seen_fresh = 0
    for step in range(2000):
        want = policy_observation(SurrogateSpecEnv._get_obs(env.unwrapped), config.max_batch)
        assert obs.dtype == want.dtype and obs.tolist() == want.tolist()
        seen_stale += int(obs[2] == 1.0)
        seen_fresh += int(obs[2] == 0.0)
        k = 0 if (step // 50) % 2 else int(rng.integers(1, 5))  # 50-step stretches of K=0
        obs, _, done, _, _ = env.step(k)
        if done:
            obs, _ = env.reset()
    assert seen_stale > 100 and seen_fresh > 100


def test_training_env_probes_when_k0_has_not_drafted_for_the_probe_interval(profile_path):
    """K=0 after ``PROBE["after_steps"]`` steps without drafting runs the probe's K, as the
    exported table's controller does; before that K=0 is K=0. Nothing measured yet counts as
    past the interval: the first step probes."""
    config = tiny(Path("unused"), profile_path, workloads=("steady-8",), n_requests=400)
    env = make_training_env(config, linear_profile())
    obs, _ = env.reset(seed=0)
    assert obs[2] == 1.0 and obs[1] == 0.0  # stale: acceptance reads 0
    ks = []
    for _ in range(2 * (PROBE["after_steps"] + 1)):
        obs, *_, info = env.step(0)
        ks.append(info["k"])
        assert not obs[2] or info["k"] == 0  # a probe leaves the estimate fresh
    probe = [PROBE["k"]]
    assert ks == (probe + [0] * PROBE["after_steps"]) * 2


def test_catchup_shaping_adds_the_discounted_change_of_the_debt_potential(profile_path):
    """With shaping the reward is the unshaped one plus gamma * Phi(s') - Phi(s), Phi the
    catch-up the running rows owe, priced at rho(B) / B; K=0 steps grow the debt (Phi falls)
    and the step that drafts again pays it and recovers it."""
    config = tiny(Path("unused"), profile_path, workloads=("steady-8",), n_requests=64)
    shaped = make_training_env(config, linear_profile())
    plain = make_training_env(
        tiny(
            Path("unused"),
            profile_path,
            workloads=("steady-8",),
            n_requests=64,
            shape_catchup=False,
        ),
        linear_profile(),
    )
    shaped.reset(seed=4)
    plain.reset(seed=4)
    gamma = config.gamma
    potentials = [shaped._potential()]
    for k in (2, 0, 0, 0, 0, 0, 3, 1):
        rate_plain = plain.reference.rate(max(plain.unwrapped._batch_ahead(), 1))
        assert shaped.reference.rate(max(shaped.unwrapped._batch_ahead(), 1)) == rate_plain
        _, r_shaped, done, *_ = shaped.step(k)
        _, r_plain, *_ = plain.step(k)
        potentials.append(0.0 if done else shaped._potential())
        assert r_shaped == pytest.approx(r_plain + gamma * potentials[-1] - potentials[-2])
    assert min(potentials[2:7]) < potentials[1] <= 0.0  # K=0 steps run up a debt
    assert potentials[2] > potentials[6]  # growing with every K=0 step


def test_rate_reference_starts_at_the_profile_and_follows_the_rates_reached():
    profile = linear_profile()
    initial = profile_reference(profile, 128, 4)
    for i, batch in enumerate(profile.batch_sizes):
        assert initial[batch] == pytest.approx(max(profile.tokens_per_s[i]))
    reference = RateReference(initial, weight=0.5)
    assert reference.rate(3) == initial[3]
    reference.observe(3, committed=6, seconds=0.1)
    assert reference.rate(3) == pytest.approx(60.0)
    reference.observe(3, committed=2, seconds=0.1)
    # Weighted sums over weighted sums: (0.25 * 6 + 0.5 * 2) / (0.25 * 0.1 + 0.5 * 0.1).
    assert reference.rate(3) == pytest.approx(2.5 / 0.075)
    assert reference.rate(4) == initial[4]
    restored = RateReference(initial)
    restored.load_json(json.loads(json.dumps(reference.to_json())), "test")
    assert restored.rate(3) == reference.rate(3)
    with pytest.raises(SpecrlError, match="'reference' must hold"):
        restored.load_json({"tokens": [1.0]}, "test")


def test_rate_reference_averages_decoding_alone_and_charges_the_whole_step():
    reference = RateReference(np.full(9, 50.0), weight=1.0)
    info = {"committed": 10, "step_time_s": 0.5, "admitted": 4, "prefill_s": 0.3}
    reward = reference.charge(2, info, 2)
    assert reward == pytest.approx((10 - 50.0 * 0.5) / 2)  # the rate read before the step
    assert reference.rate(2) == pytest.approx(6 / 0.2)  # the prefill is not averaged in
    only_prefill = {"committed": 3, "step_time_s": 0.2, "admitted": 3, "prefill_s": 0.2}
    reference.charge(5, only_prefill, 5)
    assert reference.rate(5) == 50.0  # nothing decoded: the initial rate stays


def test_rate_reference_floor_holds_where_the_teacher_ran_enough_steps():
    reference = RateReference(np.full(9, 50.0), weight=1.0)
    tokens, seconds, steps = np.zeros(9), np.zeros(9), np.zeros(9, dtype=np.int64)
    tokens[3], seconds[3], steps[3] = 320.0, 4.0, 32  # 80 tokens/s over 32 steps
    tokens[4], seconds[4], steps[4] = 310.0, 1.0, 31  # too few steps to trust
    reference.set_floor(tokens, seconds, steps)
    assert reference.rate(3) == 80.0 and reference.rate(4) == 50.0
    reference.observe(3, committed=9, seconds=0.1)  # 90 tokens/s: above the floor
    assert reference.rate(3) == pytest.approx(90.0)
    reference.observe(3, committed=6, seconds=0.1)  # 60 tokens/s: the floor holds
    assert reference.rate(3) == 80.0
    restored = RateReference(np.full(9, 50.0))
    restored.load_json(json.loads(json.dumps(reference.to_json())), "test")
    assert restored.rate(3) == 80.0 and restored.rate(4) == reference.rate(4)
    state = reference.to_json()
    del state["floor"]  # a checkpoint from before the floor: none
    restored.load_json(state, "test")
    assert restored.rate(3) == pytest.approx(60.0)
    with pytest.raises(SpecrlError, match="'reference' must hold"):
        restored.load_json({**reference.to_json(), "floor": [1.0]}, "test")


def test_warm_start_floors_the_reference_at_the_teachers_decode_rates(tmp_path, profile_path):
    from stable_baselines3 import PPO

    from specrl.policies import make_policy
    from specrl.seeds import WARM_START_SEED
    from specrl.train.envs import surrogate_env
    from specrl.train.warm_start import warm_start

    config = tiny(tmp_path / "run", profile_path, warm_start_episodes=2)
    profile = linear_profile()
    env = make_training_env(config, profile)
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, policy_kwargs={"net_arch": [8]})
    reference = new_reference(config, profile)
    cloned = warm_start(model, config, profile, progress=False, reference=reference)
    # Independently: every step's info from the oracle on the same seeds (episode j of
    # workload i: WARM_START_SEED + i + j * workloads), then decode tokens and seconds summed
    # per batch size.
    infos = []
    n = len(config.workloads)
    for j in range(2):
        for i, name in enumerate(config.workloads):
            env = surrogate_env(config, profile, name)
            oracle = make_policy("oracle", env=env)
            obs, _ = env.reset(seed=WARM_START_SEED + i + j * n)
            terminated = False
            while not terminated:
                obs, _, terminated, _, info = env.step(oracle.predict(obs)[0])
                infos.append(info)
    assert cloned["states"] == len(infos)
    rows = np.array([max(x["batch"], 1) for x in infos])
    decoded = np.array([x["committed"] - x["admitted"] for x in infos], dtype=np.float64)
    decode_s = np.array([x["step_time_s"] - x["prefill_s"] for x in infos])
    tokens = np.bincount(rows, weights=decoded, minlength=9)
    seconds = np.bincount(rows, weights=decode_s, minlength=9)
    steps = np.bincount(rows, minlength=9)
    trusted = steps >= 32
    assert trusted.any() and not trusted.all()
    assert reference.floor[trusted] == pytest.approx(tokens[trusted] / seconds[trusted])
    assert (reference.floor[~trusted] == 0).all()


def test_a_version_1_run_is_refused_whole(tmp_path, profile_path):
    """Version 1 runs observed accepted / drafted: resuming or exporting one is refused with
    the reason, and nothing in the run directory changes."""
    config = tiny(tmp_path / "run", profile_path, total_timesteps=256, eval_every=0)
    train(config, progress=False)
    run = tmp_path / "run"
    for path in [run / "config.json", *run.glob("checkpoints/*/state.json")]:
        obj = json.loads(path.read_text())
        obj.get("config", obj)["version"] = 1
        path.write_text(json.dumps(obj))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(SpecrlError, match="'version' is 1.*accepted / drafted"):
        load_config(run)
    with pytest.raises(SpecrlError, match="'version' is 1"):
        train(TrainConfig.from_json({**config.to_json(), "total_timesteps": 512}), resume=True)
    with pytest.raises(SpecrlError, match="'version' is 1"):
        table_from_run(run)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_the_floor_is_kept_by_a_surrogate_fine_tune_only_where_the_config_asks(
    tmp_path, profile_path
):
    from specrl.train.envs import floors_reference

    source = tmp_path / "source"
    train(tiny(source, profile_path, total_timesteps=256, eval_every=0), progress=False)

    def floor(run_dir):
        state = latest_checkpoint(run_dir).state
        return np.asarray(state["reference"]["floor"])

    assert floor(source).any()  # the warm start's teacher set it
    kept = tiny(tmp_path / "kept", profile_path, total_timesteps=256, init=str(source))
    train(kept, progress=False)
    assert floor(tmp_path / "kept") == pytest.approx(floor(source))
    dropped = tiny(
        tmp_path / "dropped",
        profile_path,
        total_timesteps=256,
        init=str(source),
        reference_floor=False,
    )
    train(dropped, progress=False)
    assert not floor(tmp_path / "dropped").any()
    assert floors_reference(kept)
    assert not floors_reference(dataclasses.replace(kept, env="live", n_envs=1))


def test_training_env_draws_workloads_from_its_seeded_stream(profile_path):
    config = tiny(Path("unused"), profile_path)

    def drawn(seed: int) -> list[str]:
        env = make_training_env(config, linear_profile())
        env.reset(seed=seed)
        names = [env.unwrapped.workload]
        for _ in range(11):
            env.reset()
            names.append(env.unwrapped.workload)
        return names

    assert drawn(5) == drawn(5)
    assert set(drawn(5)) == set(config.workloads)
    assert isinstance(make_training_env(config, linear_profile()), TrainingEnv)


# ----------------------------------------------------------------------------- runs


def test_tiny_run_writes_model_checkpoints_and_summary(finished_run):
    from specrl.policies.ppo import PPOPolicy

    names = sorted(p.name for p in (finished_run / "checkpoints").iterdir())
    assert names == ["step-000000000256", "step-000000000512"]
    summary = json.loads((finished_run / "summary.json").read_text())
    assert summary["num_timesteps"] == 512
    final = summary["final_eval"]
    assert set(final["by_workload"]) == {"ramp"}
    assert 0 < final["ratio_best_static"] < 2 and 0 < final["ratio_oracle"] < 2
    assert [e["timesteps"] for e in summary["eval_history"]] == [256, 512]
    timing = summary["timing"]
    assert timing["steps"] == 512 and 0 < timing["env_share"] < 1
    assert len(summary["profile_sha256"]) == 64
    assert load_config(finished_run).total_timesteps == 512

    policy = PPOPolicy.load(finished_run)
    assert policy.model.observation_space.shape == (3,)
    plain = SurrogateSpecEnv(profile=linear_profile(), workload="ramp", max_batch=8)
    obs, _ = plain.reset(seed=0)
    action, state = policy.predict(obs)
    assert isinstance(action, np.int64) and 0 <= action <= 4 and state is None
    assert policy.predict(np.stack([obs, obs]))[0].shape == (2,)


def test_a_run_directory_is_never_trained_over(finished_run):
    before = snapshot(finished_run)
    with pytest.raises(SpecrlError, match="already holds a run.*--resume"):
        train(load_config(finished_run), progress=False)
    with pytest.raises(SpecrlError, match="trained to 512 steps already"):
        train(load_config(finished_run), resume=True, progress=False)
    assert snapshot(finished_run) == before


def test_resume_after_a_crash_continues_from_the_last_checkpoint(tmp_path, profile_path):
    config = tiny(tmp_path / "run", profile_path, total_timesteps=768, eval_every=0)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(config, progress=False, callbacks=[crash_after(400)])
    checkpoint = latest_checkpoint(config.out)
    assert checkpoint.num_timesteps == 256
    assert not (tmp_path / "run" / "model.zip").exists()
    # A save cut by the crash leaves a hidden partial directory; resume ignores it.
    partial = tmp_path / "run" / "checkpoints" / ".partial-step-000000000512"
    partial.mkdir()
    (partial / "model.zip").write_bytes(b"PK\x03")

    captured: dict = {}
    result = train(config, resume=True, progress=False, callbacks=[capture(captured)])
    assert_resumed_from(captured, checkpoint)
    assert result.num_timesteps == 768
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert names == ["step-000000000256", "step-000000000512", "step-000000000768"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_timesteps"] == 768


def test_resume_restores_the_best_model_its_checkpoint_saved(tmp_path, profile_path):
    run_dir = tmp_path / "run"
    config = tiny(run_dir, profile_path, total_timesteps=768)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(config, progress=False, callbacks=[crash_after(400)])
    checkpoint = latest_checkpoint(run_dir)
    saved = checkpoint.path / "best_model.zip"
    assert checkpoint.state["best"]["timesteps"] == 256 and saved.is_file()
    # An evaluation after the checkpoint, in the stretch the crash discards, wrote its own.
    (run_dir / "best_model.zip").write_bytes(b"a model of the discarded stretch")
    at_start: dict = {}

    class Peek:
        def __new__(cls):
            from stable_baselines3.common.callbacks import BaseCallback

            class P(BaseCallback):
                def _on_training_start(self) -> None:
                    at_start["best"] = (run_dir / "best_model.zip").read_bytes()

                def _on_step(self) -> bool:
                    return True

            return P()

    train(config, resume=True, progress=False, callbacks=[Peek()])
    assert at_start["best"] == saved.read_bytes()
    summary = json.loads((run_dir / "summary.json").read_text())
    best = max(summary["eval_history"], key=lambda e: e["ratio_best_static"])
    assert summary["model_eval"] == best


def test_a_run_stopped_between_final_checkpoint_and_summary_says_how_to_finish(
    tmp_path, finished_run
):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "summary.json").unlink()  # as an older specrl could leave a run
    final = latest_checkpoint(run_dir).path
    config = TrainConfig.from_json({**load_config(run_dir).to_json(), "out": str(run_dir)})
    with pytest.raises(SpecrlError, match=f"stopped after its final checkpoint.*delete {final}"):
        train(config, resume=True, progress=False)
    shutil.rmtree(final)  # as the message says
    result = train(config, resume=True, progress=False)
    assert result.num_timesteps == 512
    assert json.loads((run_dir / "summary.json").read_text())["num_timesteps"] == 512


def test_a_raised_total_is_what_a_plain_resume_goes_on_to(tmp_path, finished_run):
    from specrl.cli import build_parser
    from specrl.cli.train import config_from_args

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    copied = {**load_config(run_dir).to_json(), "out": str(run_dir)}
    longer = TrainConfig.from_json({**copied, "total_timesteps": 1024})
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(longer, resume=True, progress=False, callbacks=[crash_after(800)])
    assert latest_checkpoint(run_dir).num_timesteps == 768
    assert load_config(run_dir).total_timesteps == 1024
    args = build_parser().parse_args(["train", "--resume", str(run_dir)])
    config, resume = config_from_args(args)
    assert (config.total_timesteps, resume) == (1024, True)


def _specrl_train(*argv: str, **popen) -> subprocess.Popen:
    """``specrl train ARGV`` in a child process."""
    command = [sys.executable, "-m", "specrl.cli", "train", *argv, "--no-progress"]
    return subprocess.Popen(command, text=True, **popen)


def test_kill_9_then_resume_through_the_cli_equals_a_run_never_stopped(tmp_path, profile_path):
    """``specrl train`` killed with SIGKILL as its first checkpoint lands, then ``specrl train
    --resume``: the finished run is the run never stopped, bit for bit (weights, every
    evaluation, the chosen model, the actions on a grid of observations). Exact, not within a
    tolerance: the surrogate, the policy's sampling and PPO's minibatches draw only from the
    checkpointed RNGs and envs."""
    from stable_baselines3 import PPO

    run_dir, config_file = tmp_path / "run", tmp_path / "tiny.json"
    config = tiny(run_dir, profile_path, total_timesteps=1024, eval_every=512)
    config.save(config_file)
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as stderr:
        child = _specrl_train(
            "--config",
            str(config_file),
            "--out",
            str(run_dir),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    deadline = time.monotonic() + 90
    try:
        while not any((run_dir / "checkpoints").glob("step-*")):
            assert child.poll() is None, errors.read_text()
            assert time.monotonic() < deadline, "no checkpoint within 90 s"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    stopped_at = latest_checkpoint(run_dir).num_timesteps
    assert stopped_at < 1024 and not (run_dir / "summary.json").exists(), "killed too late"

    resumed = _specrl_train(
        "--resume", str(run_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert f"resuming {run_dir} from its checkpoint at step {stopped_at:,}" in out

    never_stopped = train(
        tiny(tmp_path / "never", profile_path, total_timesteps=1024, eval_every=512), progress=False
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_timesteps"] == never_stopped.num_timesteps == 1024
    for key in ("final_eval", "eval_history", "model_eval"):
        assert summary[key] == never_stopped.summary[key], key
    assert summary["warm_start"]["accuracy"] == never_stopped.summary["warm_start"]["accuracy"]
    for name in ("last_model.zip", "model.zip"):
        theirs = PPO.load(run_dir / name, device="cpu").policy
        ours = PPO.load(tmp_path / "never" / name, device="cpu").policy
        assert all(
            torch.equal(a, b)
            for a, b in zip(theirs.state_dict().values(), ours.state_dict().values())
        )
    grid = np.stack(np.meshgrid(*[np.linspace(0, 1, 11)] * 3), -1).reshape(-1, 3)
    policy = PPO.load(run_dir / "model.zip", device="cpu")
    reference = PPO.load(tmp_path / "never" / "model.zip", device="cpu")
    actions, _ = policy.predict(grid.astype(np.float32), deterministic=True)
    expected, _ = reference.predict(grid.astype(np.float32), deterministic=True)
    assert np.array_equal(actions, expected)
    assert len(set(expected.tolist())) > 1, "a grid on which the policy chooses more than one K"


def test_resume_refuses_missing_and_corrupt_run_dirs_and_writes_nothing(
    tmp_path, profile_path, finished_run, capsys
):
    from specrl.cli import main

    missing = tmp_path / "missing"
    with pytest.raises(SpecrlError, match=f"cannot resume {missing}: no such directory"):
        train(tiny(missing, profile_path), resume=True, progress=False)
    assert main(["train", "--resume", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert not missing.exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecrlError, match="no checkpoint in"):
        train(tiny(empty, profile_path), resume=True, progress=False)
    assert list(empty.iterdir()) == []

    for broken, words in (
        ("state.json", "state.json is not valid JSON"),
        ("model.zip", "model.zip is not a readable SB3 model"),
        ("envs.pkl", "envs.pkl: not readable"),
    ):
        run_dir = tmp_path / f"broken-{broken}"
        shutil.copytree(finished_run, run_dir)
        (run_dir / "summary.json").unlink()
        (run_dir / "model.zip").unlink()
        latest = run_dir / "checkpoints" / "step-000000000512"
        (latest / broken).write_bytes(b"{ truncated")
        before = snapshot(run_dir)
        config = tiny(run_dir, profile_path, total_timesteps=1024)
        with pytest.raises(SpecrlError, match=f"{latest}.*{words}|{words}.*{latest}"):
            train(config, resume=True, progress=False)
        assert snapshot(run_dir) == before
        # The fix depends on what is left: an earlier checkpoint, or none.
        earlier = sorted(latest.parent.glob("step-*"))[:-1]
        with pytest.raises(SpecrlError) as err:
            train(config, resume=True, progress=False)
        if earlier:
            assert f"delete {latest} to resume from the checkpoint before it" in str(err.value)
        for path in earlier:
            shutil.rmtree(path)
        with pytest.raises(SpecrlError, match="only checkpoint: delete .* and start again"):
            train(config, resume=True, progress=False)


def test_a_resume_refuses_training_envs_or_a_profile_it_cannot_go_on_with(tmp_path):
    """A checkpoint's training envs missing or not this run's, or the profile changed since:
    refused with the reason, nothing written. A version 1 checkpoint (no training envs) goes
    on from fresh episodes, with a warning that it will not match the run never stopped."""
    profile = tmp_path / "linear.json"
    linear_profile().save(profile)
    run_dir = tmp_path / "run"
    config = tiny(run_dir, profile, total_timesteps=256, eval_every=0, warm_start="none")
    train(config, progress=False)
    longer = TrainConfig.from_json({**config.to_json(), "total_timesteps": 512})
    latest = latest_checkpoint(run_dir).path
    envs = latest / "envs.pkl"
    saved = envs.read_bytes()
    before = snapshot(run_dir)

    envs.unlink()
    with pytest.raises(SpecrlError, match=f"{latest}: envs.pkl missing; it is the run's only"):
        train(longer, resume=True, progress=False)
    envs.write_bytes(pickle.dumps(["not", "envs"]))
    with pytest.raises(SpecrlError, match="envs.pkl: does not hold this run's 2 training envs"):
        train(longer, resume=True, progress=False)
    envs.write_bytes(saved)
    text = profile.read_text()
    profile.write_text(text + "\n")
    with pytest.raises(SpecrlError, match=f"its profile {profile} has changed since the checkp"):
        train(longer, resume=True, progress=False)
    profile.write_text(text)
    changed = snapshot(run_dir).items() ^ before.items()
    assert {name for name, _ in changed} == {str(envs.relative_to(run_dir))}

    state = json.loads((latest / "state.json").read_text())
    del state["profile_sha256"]
    (latest / "state.json").write_text(json.dumps(state | {"version": 1}))
    envs.unlink()
    with pytest.warns(SpecrlWarning, match="older specrl.*fresh episodes"):
        assert train(longer, resume=True, progress=False).num_timesteps == 512


def test_cli_says_where_a_run_starts_and_how_to_resume_a_stopped_one(
    tmp_path, profile_path, finished_run, capsys, monkeypatch
):
    import specrl.train.run
    from specrl.cli import main

    def stopped(config, **_):
        raise KeyboardInterrupt

    monkeypatch.setattr(specrl.train.run, "train", stopped)
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    assert main(["train", "--resume", str(run_dir), "--timesteps", "2048"]) == 130
    captured = capsys.readouterr()
    assert captured.out == (
        f"resuming {run_dir} from its checkpoint at step 512, to 2,048 steps; a checkpoint "
        f"every {tiny(run_dir, profile_path).checkpoint_every:,} steps\n"
    )
    assert captured.err == (
        f"specrl train: stopped; its last checkpoint is at step 512: `specrl train --resume "
        f"{run_dir}` continues from there\nspecrl: interrupted\n"
    )
    fresh = tmp_path / "fresh"
    argv = ["train", "--out", str(fresh), "--profile", str(profile_path), "--timesteps", "3000"]
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert captured.out.startswith(f"training {fresh} on the surrogate env, to 3,000 steps;")
    assert "stopped before its first checkpoint: nothing to resume; delete" in captured.err


def test_resume_refuses_a_changed_config(tmp_path, profile_path, finished_run):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    config = tiny(run_dir, profile_path, total_timesteps=1024, gamma=0.5)
    with pytest.raises(SpecrlError, match="different gamma"):
        train(config, resume=True, progress=False)


def test_cli_checks_out_and_resume(tmp_path):
    from specrl.cli import build_parser
    from specrl.cli.train import config_from_args

    def args(**kw):
        argv = ["train"]
        for name, value in kw.items():
            argv += [f"--{name}", str(value)]
        return build_parser().parse_args(argv)

    with pytest.raises(SpecrlError, match="not both"):
        config_from_args(args(out="a", resume="b"))
    with pytest.raises(SpecrlError, match="or --resume RUN_DIR, one of them"):
        config_from_args(args())
    config, resume = config_from_args(args(out=str(tmp_path), timesteps=1000, seed=3))
    assert (config.total_timesteps, config.seed, resume) == (1000, 3, False)
    with pytest.raises(SpecrlError, match="fixed when a run starts"):
        config_from_args(args(resume=str(tmp_path), seed=1))
    config, _ = config_from_args(args(out=str(tmp_path), env="live", init="runs/a"))
    assert (config.env, config.n_envs, config.init) == ("live", 1, "runs/a")
    config, _ = config_from_args(args(out=str(tmp_path), **{"max-len": 512}))
    assert config.max_len == 512
    with pytest.raises(SpecrlError, match="--max-len"):
        config_from_args(args(resume=str(tmp_path), **{"max-len": 512}))
    # --config: every field of a TrainConfig file, the options given overriding it.
    small = tmp_path / "small.json"
    TrainConfig(n_envs=2, net_arch=(8,), checkpoint_every=256).save(small)
    config, _ = config_from_args(args(out=str(tmp_path / "x"), config=small, seed=4))
    assert (config.n_envs, config.net_arch, config.checkpoint_every) == (2, (8,), 256)
    assert (config.seed, config.out) == (4, str(tmp_path / "x"))
    with pytest.raises(SpecrlError, match="--config, --seed.*fixed when a run starts"):
        config_from_args(args(resume=str(tmp_path), config=small))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SpecrlError, match="bad.json: field 'format'"):
        config_from_args(args(out=str(tmp_path / "x"), config=tmp_path / "bad.json"))
    # The pair preset is read only live: on the surrogate it was silently ignored.
    with pytest.raises(SpecrlError, match="--preset applies to --env live only"):
        config_from_args(args(out=str(tmp_path), preset="micro"))
    config, _ = config_from_args(args(out=str(tmp_path), env="live", preset="micro"))
    assert config.preset == "micro"
    with pytest.raises(SystemExit):
        args(out=str(tmp_path), env="live", preset="nope")
    with pytest.raises(SpecrlError, match="unknown preset 'nope'; choose one of: micro, small"):
        TrainConfig(out=str(tmp_path), env="live", n_envs=1, preset="nope")


# ----------------------------------------------------------------------------- wandb


class _Linger:
    """An SB3 callback that makes training last at least ``seconds``. wandb's service looks
    for new tensorboard event files every 5 s and reads them on its own schedule: a run of a
    second or two (this test's) can finish before anything is read, and then nothing is
    synced. Runs of minutes are not affected."""

    def __new__(cls, seconds: float):
        from stable_baselines3.common.callbacks import BaseCallback

        class Linger(BaseCallback):
            def _on_training_start(self) -> None:
                self.start = time.monotonic()

            def _on_step(self) -> bool:
                return True

            def _on_training_end(self) -> None:
                time.sleep(max(0.0, seconds - (time.monotonic() - self.start)))

        return Linger()


def test_wandb_offline_run_logs_the_evaluation(tmp_path, profile_path):
    pytest.importorskip("tensorboard")
    config = tiny(tmp_path / "run", profile_path, total_timesteps=256, wandb="offline")
    train(config, progress=False, callbacks=[_Linger(12.0)])
    run_dirs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    history = read_run(run_dirs[0]).columns()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    evals = summary["eval_history"]
    assert history["evaluation/timesteps"] == [e["timesteps"] for e in evals]
    for key in ("tokens_per_s", "ratio_best_static", "ratio_oracle"):
        assert history[f"evaluation/{key}"] == pytest.approx([e[key] for e in evals])
    assert history["evaluation/k/_type"] == ["histogram"] * len(evals)
    # SB3's own records arrive through tensorboard (WandbCallback's setup).
    for key in ("eval/tokens_per_s", "eval/ratio_best_static", "train/approx_kl"):
        assert key in history, sorted(history)


def test_two_wandb_runs_in_one_process(tmp_path, profile_path):
    """experiments/seeds.py trains several runs in one process with wandb offline: the
    second used to fail with "Tensorboard already patched"."""
    pytest.importorskip("tensorboard")
    for name in ("a", "b"):
        train(
            tiny(tmp_path / name, profile_path, total_timesteps=128, wandb="offline"),
            progress=False,
        )
        runs = list((tmp_path / name / "wandb").glob("offline-run-*"))
        assert len(runs) == 1
        # Named by the run directory and its parent, as seeds.py's seed-0/run, seed-1/run.
        assert read_run(runs[0]).name == f"{tmp_path.name}/{name}"


# ----------------------------------------------------------------------------- the script


def test_experiment_script_help_lists_every_field_with_its_docstring():
    done = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "train_ppo.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "--total-timesteps" in done.stdout and "--net-arch" in done.stdout
    assert "Env steps to train for, over all envs." in done.stdout


def test_experiment_script_builds_the_same_config():
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        import train_ppo
    finally:
        sys.path.remove(str(REPO / "experiments"))
    from specrl.dataclass_cli import parse

    args = parse(train_ppo.Args, ["--net-arch", "16,16", "--no-normalize-reward", "--seed", "4"])
    config = args.config()
    assert config.net_arch == (16, 16) and config.seed == 4
    assert config.out.startswith("runs/train_ppo__4__")
    defaults = parse(train_ppo.Args, []).config()
    assert defaults.to_json() | {"out": ""} == TrainConfig().to_json() | {"out": ""}
    # Every option of `specrl train` is an option of the script, and reaches the config.
    import dataclasses

    assert {f.name for f in dataclasses.fields(TrainConfig)} <= {
        f.name for f in dataclasses.fields(train_ppo.Args)
    }
    given = parse(
        train_ppo.Args,
        ["--env", "live", "--n-envs", "1", "--init", "runs/a", "--n-requests", "12"]
        + ["--max-len", "256", "--k-max", "3", "--eval-workloads", "ramp", "--eval-seed", "777"]
        + ["--force-profile", "--torch-threads", "2", "--max-batch", "64"],
    ).config()
    assert (given.env, given.init, given.n_requests, given.max_len) == ("live", "runs/a", 12, 256)
    assert (given.k_max, given.eval_workloads, given.eval_seed) == (3, ("ramp",), 777)
    assert (given.force_profile, given.torch_threads, given.max_batch) == (True, 2, 64)


def test_the_runs_model_is_the_best_evaluated(finished_run):
    summary = json.loads((finished_run / "summary.json").read_text())
    ratios = [e["ratio_best_static"] for e in summary["eval_history"]]
    assert summary["model_eval"]["ratio_best_static"] == max(ratios)
    assert summary["model_eval"] in summary["eval_history"]
    model = (finished_run / "model.zip").read_bytes()
    assert model == (finished_run / "best_model.zip").read_bytes()
    assert (finished_run / "last_model.zip").is_file()


def test_ppo_policy_refuses_a_run_for_another_env(finished_run, tmp_path):
    from specrl.policies import PPOPolicy

    assert PPOPolicy.load(finished_run, max_batch=8, k_max=4).k_max == 4
    with pytest.raises(SpecrlError, match="max_batch=8, the env has max_batch=128"):
        PPOPolicy.load(finished_run, max_batch=128)
    with pytest.raises(SpecrlError, match="k_max=4, the env has k_max=2"):
        PPOPolicy.load(finished_run, k_max=2)
    with pytest.raises(SpecrlError, match="not found"):
        PPOPolicy.load(tmp_path / "nothing")


def test_reward_normalisation_statistics_come_back_on_resume(tmp_path, profile_path):
    from stable_baselines3.common.vec_env import VecNormalize

    config = tiny(
        tmp_path / "run", profile_path, total_timesteps=256, eval_every=0, normalize_reward=True
    )
    train(config, progress=False)
    saved = latest_checkpoint(config.out).state["vec_normalize"]
    assert saved["count"] > 256

    seen: dict = {}

    class Peek:
        def __new__(cls):
            from stable_baselines3.common.callbacks import BaseCallback

            class PeekAtStart(BaseCallback):
                def _on_training_start(self) -> None:
                    env = self.model.get_env()
                    assert isinstance(env, VecNormalize)
                    seen.update(mean=env.ret_rms.mean, var=env.ret_rms.var, count=env.ret_rms.count)

                def _on_step(self) -> bool:
                    return True

            return PeekAtStart()

    resumed = TrainConfig.from_json(config.to_json() | {"total_timesteps": 384})
    train(resumed, resume=True, progress=False, callbacks=[Peek()])
    assert seen == pytest.approx({k: saved[k] for k in ("mean", "var", "count")})


def test_compare_runs_a_trained_run_by_name(finished_run, profile_path):
    """`ppo:RUN_DIR` in the policy registry: the trained policy runs beside the baselines."""
    from specrl.compare import compare_policies
    from specrl.envs import SurrogateSpecEnv
    from specrl.policies import make_policy

    env = SurrogateSpecEnv(
        profile=profile_path, workload="steady-4", workload_kwargs={"n_requests": 8}, max_batch=8
    )
    policies = [make_policy(s, env=env) for s in ("off", f"ppo:{finished_run}")]
    report = compare_policies(env, policies, episodes=1, progress=False)
    assert [r.policy for r in report.results] == ["off", "ppo"]
    tokens = {sum(e.tokens for e in r.episodes) for r in report.results}
    assert len(tokens) == 1


def user_domain_profile():
    """The linear profile as if measured on a prompts file with the domains ``sql`` (2 greedy
    prompts, 1 at temperature 1) and ``user`` (1 chat prompt): code's acceptance as sql's,
    prose's as user's."""
    prof = linear_profile()
    rename = {"code": "sql", "prose": "user"}

    def renamed(by_domain):
        return {rename[d]: v for d, v in by_domain.items() if d in rename}

    prof.acceptance = renamed(prof.acceptance)
    prof.acceptance_counts = renamed(prof.acceptance_counts)
    prof.request_levels = renamed(prof.request_levels)
    prof.acceptance_by_output = {
        **prof.acceptance_by_output,
        "rates": renamed(prof.acceptance_by_output["rates"]),
    }
    prof.meta["prompts"] = {
        "file": "mine.jsonl",
        "sha256": "0" * 64,
        "count": 4,
        "domains": ["sql", "user"],
    }
    prof.meta["prompt_counts"] = {
        "sql": {"greedy": 2, "chat": 0, "default": 1},
        "user": {"greedy": 0, "chat": 1, "default": 0},
    }
    return prof


def test_a_profile_of_your_prompts_trains_on_its_domains_and_bands(tmp_path):
    """A profile measured with --prompts has the file's domains: the surrogate's preset
    workloads draw those, in the shares of the file's prompts (domains and bands drawn
    independently), and ``specrl train`` and ``export`` run on it."""
    path = tmp_path / "mine.json"
    user_domain_profile().save(path)
    env = SurrogateSpecEnv(profile=path, workload="mixed", workload_kwargs={"n_requests": 4000})
    env.reset(seed=0)
    requests = env.trace.requests
    domains = Counter(r.domain for r in requests)
    bands = Counter(temperature_band(r.temperature) for r in requests)
    assert set(domains) == {"sql", "user"} and set(bands) == {"greedy", "chat", "default"}
    assert domains["sql"] / len(requests) == pytest.approx(3 / 4, abs=0.03)
    assert bands["greedy"] / len(requests) == pytest.approx(2 / 4, abs=0.03)
    assert env.trace.prompts["domains"] == ["sql", "user"]
    # The stdlib presets' domains are not in this profile: asked for by name, refused.
    code = preset_trace("steady-2", seed=0, n_requests=4, peak=8, domains={"code": 1.0})
    with pytest.raises(SpecrlError, match=r"\('code', 'greedy'\).*no acceptance for"):
        env.reset(options={"trace": code})

    run_dir = tmp_path / "run"
    # specrl train's own observation: each request's usable figure, on the file's groups.
    default = TrainConfig(out="unused").acceptance_estimate
    train(tiny(run_dir, path, acceptance_estimate=default), progress=False)
    table = table_from_run(run_dir)
    assert table.provenance["profile_fingerprint"] == linear_profile().fingerprint
    assert table.provenance["acceptance_estimate"] == default == "usable"
    groups = {(g["domain"], g["band"]) for g in table.request_acceptance["groups"]}
    assert {domain for domain, _ in groups} == {"sql", "user"}
    fidelity = check_fidelity(run_dir, table, episodes=1, progress=False)
    assert fidelity.states > 0


def test_ppo_policy_probes_on_the_first_step_then_after_the_interval():
    """A network that always says K=0: the policy probes on an episode's first step (nothing
    measured yet), plays 0 while the estimate is fresh and while it ages, and probes again
    once ``PROBE["after_steps"]`` steps have passed without drafting."""
    from gymnasium import spaces

    from specrl.envs.base import OBS_NAMES
    from specrl.features import STALE_STEPS
    from specrl.policies.ppo import PPOPolicy

    class AlwaysOff:
        observation_space = spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
        action_space = spaces.Discrete(5)

        def predict(self, obs, deterministic=True):
            return np.zeros(len(obs), dtype=np.int64), None

    policy = PPOPolicy(AlwaysOff(), max_batch=128)
    staleness = OBS_NAMES.index("staleness")

    def obs(since: int) -> np.ndarray:
        row = np.zeros(len(OBS_NAMES), dtype=np.float32)
        row[0] = 64 / 128
        row[staleness] = min(1.0, since / STALE_STEPS)
        return row

    assert policy.predict(obs(STALE_STEPS), episode_start=np.array([True]))[0] == PROBE["k"]
    ks = [int(policy.predict(obs(0), episode_start=np.array([False]))[0])]  # probe measured
    since = 0
    while ks[-1] == 0 and len(ks) < 1000:
        since += 1
        ks.append(int(policy.predict(obs(since), episode_start=np.array([False]))[0]))
    assert ks == [0] * PROBE["after_steps"] + [PROBE["k"]]
    # A new episode: nothing measured again, whatever the count was.
    assert policy.predict(obs(STALE_STEPS), episode_start=np.array([True]))[0] == PROBE["k"]


def test_apply_probe_int_path_matches_the_array_path():
    for k in range(5):
        for since in (0, 31, 32, PROBE["after_steps"] - 1, PROBE["after_steps"], 2**31 - 1):
            want = int(apply_probe(np.array([k]), np.array([since]))[0])
            assert apply_probe(k, since) == want


def test_profile_workload_kwargs():
    """{} for a held-out-corpus profile; the file's domain and band shares otherwise, which a
    caller's own workload_kwargs override; malformed counts are refused naming the field."""
    assert profile_workload_kwargs(linear_profile().meta) == {}
    meta = user_domain_profile().meta
    kwargs = profile_workload_kwargs(meta)
    assert kwargs["domains"] == {"sql": 3.0, "user": 1.0}
    assert kwargs["sampling"] == {"greedy": 2.0, "chat": 1.0, "default": 1.0}
    assert kwargs["prompts"] == meta["prompts"] and kwargs["prompts"] is not meta["prompts"]
    env = SurrogateSpecEnv(
        profile=user_domain_profile(),
        workload="steady-8",
        workload_kwargs={"n_requests": 50, "domains": {"user": 1.0}},
    )
    env.reset(seed=0)
    assert {r.domain for r in env.trace.requests} == {"user"}
    bad = {**meta, "prompt_counts": {"sql": 3}}
    with pytest.raises(SpecrlError, match="meta.prompt_counts"):
        profile_workload_kwargs(bad)
    good = {"median": 40.0, "sigma": 0.5, "lo": 8, "hi": 90}
    for lengths in (
        {"median": 40},
        {**good, "lo": 8.5},
        {**good, "sigma": float("inf")},
        {**good, "mean": 41.0},
        7,
    ):
        with pytest.raises(SpecrlError, match="meta.prompt_lengths_dist"):
            profile_workload_kwargs({**meta, "prompt_lengths_dist": lengths})
    with pytest.raises(SpecrlError, match="meta.output_lengths_dist.*lo <= hi"):
        bad = {"median": 40.0, "sigma": 0.5, "lo": 90, "hi": 8}
        profile_workload_kwargs({**meta, "output_lengths_dist": bad})


def test_a_profile_of_long_prompts_trains_on_their_lengths_with_max_len_raised(tmp_path):
    """The surrogate's presets draw the file's prompt and output lengths; a run whose
    max_len cannot hold the longest is refused before anything is written, naming
    --max-len."""
    from specrl.workload import LengthDist

    prof = user_domain_profile()
    prof.meta["prompt_lengths_dist"] = {"median": 300.0, "sigma": 0.3, "lo": 200, "hi": 400}
    prof.meta["output_lengths_dist"] = {"median": 20.0, "sigma": 0.0, "lo": 20, "hi": 20}
    path = tmp_path / "long.json"
    prof.save(path)
    kwargs = profile_workload_kwargs(prof.meta)
    assert kwargs["prompt_lengths"] == LengthDist(300.0, 0.3, 200, 400)
    env = SurrogateSpecEnv(
        profile=path, workload="steady-8", max_len=420, workload_kwargs={"n_requests": 400}
    )
    env.reset(seed=0)
    prompt_lens = [r.prompt_len for r in env.trace.requests]
    assert min(prompt_lens) >= 200 and max(prompt_lens) <= 400
    assert np.median(prompt_lens) == pytest.approx(300, rel=0.05)
    assert {r.max_new_tokens for r in env.trace.requests} == {20}
    run_dir = tmp_path / "run"
    with pytest.raises(SpecrlError, match=r"400 prompt \+ 20 output tokens = 420.*--max-len 420"):
        train(tiny(run_dir, path), progress=False)
    assert not run_dir.exists()
    train(tiny(run_dir, path, max_len=420), progress=False)
    assert (run_dir / "model.zip").is_file()


def test_validate_surrogate_refuses_a_profile_of_your_prompts(tmp_path, capsys):
    """validate-surrogate serves the held-out corpus live: a --prompts profile is refused,
    naming it, before the pair loads."""
    from specrl.cli import main

    path = tmp_path / "mine.json"
    user_domain_profile().save(path)
    assert main(["validate-surrogate", "--profile", str(path)]) != 0
    err = capsys.readouterr().err
    assert f"{path} was measured on the prompts file 'mine.jsonl'" in err
    assert "without --prompts" in err


def test_the_demo_reuses_its_cached_run_only_if_trained_with_the_same_settings(
    tmp_path, profile_path
):
    from specrl.demo import DemoOptions, _train

    options = DemoOptions(
        timesteps=256, max_batch=8, n_requests=8, wandb="disabled", progress=False
    )
    cache = tmp_path / "cache"
    run_dir, how = _train(profile_path, options, cache)
    assert how == "trained"
    assert _train(profile_path, options, cache) == (run_dir, "reused")
    # A cached run trained by an older version's defaults (here: without the floor).
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "reference_floor": False}))
    assert _train(profile_path, options, cache) == (run_dir, "trained")
    assert load_config(run_dir).reference_floor is True


def test_total_timesteps_short_of_a_whole_rollout_warns_what_trains(tmp_path, profile_path):
    from specrl.errors import SpecrlWarning

    # tiny: 2 envs x 64 steps = 128 a rollout; SB3 stops PPO only between rollouts.
    with pytest.warns(SpecrlWarning, match=r"= 128 steps, so total_timesteps 200 trains 256$"):
        result = train(tiny(tmp_path / "run", profile_path, total_timesteps=200), progress=False)
    assert result.num_timesteps == 256
    # Within 10% of what was asked (the defaults: 200,000 train 200,704): no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecrlWarning)
        result = train(tiny(tmp_path / "b", profile_path, total_timesteps=240), progress=False)
    assert result.num_timesteps == 256


def test_init_from_an_unreadable_model_or_from_itself_is_refused(tmp_path, finished_run):
    source = tmp_path / "source"
    shutil.copytree(finished_run, source)
    (source / "model.zip").write_bytes(b"not a zip")
    config = TrainConfig.from_json(
        {**load_config(source).to_json(), "out": str(tmp_path / "new"), "init": str(source)}
    )
    with pytest.raises(SpecrlError, match=r"--init .*model\.zip is not a readable SB3 model"):
        train(config, progress=False)
    itself = TrainConfig.from_json({**config.to_json(), "init": str(tmp_path / "new")})
    with pytest.raises(SpecrlError, match=r"is this run's own --out; give a finished run"):
        train(itself, progress=False)
