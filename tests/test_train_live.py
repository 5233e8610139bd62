"""``specrl train --env live``: PPO on the live engine (the micro pair), checkpointed and
resumed like a surrogate run, and ``--init``: a surrogate-trained policy fine-tuned live."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from train_helpers import assert_resumed_from, capture, crash_after

from specrl.envs.training import TrainingEnv as LiveTrainingEnv
from specrl.errors import SpecrlError
from specrl.profile.synthetic import linear_profile
from specrl.train import TrainConfig, latest_checkpoint, train


@pytest.fixture
def home(micro_pair_paths, monkeypatch):
    """The session's micro pair as the default pair home (no rebuild)."""
    monkeypatch.setenv("SPECRL_HOME", str(Path(micro_pair_paths.target_path).parents[2]))


def config(root: Path, name: str, **changes) -> TrainConfig:
    profile = root / "linear.json"
    if not profile.exists():
        linear_profile().save(profile)
    settings = dict(
        out=str(root / name),
        env="live",
        preset="micro",
        force_profile=True,  # the synthetic profile names no real machine
        profile=str(profile),
        acceptance_estimate="steps",  # the per-request ones read the profile's pair's levels
        total_timesteps=48,
        workloads=("steady-2",),
        eval_workloads=("steady-2",),
        n_requests=3,
        max_batch=2,
        n_envs=1,
        n_steps=16,
        batch_size=16,
        n_epochs=1,
        net_arch=(8,),
        checkpoint_every=16,
        eval_every=0,
        warm_start="none",
        wandb="disabled",
        torch_threads=1,
    )
    return TrainConfig(**(settings | changes))


def test_live_training_checkpoints_and_resumes(home, tmp_path):
    with pytest.warns(UserWarning, match="profile"):
        result = train(config(tmp_path, "live"), progress=False)
    assert result.num_timesteps == 48
    summary = json.loads((tmp_path / "live" / "summary.json").read_text())
    assert summary["config"]["env"] == "live" and summary["timing"]["env_share"] > 0
    assert latest_checkpoint(tmp_path / "live").num_timesteps == 48
    with pytest.warns(UserWarning, match="profile"):
        resumed = train(config(tmp_path, "live", total_timesteps=80), resume=True, progress=False)
    assert resumed.num_timesteps == 80


def test_live_training_keys_its_reference_by_workload_when_asked(home, tmp_path):
    """With ``reward_reference="workload"`` the live env charges the reference of the
    episode's workload, over ``max_batch``, as the surrogate does; not the entry of the batch
    size (past the two workloads' entries at 2 rows)."""
    from specrl.profile import load_profile
    from specrl.train.envs import make_live_training_env, new_reference

    run = config(tmp_path, "w", reward_reference="workload", workloads=("steady-2", "ramp"))
    profile = load_profile(run.profile)
    reference = new_reference(run, profile)
    charged = []
    charge = reference.charge
    reference.charge = lambda key, info, scale: (
        charged.append((key, scale)) or charge(key, info, scale)
    )
    with pytest.warns(UserWarning, match="profile"):
        env = make_live_training_env(run, profile, reference)
    env.reset(seed=0)
    for _ in range(40):
        _, _, terminated, truncated, _ = env.step(1)
        if terminated or truncated:
            env.reset()
    assert charged and {key for key, _ in charged} <= {0, 1}  # the workloads' indices
    assert {scale for _, scale in charged} == {run.max_batch}


def test_a_live_resume_keeps_optimizer_rngs_statistics_reference_and_env_stream(
    home, tmp_path, monkeypatch
):
    """A live run stopped mid-run comes back with what its checkpoint saved: the optimizer's
    moments, the global RNGs, the reward-normalisation statistics, the reward's reference and
    the timestep count; and the env's first episode draws on from the saved random stream
    (workload, trace and the engine's per-request sampling seeds), not from a fresh seed.
    Step times are measured, so what comes after is not compared with an unstopped run."""
    run = config(tmp_path, "live", normalize_reward=True)
    with pytest.warns(UserWarning, match="profile"), pytest.raises(RuntimeError, match="crash"):
        train(run, progress=False, callbacks=[crash_after(20)])
    checkpoint = latest_checkpoint(run.out)
    assert checkpoint.num_timesteps == 16

    resets = []
    reset = LiveTrainingEnv.reset

    def recorded_reset(self, *, seed=None, options=None):
        resets.append((seed, self.env.unwrapped.np_random.bit_generator.state))
        return reset(self, seed=seed, options=options)

    monkeypatch.setattr(LiveTrainingEnv, "reset", recorded_reset)
    captured: dict = {}
    from stable_baselines3.common.callbacks import BaseCallback

    class Peek(BaseCallback):
        def _on_training_start(self) -> None:
            rms = self.model.get_env().ret_rms
            captured["vec_normalize"] = {"mean": rms.mean, "var": rms.var, "count": rms.count}
            captured["reference"] = self.training_env.get_attr("reference")[0].to_json()

        def _on_step(self) -> bool:
            return True

    with pytest.warns(UserWarning, match="profile"):
        result = train(run, resume=True, progress=False, callbacks=[capture(captured), Peek()])
    assert_resumed_from(captured, checkpoint)
    assert resets[0] == (None, checkpoint.state["env_streams"][0])
    saved = checkpoint.state["vec_normalize"]
    assert captured["vec_normalize"] == {k: saved[k] for k in ("mean", "var", "count")}
    assert captured["reference"] == checkpoint.state["reference"]
    assert result.num_timesteps == 48


def test_init_fine_tunes_a_trained_run_from_its_weights(home, tmp_path):
    surrogate = config(tmp_path, "surrogate", env="surrogate", total_timesteps=32)
    train(surrogate, progress=False)
    from stable_baselines3 import PPO

    start = PPO.load(tmp_path / "surrogate" / "model.zip", device="cpu")
    fine = config(
        tmp_path, "fine", init=str(tmp_path / "surrogate"), total_timesteps=16, learning_rate=1e-12
    )
    with pytest.warns(UserWarning, match="profile"):
        result = train(fine, progress=False)
    before = start.policy.state_dict()
    after = result.model.policy.state_dict()
    # A learning rate of 1e-12 leaves the weights where --init put them.
    assert all(torch.allclose(before[k], after[k], atol=1e-6) for k in before)
    assert result.num_timesteps == 16
    with pytest.raises(SpecrlError, match="k_max=4, this run has k_max=3"):
        train(config(tmp_path, "bad", init=str(tmp_path / "surrogate"), k_max=3), progress=False)
    # Another observation: the network would read another figure as the one it learned on.
    other = config(
        tmp_path,
        "other",
        env="surrogate",
        init=str(tmp_path / "surrogate"),
        acceptance_estimate="usable",
    )
    with pytest.raises(
        SpecrlError,
        match=r"acceptance_estimate=steps, this run has acceptance_estimate=usable; "
        r"they must match \(pass --acceptance-estimate steps\)",
    ):
        train(other, progress=False)
