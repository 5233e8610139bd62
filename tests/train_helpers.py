"""A training run of seconds, and what a resume is checked against, shared by the tests that
train one."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import numpy as np
import torch

from specrl.train import TrainConfig


def tiny(out: Path, profile_path: Path, **changes) -> TrainConfig:
    """A run of seconds: batch up to 8, 8-request traces, a network of 8 units, on the step
    EMA: the tests of training, export and resume run on the estimate a table's probe and
    staleness rules serve; those of the per-request estimates (the default) set it."""
    settings = dict(
        out=str(out),
        total_timesteps=512,
        workloads=("ramp", "steady-2", "steady-8"),
        n_requests=8,
        profile=str(profile_path),
        max_batch=8,
        n_envs=2,
        n_steps=64,
        batch_size=64,
        n_epochs=2,
        net_arch=(8,),
        checkpoint_every=256,
        eval_every=256,
        eval_workloads=("ramp",),
        eval_episodes=1,
        acceptance_estimate="steps",
        wandb="disabled",
    )
    settings.update(changes)
    return TrainConfig(**settings)


def crash_after(steps: int):
    """An SB3 callback that raises once training has passed ``steps``: a crash mid-run."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Crash(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps > steps:
                raise RuntimeError("simulated crash")
            return True

    return Crash()


def capture(into: dict):
    """An SB3 callback that records the model's state when training starts: timesteps,
    optimizer, the global numpy and torch RNGs."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Capture(BaseCallback):
        def _on_training_start(self) -> None:
            into["num_timesteps"] = self.model.num_timesteps
            into["optimizer"] = copy.deepcopy(self.model.policy.optimizer.state_dict())
            into["numpy"] = np.random.get_state(legacy=False)["state"]["key"].copy()
            into["torch"] = torch.get_rng_state().clone()

        def _on_step(self) -> bool:
            return True

    return Capture()


def assert_resumed_from(captured: dict, checkpoint) -> None:
    """What :func:`capture` recorded is what ``checkpoint`` saved."""
    from stable_baselines3 import PPO

    assert captured["num_timesteps"] == checkpoint.num_timesteps
    saved = PPO.load(checkpoint.model_path, device="cpu").policy.optimizer.state_dict()
    assert captured["optimizer"]["state"], "the optimizer has taken steps"
    for index, moments in saved["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(captured["optimizer"]["state"][index][name], moments[name])
    rng = checkpoint.state["rng"]
    assert np.array_equal(captured["numpy"], np.array(rng["numpy"]["key"], dtype=np.uint32))
    assert captured["torch"].numpy().tobytes() == base64.b64decode(rng["torch"])
