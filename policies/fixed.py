"""Fixed K controllers: the baselines every learned policy is scored against.

Each has SB3's ``predict(obs, state=None, episode_start=None, deterministic=False)`` so
``stable_baselines3.common.evaluation.evaluate_policy`` and :func:`specrl.envs.run_episode`
can score it. ``obs`` is the environment's observation (see ``LiveSpecEnv``), one or a batch.
"""

from __future__ import annotations

import numpy as np

from specrl.errors import SpecrlError
from specrl.policies.base import KPolicy, check_int, rows_in_batch


class FixedK(KPolicy):
    """Always the same K (``k=0``: speculation off): a serving stack started with
    ``num_speculative_tokens=k`` (vLLM), ``max_draft_len=k`` (TensorRT-LLM) or
    ``--speculative-num-steps k`` (SGLang) and nothing adaptive.

    :param k: draft tokens per row, every step.
    """

    def __init__(self, k: int):
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise SpecrlError(f"FixedK: k must be an integer >= 0, got {k!r}")
        self.k = k
        self.name = "off" if k == 0 else f"K={k}"

    def _act(self, rows, starts):
        return np.full(len(rows), self.k)


class BatchThreshold(KPolicy):
    """K while the batch is at most ``max_spec_batch`` rows, 0 above: vLLM V0's
    ``speculative_disable_by_batch_size`` and TensorRT-LLM's ``max_concurrency``.

    :param k: K at or below the threshold.
    :param max_spec_batch: largest batch that still speculates.
    :param max_batch: the environment's ``max_batch`` (the observation's batch scale).
    """

    def __init__(self, k: int, max_spec_batch: int, max_batch: int):
        self.k = check_int(k, "BatchThreshold: k", low=0)
        self.max_spec_batch = check_int(max_spec_batch, "BatchThreshold: max_spec_batch", low=0)
        self.max_batch = check_int(max_batch, "BatchThreshold: max_batch", low=1)
        self.name = f"K={self.k} if B<={self.max_spec_batch}"

    def _act(self, rows, starts):
        return np.where(rows_in_batch(rows, self.max_batch) <= self.max_spec_batch, self.k, 0)
