"""A finished ``specrl train`` run, loaded once per command and passed down: its config, its
training steps, the profile it trained on, its policy and the surrogate env of each workload.
``specrl export``, the schedule search and ``specrl demo`` read a run through it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from specrl.config import SUMMARY_FILE, TrainConfig, load_config
from specrl.errors import SpecrlError


@dataclass
class TrainedRun:
    run_dir: Path
    config: TrainConfig
    steps: int
    """Training steps the run finished with (its summary's ``num_timesteps``)."""
    _envs: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, run_dir: str | Path, k_max: int | None = None) -> TrainedRun:
        """The finished run at ``run_dir``; a run trained with another ``k_max`` than asked
        (None: any), or one that has not finished, is refused."""
        run_dir = Path(run_dir)
        config = load_config(run_dir)
        _check_k_max(run_dir, config, k_max)
        try:
            summary = json.loads((run_dir / SUMMARY_FILE).read_text())
            steps = int(summary["num_timesteps"])
        except (OSError, ValueError, KeyError, TypeError):
            raise SpecrlError(
                f"{run_dir}/{SUMMARY_FILE} is missing or unreadable: the run has not finished; "
                f"continue it with `specrl train --resume {run_dir}`"
            ) from None
        return cls(run_dir, config, steps)

    @cached_property
    def _profile(self):
        # specrl.train.envs needs gymnasium; `specrl export --help` must build without it.
        from specrl.train.envs import load_run_profile

        return load_run_profile(self.config)

    @property
    def profile(self):
        """The profile the run trained on (loaded on first use)."""
        return self._profile[0]

    @property
    def profile_path(self) -> Path:
        return self._profile[1]

    @cached_property
    def policy(self):
        """The run's PPO policy (loaded on first use: it needs stable-baselines3)."""
        from specrl.policies.ppo import PPOPolicy

        return PPOPolicy.load(self.run_dir, config=self.config)

    def env(self, workload: str):
        """The run's surrogate env serving ``workload``, built on first use and reused: every
        episode played in it starts from an explicit seed."""
        from specrl.train.envs import surrogate_env

        if workload not in self._envs:
            self._envs[workload] = surrogate_env(self.config, self.profile, workload)
        return self._envs[workload]


def as_run(run: TrainedRun | str | Path, k_max: int | None = None) -> TrainedRun:
    """``run`` itself, or the finished run at that path; refused where ``k_max`` is given and
    the run was trained with another."""
    if not isinstance(run, TrainedRun):
        return TrainedRun.load(run, k_max)
    _check_k_max(run.run_dir, run.config, k_max)
    return run


def _check_k_max(run_dir: Path, config: TrainConfig, k_max: int | None) -> None:
    if k_max is not None and k_max != config.k_max:
        raise SpecrlError(
            f"{run_dir} was trained with k_max={config.k_max}, not {k_max}: its actions "
            f"are Ks 0..{config.k_max}; export with --k-max {config.k_max} (or leave it "
            f"out), or train a run with k_max={k_max} (`python experiments/train_ppo.py "
            f"--k-max {k_max}` on a profile measured with --k-max {k_max} or more)"
        )
