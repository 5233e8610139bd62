"""A training run of seconds, shared by the tests that train one."""

from __future__ import annotations

from pathlib import Path

from specrl.train import TrainConfig


def tiny(out: Path, profile_path: Path, **changes) -> TrainConfig:
    """A run of seconds: batch up to 8, 8-request traces, a network of 8 units."""
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
        wandb="disabled",
    )
    settings.update(changes)
    return TrainConfig(**settings)
