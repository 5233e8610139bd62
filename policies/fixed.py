"""Fixed K controllers: the baselines every learned policy is scored against.

Each has SB3's ``predict(obs, state=None, episode_start=None, deterministic=False)`` so
``stable_baselines3.common.evaluation.evaluate_policy`` and :func:`specrl.envs.run_episode`
can score it. ``obs`` is the environment's observation (see ``LiveSpecEnv``), one or a batch.
"""

from __future__ import annotations

import numpy as np

from specrl.envs.base import OBS_NAMES
from specrl.errors import SpecrlError

_BATCH = OBS_NAMES.index("batch")


class FixedK:
    """Always the same K (``k=0``: speculation off).

    :param k: draft tokens per row, every step.
    """

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 0:
            raise SpecrlError(f"FixedK: k must be an integer >= 0, got {k!r}")
        self.k = k
        self.name = "off" if k == 0 else f"K={k}"

    def predict(self, obs, state=None, episode_start=None, deterministic=False):
        obs = np.asarray(obs)
        if obs.ndim == 1:
            return np.int64(self.k), state
        return np.full(obs.shape[0], self.k, dtype=np.int64), state


class BatchThreshold:
    """K while the batch is at most ``max_spec_batch`` rows, 0 above: vLLM's
    ``speculative_disable_by_batch_size`` and TensorRT-LLM's draft-length cap.

    :param k: K at or below the threshold.
    :param max_spec_batch: largest batch that still speculates.
    :param max_batch: the environment's ``max_batch`` (the observation's batch scale).
    """

    def __init__(self, k: int, max_spec_batch: int, max_batch: int):
        if not (isinstance(k, int) and k >= 0 and max_spec_batch >= 0 and max_batch >= 1):
            raise SpecrlError(
                "BatchThreshold: need k >= 0, max_spec_batch >= 0 and max_batch >= 1, got "
                f"k={k!r}, max_spec_batch={max_spec_batch!r}, max_batch={max_batch!r}"
            )
        self.k, self.max_spec_batch, self.max_batch = k, max_spec_batch, max_batch
        self.name = f"K={k} if B<={max_spec_batch}"

    def predict(self, obs, state=None, episode_start=None, deterministic=False):
        obs = np.asarray(obs)
        batch = np.rint(obs[..., _BATCH] * self.max_batch)
        actions = np.where(batch <= self.max_spec_batch, self.k, 0).astype(np.int64)
        return (actions if obs.ndim > 1 else np.int64(actions)), state
