"""Controllers that adapt K from the acceptance they see: Hugging Face transformers' heuristic
and SGLang's accept-length EMA.

Both read only the previous step's outcome from the observation (``last_k``, ``last_accept``
and ``staleness``, 0 when that step drafted) and keep one state per env (see
:class:`~specrl.policies.base.StatefulKPolicy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specrl.envs.base import LAST_ACCEPT
from specrl.errors import SpecrlError
from specrl.policies.base import (
    StatefulKPolicy,
    check_int,
    drafted_last_step,
    last_k,
    rows_in_batch,
)


@dataclass
class _HFState:
    k: int
    acted: bool = False


class HFHeuristic(StatefulKPolicy):
    """Hugging Face transformers' ``num_assistant_tokens_schedule="heuristic"``
    (``AssistedCandidateGenerator.update_candidate_strategy``): after a step whose draft
    tokens were all accepted, K grows by 2, otherwise it shrinks by 1, never below 1.

    transformers starts at ``num_assistant_tokens=20`` and lets K grow without bound (only
    the remaining length caps a draft); here K starts at ``initial_k`` (default ``k_max``,
    i.e. 20 clamped) and stays within ``[1, k_max]``, so one rejection after a run of full
    acceptance costs one token, not many. transformers is batch 1 only, so the rule is blind
    to the batch size: in a batch, "all accepted" means every row accepted every draft token
    (``last_accept == 1``). A step that drafted nothing leaves K unchanged.

    :param k_max: the environment's largest K.
    :param initial_k: K of an episode's first step; default ``k_max``.
    """

    def __init__(self, *, k_max: int, initial_k: int | None = None):
        super().__init__()
        self.k_max = check_int(k_max, "HFHeuristic: k_max", low=1)
        self.initial_k = self.k_max if initial_k is None else initial_k
        check_int(self.initial_k, "HFHeuristic: initial_k", low=1, high=self.k_max)
        self.name = "hf"

    def _fresh_state(self) -> _HFState:
        return _HFState(self.initial_k)

    def _decide(self, state: _HFState, row: np.ndarray) -> int:
        if state.acted and drafted_last_step(row):
            if row[LAST_ACCEPT] >= 1.0:
                state.k = min(state.k + 2, self.k_max)
            else:
                state.k = max(state.k - 1, 1)
        state.acted = True
        return state.k


@dataclass
class _Band:
    k: int
    ema: float
    steps: int = 0


@dataclass
class _EMAState:
    bands: list[_Band]
    band: int = -1
    """Band of the step just taken; -1 before the first."""


class AcceptEMA(StatefulKPolicy):
    """SGLang ``--speculative-adaptive`` (``AdaptiveSpeculativeParams``, PR #23336): an EMA of the
    accepted draft tokens per row, and K one above it, ``round(EMA) + 1``, picked from
    ``candidate_steps`` with hysteresis; one EMA and K per batch-size band.

    After a step that drafted, the band that step ran in updates ``EMA += ema_alpha *
    (accepted per row - EMA)``, accepted per row being ``last_accept * last K`` (exact when
    every row drafted K). After ``warmup_steps`` such updates, every ``update_interval``-th
    re-decides the band's K as SGLang does: from the current candidate, step down while
    ``EMA <= previous candidate - 0.5 + down_hysteresis``, then up while ``EMA > current
    candidate - 0.5 + up_hysteresis``. The defaults are SGLang's (0.0, -0.25): no dead band,
    K is a function of the EMA, shifted so that stepping up is easier, which matters because
    the EMA can never exceed the current K; stability comes from the EMA and
    ``update_interval``. With ``up_hysteresis > down_hysteresis`` a K also holds inside a
    dead band that wide: (-0.25, 0.25) keeps K until the EMA is 0.25 past a midpoint of
    ``round(EMA) + 1``, but then stepping up from K needs more than K - 0.25 accepted per
    row, nearly every draft token.

    A band starts at the candidate nearest ``initial_k`` with its EMA at that K - 1 (as
    SGLang does). K=0 is never chosen: SGLang picks from its candidate steps.

    :param k_max: the environment's largest K.
    :param max_batch: the environment's ``max_batch`` (the observation's batch scale).
    :param candidate_steps: the Ks to choose from, each in ``1..k_max``; default
        ``1..k_max`` (SGLang's default is ``[1, 3, 7]``).
    :param band_ends: upper end (inclusive) of every batch-size band but the last, which is
        open: the default ``(4, 16, 64)`` gives bands 1-4, 5-16, 17-64, 65+.
    :param ema_alpha: weight of the newest step (SGLang's default 0.2).
    :param down_hysteresis: shift of the threshold for stepping down.
    :param up_hysteresis: shift of the threshold for stepping up.
    :param warmup_steps: updates per band before its first decision (SGLang: 10 batches).
    :param update_interval: updates between decisions (SGLang: 5 batches).
    :param initial_k: starting K of every band; default the largest candidate (the engine's
        configured number of steps).
    """

    def __init__(
        self,
        *,
        k_max: int,
        max_batch: int,
        candidate_steps: Sequence[int] | None = None,
        band_ends: Sequence[int] = (4, 16, 64),
        ema_alpha: float = 0.2,
        down_hysteresis: float = 0.0,
        up_hysteresis: float = -0.25,
        warmup_steps: int = 10,
        update_interval: int = 5,
        initial_k: int | None = None,
    ):
        super().__init__()
        self.k_max = check_int(k_max, "AcceptEMA: k_max", low=1)
        self.max_batch = check_int(max_batch, "AcceptEMA: max_batch", low=1)
        steps = range(1, self.k_max + 1) if candidate_steps is None else candidate_steps
        if not len(steps):
            raise SpecrlError("AcceptEMA: candidate_steps must not be empty")
        for k in steps:
            check_int(k, "AcceptEMA: candidate_steps entry", low=1, high=self.k_max)
        self.candidate_steps = sorted(set(int(k) for k in steps))
        ends = [check_int(b, "AcceptEMA: band_ends entry", low=1) for b in band_ends]
        if any(b <= a for a, b in zip(ends, ends[1:])):
            raise SpecrlError(f"AcceptEMA: band_ends must be increasing, got {list(band_ends)}")
        self.band_ends = np.asarray(ends, dtype=np.int64)
        if not 0.0 < ema_alpha <= 1.0:
            raise SpecrlError(f"AcceptEMA: ema_alpha must be in (0, 1], got {ema_alpha!r}")
        self.ema_alpha = float(ema_alpha)
        self.down_hysteresis, self.up_hysteresis = float(down_hysteresis), float(up_hysteresis)
        self.warmup_steps = check_int(warmup_steps, "AcceptEMA: warmup_steps", low=0)
        self.update_interval = check_int(update_interval, "AcceptEMA: update_interval", low=1)
        start = self.candidate_steps[-1] if initial_k is None else initial_k
        check_int(start, "AcceptEMA: initial_k", low=1, high=self.k_max)
        self.initial_k = min(self.candidate_steps, key=lambda k: (abs(k - start), -k))
        self.name = "ema"

    def band_of(self, batch: int) -> int:
        """Index of the band holding ``batch`` rows."""
        return int(np.searchsorted(self.band_ends, batch, side="left"))

    def _fresh_state(self) -> _EMAState:
        n_bands = len(self.band_ends) + 1
        return _EMAState([_Band(self.initial_k, self.initial_k - 1.0) for _ in range(n_bands)])

    def _decide(self, state: _EMAState, row: np.ndarray) -> int:
        if state.band >= 0 and drafted_last_step(row):
            self._update(state.bands[state.band], row[LAST_ACCEPT] * last_k(row, self.k_max))
        state.band = self.band_of(int(rows_in_batch(row[None], self.max_batch)[0]))
        return state.bands[state.band].k

    def _update(self, band: _Band, accepted_per_row: float) -> None:
        band.ema += self.ema_alpha * (accepted_per_row - band.ema)
        band.steps += 1
        past_warmup = band.steps - self.warmup_steps
        if past_warmup > 0 and past_warmup % self.update_interval == 0:
            band.k = self._target(band.k, band.ema)

    def _target(self, k: int, ema: float) -> int:
        """SGLang's ``_recompute_params`` over the candidate steps."""
        steps = self.candidate_steps
        i = steps.index(k)
        while i > 0 and ema <= steps[i - 1] - 0.5 + self.down_hysteresis:
            i -= 1
        while i < len(steps) - 1 and ema > steps[i] - 0.5 + self.up_hysteresis:
            i += 1
        return steps[i]
