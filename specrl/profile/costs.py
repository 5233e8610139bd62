"""A profile's step times as dense lookup tables: what the surrogate charges per step, and what
the goodput baseline and the oracle predict with. One place, so both read the same numbers."""

from __future__ import annotations

import numpy as np

from specrl.profile.schema import Profile

CONTEXT_BUCKET = 8
"""Step times are tabulated per 8 tokens of context."""


def interp_linear(x: np.ndarray, xp, fp) -> np.ndarray:
    """Piecewise-linear through (xp, fp), extended linearly past both ends, floored at 0."""
    xp, fp = np.asarray(xp, dtype=np.float64), np.asarray(fp, dtype=np.float64)
    y = np.interp(x, xp, fp)
    if len(xp) > 1:
        lo, hi = x < xp[0], x > xp[-1]
        y[lo] = fp[0] + (x[lo] - xp[0]) * (fp[1] - fp[0]) / (xp[1] - xp[0])
        y[hi] = fp[-1] + (x[hi] - xp[-1]) * (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
    return np.maximum(y, 0.0)


def _points_table(points: dict, n: int) -> list[float]:
    """Seconds for 0..n-1 padded tokens, from measured points (0 tokens cost nothing)."""
    return interp_linear(np.arange(n, dtype=np.float64), *_points(points)).tolist()


def points_seconds(points: dict, tokens: float) -> float:
    """Seconds for ``tokens`` padded tokens, as :func:`_points_table` reads ``points``."""
    return float(interp_linear(np.array([float(tokens)]), *_points(points))[0])


def _points(points: dict) -> tuple[np.ndarray, np.ndarray]:
    xp = np.concatenate(([0.0], points["tokens"]))
    fp = np.concatenate(([0.0], points["seconds"]))
    keep = np.concatenate(([True], np.diff(xp) > 0))
    return xp[keep], fp[keep]


class StepCosts:
    """Median step times of ``profile`` for every batch size ``0..max_batch``, K ``0..k_max``
    and context bucket up to ``max_len``, interpolated linearly in batch size and context
    (extended linearly past the measured grid).

    * ``step_s[b][k][c // CONTEXT_BUCKET]``: verify + draft + overhead, without prefill or
      catch-up.
    * ``sigma[b]``: the measured log-spread of a step's time around the table (interpolated in
      batch size, held at the grid's ends).
    * ``prefill_s[tokens]``, ``catchup_s[tokens]``: by padded tokens (rows x widest row).
    """

    def __init__(self, profile: Profile, *, max_batch: int, max_len: int, k_max: int):
        self.max_batch, self.max_len, self.k_max = max_batch, max_len, k_max
        prof = profile
        batches = np.arange(max_batch + 1, dtype=np.float64)
        contexts = np.arange(0, max_len + CONTEXT_BUCKET, CONTEXT_BUCKET, dtype=np.float64)
        step = np.empty((len(batches), k_max + 1, len(contexts)))
        for k in range(k_max + 1):
            per_ctx = np.array(
                [
                    [prof.step_seconds(b, k, c) for c in range(len(prof.contexts))]
                    for b in range(len(prof.batch_sizes))
                ]
            )  # [n_batch_grid, n_ctx_grid]
            by_batch = np.stack(
                [interp_linear(batches, prof.batch_sizes, column) for column in per_ctx.T],
                axis=1,
            )  # [max_batch + 1, n_ctx_grid]
            for b in range(len(batches)):
                step[b, k] = interp_linear(contexts, prof.contexts, by_batch[b])
        self.step_array = step  # [max_batch + 1, k_max + 1, n_context_buckets]
        self.step_s = step.tolist()
        # The spread is held at the grid's ends: extended linearly it grew with every batch
        # past a small grid (a profile of batches 1-2 read sigma 38 at batch 128).
        self.sigma = np.interp(batches, prof.batch_sizes, prof.time_log_sigma).tolist()
        n_tokens = max_batch * max_len + 1
        self.prefill_s = _points_table(prof.prefill, n_tokens)
        self.catchup_s = _points_table(prof.catchup, n_tokens)

    def seconds(self, batch: int, k: int, context: float) -> float:
        """Table time of one step (no prefill or catch-up); batch and context are clamped to
        the tables' range."""
        b = min(max(int(batch), 0), self.max_batch)
        c = min(max(int(context), 0), self.max_len) // CONTEXT_BUCKET
        return self.step_s[b][k][c]
