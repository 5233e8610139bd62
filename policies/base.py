"""What every K controller shares: reading the observation and SB3's ``predict`` signature.

``predict(obs, state=None, episode_start=None, deterministic=False) -> (action, state)``
takes one observation (``[8]``: an ``np.int64`` action) or a batch (``[n_envs, 8]``: an
``int64`` array), so both :func:`specrl.envs.run_episode` and SB3's ``evaluate_policy`` can
score any controller. Controllers that remember earlier steps keep one state per env on the
object and start it afresh where ``episode_start`` is True; ``state`` is handed back
unchanged, as SB3's feed-forward policies do. ``deterministic`` matters only to
:class:`~specrl.policies.ppo.PPOPolicy`, whose default is True (the most probable K).
"""

from __future__ import annotations

import numpy as np

from specrl.envs.base import (
    BATCH,
    LAST_K,
    STALENESS,
    observation_rows,
)
from specrl.errors import SpecrlError
from specrl.features import NEVER_MEASURED, STALE_STEPS


def rows_in_batch(rows: np.ndarray, max_batch: int) -> np.ndarray:  # rows: [n_envs, 8]
    """Rows the next step decodes (``[n_envs]`` int64), from the ``batch`` entry."""
    return np.clip(np.rint(rows[:, BATCH] * max_batch), 0, max_batch).astype(np.int64)


def drafted_last_step(row: np.ndarray) -> bool:
    """The step just taken drafted tokens: the acceptance estimate is fresh (staleness 0)."""
    return row[STALENESS] == 0.0


def last_k(row: np.ndarray, k_max: int) -> int:
    """K of the step just taken."""
    return int(np.rint(row[LAST_K] * k_max))


def since_measured(previous: int, staleness: float, start: bool) -> int:
    """Steps since a step last drafted, from the observation's ``staleness`` and the count
    kept so far (``previous``), as the env's :class:`~specrl.features.AcceptanceTracker`
    counts them. Below 1 the staleness is ``since / STALE_STEPS`` exactly; at 1 it saturates,
    and the count goes on from ``previous``: :data:`~specrl.features.NEVER_MEASURED` from an
    episode's start until a step drafts, ``STALE_STEPS`` on the step the estimate goes
    stale."""
    if staleness < 1.0:
        return int(round(staleness * STALE_STEPS))
    if start:
        return NEVER_MEASURED
    if previous < STALE_STEPS:
        return STALE_STEPS
    return min(previous + 1, NEVER_MEASURED)


def check_int(value, what: str, *, low: int, high: int | None = None) -> int:
    """``value`` if it is an int in ``[low, high]``, else a SpecrlError naming ``what``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise SpecrlError(f"{what} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise SpecrlError(f"{what} must be {bound}, got {value}")
    return int(value)


class KPolicy:
    """A K controller: subclasses set ``name`` and implement ``_act``."""

    name: str

    def predict(self, obs, state=None, episode_start=None, deterministic=False):
        """K for the coming step of each env; ``deterministic`` is ignored (no controller
        here samples)."""
        rows, single = observation_rows(obs)
        starts = _episode_starts(episode_start, len(rows))
        actions = np.asarray(self._act(rows, starts), dtype=np.int64)
        return (np.int64(actions[0]) if single else actions), state

    def _act(self, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """``rows: [n_envs, 8]``, ``starts: [n_envs]`` bool -> K ``[n_envs]``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class StatefulKPolicy(KPolicy):
    """A controller that remembers earlier steps, one state per env.

    The state of env ``i`` starts afresh where ``episode_start[i]`` is True, on the first
    call, and whenever the number of envs changes. Without ``episode_start`` (None), call
    :meth:`reset` between episodes.
    """

    def __init__(self) -> None:
        self._envs: list = []

    def reset(self) -> None:
        """Forget every env's state."""
        self._envs = []

    def _act(self, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
        if len(self._envs) != len(rows):
            self._envs = [self._fresh_state() for _ in rows]
        for i in np.flatnonzero(starts):
            self._envs[i] = self._fresh_state()
        return np.array([self._decide(s, row) for s, row in zip(self._envs, rows)])

    def _fresh_state(self):
        raise NotImplementedError

    def _decide(self, state, row: np.ndarray) -> int:
        """Learn from the step ``row`` describes (unless ``state`` is fresh), then pick K."""
        raise NotImplementedError


def _episode_starts(episode_start, n_envs: int) -> np.ndarray:
    if episode_start is None:
        return np.zeros(n_envs, dtype=bool)
    starts = np.asarray(episode_start, dtype=bool).reshape(-1)
    if starts.size != n_envs:
        raise SpecrlError(
            f"episode_start has {starts.size} entries for {n_envs} observations; pass one "
            "flag per env"
        )
    return starts
