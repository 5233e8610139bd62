"""The goodput model: K maximizing predicted committed tokens per second, from the profile's
step times and the observed acceptance."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrl.envs.base import CONTEXT, LAST_ACCEPT, STALENESS
from specrl.errors import SpecrlError
from specrl.features import ACCEPTANCE_EMA, conditional_acceptance
from specrl.policies.base import (
    StatefulKPolicy,
    check_int,
    drafted_last_step,
    last_k,
    rows_in_batch,
)
from specrl.profile import Profile, load_profile
from specrl.profile.costs import StepCosts


def expected_tokens(a: float, k: int) -> float:
    """Committed tokens per row at K: ``E(K) = 1 + a + ... + a^K`` (accepted plus the bonus
    or recovered token)."""
    return sum(a**i for i in range(k + 1))


@dataclass
class _GoodputState:
    rate: float = 0.0
    """EMA of the measured accepted / drafted over the steps that drafted."""
    drafted_k: int = 0
    """K of the last step that drafted; 0 before one."""
    acted: bool = False


class Goodput(StatefulKPolicy):
    """SmartSpec/TurboSpec's goodput rule (Liu et al. 2024, "Optimizing speculative decoding
    for serving LLMs using goodput"), also vLLM's adaptive-K (PR #47111): per step, the K
    maximizing ``B * E(K) / step_seconds(B, K, context)``.

    * ``B`` and the context come from the observation; step times from the profile
      (:class:`~specrl.profile.costs.StepCosts`, the tables the surrogate charges).
    * ``E(K) = 1 + a + ... + a^K`` with one conditional acceptance ``a`` per position, as
      SmartSpec estimates it: a moving average of the measured acceptance rate (accepted /
      drafted, the observation's ``last_accept``; weight :data:`~specrl.features.ACCEPTANCE_EMA`
      over the steps that drafted, started at the first), read as ``a`` by inverting
      ``rate = (a + ... + a^K') / K'`` at ``K'``, the K of the last step that drafted.
      Measured acceptance decays with position, so a constant ``a`` overestimates long
      drafts, as the papers' model does.
    * Not the observation's own estimate (an EMA of each step's inverted rate), which the
      learned table reads: goodput reads worse with it (docs/baselines.md), and a baseline
      gets its stronger form.
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

    def _fresh_state(self) -> _GoodputState:
        return _GoodputState()

    def _decide(self, state: _GoodputState, row: np.ndarray) -> int:
        if state.acted and drafted_last_step(row):
            rate = float(row[LAST_ACCEPT])
            if state.drafted_k:
                state.rate += ACCEPTANCE_EMA * (rate - state.rate)
            else:
                state.rate = rate
            state.drafted_k = last_k(row, self.k_max)
        state.acted = True
        batch = int(rows_in_batch(row[None], self.max_batch)[0])
        if batch == 0:
            return 0
        if row[STALENESS] >= 1.0 or not state.drafted_k:
            return self.probe_k
        a = conditional_acceptance(state.rate, state.drafted_k)
        return self.best_k(batch, row[CONTEXT] * self.max_len, a)
