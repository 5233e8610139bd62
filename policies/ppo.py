"""A PPO model trained by ``specrl train``, as a K controller with SB3's ``predict``.

The network reads the env's observation plus one derived entry, ``log_batch``
(:func:`policy_observation`): the decision between speculating and not turns on the batch
size (on the shipped profile K > 0 pays at 16 rows or fewer, off at 32 or more), and in the
env's ``batch / max_batch`` every size below 16 of 128 sits within 0.12 of zero, too close
for a small network to tell 1 from 4 from 8. ``log(B) / log(max_batch)`` spreads them evenly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrl.envs.base import OBS_NAMES
from specrl.errors import SpecrlError
from specrl.policies.base import BATCH, KPolicy, observation_rows

POLICY_OBS_NAMES = (*OBS_NAMES, "log_batch")
"""What the network reads: the env's observation, then ``log(max(B, 1)) / log(max_batch)``."""


def policy_observation(obs, max_batch: int) -> np.ndarray:
    """The network's input (``[9]`` or ``[n_envs, 9]`` float32) from the env's observation
    (``[8]`` or ``[n_envs, 8]``). On the training env's hot path: kept to a few array ops."""
    arr = np.asarray(obs, dtype=np.float32)
    if arr.ndim not in (1, 2) or arr.shape[-1] != len(OBS_NAMES):
        observation_rows(arr)  # raises, naming the expected shape
    batch = np.clip(np.rint(arr[..., BATCH] * max_batch), 1, max_batch)
    log_batch = np.log(batch) / np.log(max_batch) if max_batch > 1 else batch * 0.0
    return np.concatenate([arr, log_batch[..., None].astype(np.float32)], axis=-1)


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

    @classmethod
    def load(
        cls, run_dir: str | Path, *, max_batch: int | None = None, k_max: int | None = None
    ) -> PPOPolicy:
        """The final model of a ``specrl train`` run (``RUN_DIR/model.zip``), on the CPU.

        :param max_batch: the env's ``max_batch``, if known: a run trained with another is
            refused (the observation scales the batch size by it).
        :param k_max: the env's ``k_max``, if known: a run trained with another is refused.
        """
        from specrl.train.config import MODEL_FILE, load_config

        config = load_config(run_dir)
        for name, wanted in (("max_batch", max_batch), ("k_max", k_max)):
            if wanted is not None and getattr(config, name) != wanted:
                raise SpecrlError(
                    f"the run in {run_dir} was trained with {name}={getattr(config, name)}, "
                    f"the env has {name}={wanted}; train a run for this env"
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
        actions = np.asarray(actions, dtype=np.int64).reshape(-1)
        return (np.int64(actions[0]) if single else actions), state
