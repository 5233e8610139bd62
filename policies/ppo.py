"""A PPO model trained by ``specrl train``, as a K controller with SB3's ``predict``.

The network reads what an exported table can index, and nothing more: the three entries of
:func:`specrl.envs.training.policy_observation` (``log_batch``, ``acceptance``, ``stale``),
whose docstrings say why. It follows the table's probe rule
(:data:`specrl.envs.training.PROBE`): when it chooses K=0 and no step has drafted for
``after_steps`` steps, it drafts ``k`` for one step, so the acceptance estimate is measured
again. Training applies the same rule, so the policy learns in the closed loop it is served
in. ``predict`` counts the steps past ``STALE_STEPS`` itself, one count per env, restarted
where ``episode_start`` is True.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrl.config import MODEL_FILE, load_config
from specrl.envs.base import STALENESS, observation_rows
from specrl.envs.training import (
    POLICY_OBS_NAMES,
    apply_probe,
    features,
    policy_observation,
)
from specrl.errors import SpecrlError
from specrl.features import NEVER_MEASURED
from specrl.policies.base import KPolicy, _episode_starts, since_measured


class PPOPolicy(KPolicy):
    """An SB3 PPO model over :func:`policy_observation`, as every other K controller.

    :param model: a ``stable_baselines3.PPO`` whose observation space has
        ``len(POLICY_OBS_NAMES)`` entries and whose actions are ``0..k_max``.
    :param max_batch: the env's ``max_batch`` the model was trained with.
    """

    def __init__(self, model, *, max_batch: int):
        n_obs = len(POLICY_OBS_NAMES)
        if model.observation_space.shape != (n_obs,):
            raise SpecrlError(
                f"the PPO model reads observations of shape {model.observation_space.shape}, "
                f"not ({n_obs},) ({', '.join(POLICY_OBS_NAMES)}); was it trained by "
                "`specrl train`?"
            )
        self.model = model
        self.max_batch = max_batch
        self.k_max = int(model.action_space.n) - 1
        self.name = "ppo"
        self._since: list[int] = []  # per env: steps since one drafted (the probe rule)

    @classmethod
    def load(
        cls,
        run_dir: str | Path,
        *,
        max_batch: int | None = None,
        k_max: int | None = None,
        config=None,
        acceptance_estimate: str | None = None,
    ) -> PPOPolicy:
        """The policy of a ``specrl train`` run (``RUN_DIR/model.zip``: its best-evaluated
        model), on the CPU.

        :param max_batch: the env's ``max_batch``, if known: a run trained with another is
            refused (the observation scales the batch size by it).
        :param k_max: the env's ``k_max``, if known: a run trained with another is refused.
        :param config: the run's config, where the caller loaded it already.
        :param acceptance_estimate: the env's observation acceptance, if known: a run trained
            on another figure is refused (its observation would read another number).
        """

        config = load_config(run_dir) if config is None else config
        checks = (
            ("max_batch", max_batch),
            ("k_max", k_max),
            ("acceptance_estimate", acceptance_estimate),
        )
        for name, wanted in checks:
            if wanted is not None and getattr(config, name) != wanted:
                fix = (
                    f"build the env with acceptance_estimate={getattr(config, name)!r} "
                    "(`specrl compare` does unless --acceptance-estimate says otherwise)"
                    if name == "acceptance_estimate"
                    else "train a run for this env"
                )
                raise SpecrlError(
                    f"the run in {run_dir} was trained with {name}={getattr(config, name)}, "
                    f"the env has {name}={wanted}; {fix}"
                )
        path = Path(run_dir) / MODEL_FILE
        if not path.is_file():
            raise SpecrlError(
                f"{path} not found: the run in {run_dir} has not finished; continue it with "
                f"`specrl train --resume {run_dir}`"
            )
        from stable_baselines3 import PPO

        try:
            model = PPO.load(path, device="cpu")
        except Exception as err:  # SB3 raises whatever zipfile, torch or pickle raise
            raise SpecrlError(f"{path} is not a readable SB3 model ({err})") from None
        policy = cls(model, max_batch=config.max_batch)
        if policy.k_max != config.k_max:
            raise SpecrlError(
                f"{path} chooses K in 0..{policy.k_max} but {run_dir}/config.json says "
                f"k_max={config.k_max}; the run directory is inconsistent"
            )
        return policy

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        """K for each observation (``[8]`` -> ``np.int64``, ``[n_envs, 8]`` -> ``[n_envs]``);
        the most probable K unless ``deterministic`` is False."""
        rows, single = observation_rows(obs)
        actions, _ = self.model.predict(
            policy_observation(rows, self.max_batch), deterministic=deterministic
        )
        starts = _episode_starts(episode_start, len(rows))
        if len(self._since) != len(rows):
            self._since = [NEVER_MEASURED] * len(rows)
            starts = np.ones(len(rows), dtype=bool)
        self._since = [
            since_measured(prev, float(row[STALENESS]), bool(start))
            for prev, row, start in zip(self._since, rows, starts)
        ]
        actions = apply_probe(np.asarray(actions, dtype=np.int64).reshape(-1), self._since)
        actions = actions.astype(np.int64)
        return (np.int64(actions[0]) if single else actions), state

    def decide(self, batch, acceptance, stale) -> np.ndarray:
        """The network's deterministic K (before the probe rule) at batch sizes, acceptance
        estimates and stale flags (arrays of one shape): what :mod:`specrl.train.to_table`
        tabulates."""
        x = features(batch, acceptance, stale, self.max_batch)
        actions, _ = self.model.predict(x.reshape(-1, x.shape[-1]), deterministic=True)
        return np.asarray(actions, dtype=np.int64).reshape(x.shape[:-1])
