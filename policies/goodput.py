"""The goodput model: K maximizing predicted committed tokens per second, from the profile's
step times and the observed acceptance."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrl.errors import SpecrlError
from specrl.policies.base import ACCEPTANCE, CONTEXT, STALENESS, KPolicy, check_int, rows_in_batch
from specrl.profile import Profile, load_profile
from specrl.profile.costs import StepCosts


def expected_tokens(a: float, k: int) -> float:
    """Committed tokens per row at K: ``E(K) = 1 + a + ... + a^K`` (accepted plus the bonus
    or recovered token)."""
    return sum(a**i for i in range(k + 1))


class Goodput(KPolicy):
    """SmartSpec/TurboSpec's goodput rule (Liu et al. 2024, "Optimizing speculative decoding
    for serving LLMs using goodput"), also vLLM's adaptive-K (PR #47111): per step, the K
    maximizing ``B * E(K) / step_seconds(B, K, context)``.

    * ``B`` and the context come from the observation; step times from the profile
      (:class:`~specrl.profile.costs.StepCosts`, the tables the surrogate charges).
    * ``E(K) = 1 + a + ... + a^K`` with one conditional acceptance ``a`` per position: the
      observation's acceptance estimate, an EMA of each drafting step's per-token acceptance
      (:class:`~specrl.features.AcceptanceTracker`, started at the first measured step).
      Measured acceptance decays with position, so a constant ``a`` overestimates long
      drafts, as the papers' model does.
    * With nothing to measure from (staleness 1: no step drafted in
      :data:`~specrl.features.STALE_STEPS` steps, as at an episode's start) it drafts
      ``probe_k`` for one step to measure acceptance again.
    * An empty batch gets K=0.

    :param profile: the hardware profile (or its path) whose step times are predicted with.
    :param max_batch: the environment's ``max_batch`` (the observation's batch scale).
    :param max_len: the environment's ``max_len`` (the observation's context scale).
    :param k_max: the environment's largest K, at most the profile's.
    :param probe_k: K of a probing step, ``1..k_max``.
    """

    def __init__(
        self,
        profile: Profile | str | Path,
        *,
        max_batch: int,
        max_len: int,
        k_max: int,
        probe_k: int = 1,
    ):
        super().__init__()
        if not isinstance(profile, Profile):
            profile = load_profile(profile)
        self.k_max = check_int(k_max, "Goodput: k_max", low=1)
        if self.k_max > profile.k_max:
            raise SpecrlError(
                f"Goodput: k_max={k_max} is above the profile's k_max ({profile.k_max}); it "
                "has no step times for larger K. Lower k_max or measure a profile with "
                f"`specrl profile --k-max {k_max}`"
            )
        self.max_batch = check_int(max_batch, "Goodput: max_batch", low=1)
        self.max_len = check_int(max_len, "Goodput: max_len", low=1)
        self.probe_k = check_int(probe_k, "Goodput: probe_k", low=1, high=self.k_max)
        self.costs = StepCosts(profile, max_batch=max_batch, max_len=max_len, k_max=k_max)
        self.name = "goodput"

    def best_k(self, batch: int, context: float, a: float) -> int:
        """The K of highest predicted goodput (the smaller K on a tie)."""
        goodput = [
            batch * expected_tokens(a, k) / self.costs.seconds(batch, k, context)
            for k in range(self.k_max + 1)
        ]
        return int(np.argmax(goodput))

    def _act(self, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
        batches = rows_in_batch(rows, self.max_batch)
        return np.array([self._decide(int(b), row) for b, row in zip(batches, rows)])

    def _decide(self, batch: int, row: np.ndarray) -> int:
        if batch == 0:
            return 0
        if row[STALENESS] >= 1.0:
            return self.probe_k
        return self.best_k(batch, row[CONTEXT] * self.max_len, float(row[ACCEPTANCE]))
