"""Per-request acceptance levels, and how they drift, fitted from the acceptance pass.

Acceptance is strongly per request (a request whose greedy continuation loops accepts
nearly every draft token throughout). Each request's level is recorded as the logit offset
that makes the group's rates reproduce its accepted count, shrunk toward 0 by its sampling
noise (empirical Bayes, :func:`request_offsets`); the profile keeps their quantiles
(``request_levels``), and the surrogate gives each request a level drawn from them, which
drifts as the request decodes where the profile records how levels drift (``level_drift``:
:func:`fit_level_drift`, the model of :mod:`specrl.profile.levels`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specrl.profile.acceptance import OUTPUT_EDGES
from specrl.profile.levels import FIXED_LEVEL, drift, grid_index, level_grid

LEVEL_QUANTILES = 33
"""Quantiles of the per-request logit offsets kept in the profile."""
LEVEL_BOUND = 6.0
"""Per-request logit offsets are fitted within +-6 (a rate of 0.5 moves to 0.0025 or 0.9975)."""


def _expected_accepted(logits: np.ndarray, drafted: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Per step: expected accepted draft tokens with conditional rates
    ``sigmoid(logits + offset)`` over the first ``drafted`` positions.

    logits: [S, K]; drafted: [S]; offset: [S]. Returns [S]."""
    rates = 1.0 / (1.0 + np.exp(-(logits + offset[:, None])))
    allowed = np.arange(logits.shape[1])[None, :] < drafted[:, None]
    return (np.cumprod(rates, axis=1) * allowed).sum(axis=1)


def _logit(p) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def request_offsets(steps: np.ndarray, rates: Sequence[Sequence[float]]) -> np.ndarray:
    """Each request's acceptance level as a logit offset from the group's ``rates`` (conditional,
    [bucket][position]), shrunk toward 0 by its sampling noise.

    ``steps``: [S, 4] rows of (request, bucket, drafted, accepted). The raw offset makes the
    request's expected accepted count equal its observed one (bisection within
    :data:`LEVEL_BOUND`). A request with few drafted tokens has a noisy raw offset, and the
    surrogate's own per-token draws add that noise again, so each offset is shrunk by
    ``tau^2 / (tau^2 + v_r)``: ``v_r`` is the offset's sampling variance (1 / Fisher
    information of the accepted count), ``tau^2`` the spread between requests net of it.
    Last, one shift for the whole group makes its expected accepted tokens equal the observed
    ones again."""
    if len(steps) == 0:
        return np.zeros(0)
    ids, inverse = np.unique(steps[:, 0], return_inverse=True)
    logits = _logit(rates)[steps[:, 1]]  # [S, K]
    drafted, accepted = steps[:, 2], steps[:, 3].astype(np.float64)
    observed = np.bincount(inverse, weights=accepted)
    lo = np.full(len(ids), -LEVEL_BOUND)
    hi = np.full(len(ids), LEVEL_BOUND)
    for _ in range(40):
        mid = (lo + hi) / 2
        expected = np.bincount(inverse, weights=_expected_accepted(logits, drafted, mid[inverse]))
        below = expected < observed
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    raw = (lo + hi) / 2
    # Fisher information of the offset, numerically: d expected / d offset.
    h = 1e-3
    slope = (
        np.bincount(inverse, weights=_expected_accepted(logits, drafted, raw[inverse] + h))
        - np.bincount(inverse, weights=_expected_accepted(logits, drafted, raw[inverse] - h))
    ) / (2 * h)
    noise = 1.0 / np.maximum(slope, 1e-3)
    tau2 = max(0.0, float(np.var(raw) - np.mean(np.minimum(noise, LEVEL_BOUND**2))))
    shrunk = raw * tau2 / (tau2 + noise)
    # Shrinking moves high rates down more than low ones up (the sigmoid bends), so the
    # group would accept less than it did; one shift restores its accepted total.
    total = accepted.sum()
    lo_s, hi_s = -LEVEL_BOUND, LEVEL_BOUND
    for _ in range(40):
        mid = (lo_s + hi_s) / 2
        expected = _expected_accepted(logits, drafted, shrunk[inverse] + mid).sum()
        lo_s, hi_s = (mid, hi_s) if expected < total else (lo_s, mid)
    return shrunk + (lo_s + hi_s) / 2


DRIFT_PER_TOKEN = (1.0, 0.995, 0.99, 0.985, 0.98, 0.975, 0.97, 0.96, 0.95, 0.93, 0.9, 0.85)
"""Candidate ``phi`` of :func:`fit_level_drift` (1: a fixed level)."""
DRIFT_SCALE = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.65, 1.8, 2.0, 2.25, 2.5, 2.75, 3.0)
"""Candidate ``scale`` of :func:`fit_level_drift`."""
DRIFT_MIN_REQUESTS = 24
"""Fewer requests with tokens drafted in both halves than this: too few to fit a drift; the
level stays fixed (``phi = 1``, ``scale = 1``)."""
DRIFT_REPLICAS = 4
"""Simulated replicas of every measured request per candidate."""


def _request_tokens(steps: np.ndarray) -> np.ndarray:
    """Each measured request's tokens committed by its drafting steps (accepted + 1 each), in
    the order of ``np.unique`` of the request ids."""
    ids, inverse = np.unique(steps[:, 0], return_inverse=True)
    return np.bincount(inverse, weights=steps[:, 3] + 1, minlength=len(ids)).astype(np.int64)


def _drift_statistics(steps: np.ndarray):
    """Across requests (``steps``: rows of (request, bucket, drafted, accepted) in the order
    they ran): the standard deviation of accepted / drafted over requests with at least 24
    drafted, and the correlation of accepted / drafted between each request's first and second
    half of steps (both halves with at least 8 drafted); then their counts and the pooled
    accepted / drafted."""
    ids, inverse = np.unique(steps[:, 0], return_inverse=True)
    n = len(ids)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(steps), dtype=np.int64)
    rank[order] = np.arange(len(steps)) - np.repeat(starts, counts)
    first = rank < ((counts + 1) // 2)[inverse]
    drafted, accepted = steps[:, 2].astype(np.float64), steps[:, 3].astype(np.float64)
    d1 = np.bincount(inverse, weights=drafted * first, minlength=n)
    a1 = np.bincount(inverse, weights=accepted * first, minlength=n)
    d2 = np.bincount(inverse, weights=drafted, minlength=n) - d1
    a2 = np.bincount(inverse, weights=accepted, minlength=n) - a1
    whole = (d1 + d2) >= 24
    both = (d1 >= 8) & (d2 >= 8)
    rate = (a1 + a2)[whole] / (d1 + d2)[whole]
    r1, r2 = a1[both] / d1[both], a2[both] / d2[both]
    sd = float(rate.std()) if whole.sum() > 1 else 0.0
    corr = float(np.corrcoef(r1, r2)[0, 1]) if both.sum() > 2 and r1.std() and r2.std() else 0.0
    pooled = float(accepted.sum() / max(1.0, drafted.sum()))
    return sd, corr, int(whole.sum()), int(both.sum()), pooled


def simulate_requests(
    tokens: np.ndarray,
    logits: np.ndarray,
    edges: Sequence[int],
    grid: np.ndarray,
    phi: float,
    shift: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Requests served as the engine (and the surrogate) serves them at K = ``logits.shape[1]``
    every step, until each has committed its ``tokens``: a row drafts ``min(K, left - 1)``,
    accepts draft token ``i`` with ``sigmoid(logits[bucket, i] + level)`` (``bucket`` by
    tokens generated so far, ``edges``), stops at the first rejection and commits the accepted
    tokens plus one; its level follows ``grid`` (a level per grid point of ``z``,
    :func:`~specrl.profile.levels.level_grid`) plus ``shift``, ``z`` drifting with ``phi`` per
    token. Returns the drafting steps as rows of (request, bucket, drafted, accepted)."""
    k = logits.shape[1]
    left = np.asarray(tokens, dtype=np.int64).copy()
    generated = np.ones(len(left), dtype=np.int64)  # the prefill's token
    z = rng.standard_normal(len(left))
    positions = np.arange(k)[None, :]
    rows = []
    while (live := np.flatnonzero(left > 0)).size:
        drafted = np.minimum(left[live] - 1, k)
        bucket = np.searchsorted(edges, generated[live], side="right")
        level = grid[grid_index(z[live])] + shift
        rates = 1.0 / (1.0 + np.exp(-(logits[bucket] + level[:, None])))
        ok = (rng.random((live.size, k)) < rates) & (positions < drafted[:, None])
        accepted = np.cumprod(ok, axis=1).sum(1)
        drafting = drafted > 0
        rows.append(np.stack([live, bucket, drafted, accepted], axis=1)[drafting])
        committed = accepted + 1
        left[live] -= np.minimum(committed, left[live])
        generated[live] += committed
        z[live] = drift(z[live], phi, committed, rng)
    return np.concatenate(rows) if rows else np.zeros((0, 4), dtype=np.int64)


def fit_level_drift(
    steps: np.ndarray,
    rates: Sequence[Sequence[float]],
    quantiles: Sequence[float],
    edges: Sequence[int] = OUTPUT_EDGES,
    seed: int = 0,
) -> dict:
    """How a group's request levels drift as requests generate: ``{"per_token": phi, "scale":
    s, "shift": c}`` of :mod:`specrl.profile.levels`.

    Indirect inference: the measured requests (``steps``: rows of (request, bucket, drafted,
    accepted) in the order they ran; ``rates``: the group's conditional rates per bucket of
    ``edges`` and position; ``quantiles``: its ``request_levels``) are served again in
    simulation (:func:`simulate_requests`, :data:`DRIFT_REPLICAS` times each, every request
    committing as many tokens as measured) for every candidate of :data:`DRIFT_PER_TOKEN` x
    :data:`DRIFT_SCALE`. The candidate kept is the one whose two statistics
    (:func:`_drift_statistics`: the spread of per-request accepted / drafted, and its
    correlation between each request's two halves) lie nearest to the measured ones, in units
    of their sampling error: computed the same way on measured and simulated requests, both
    carry the same sampling noise. Then ``shift`` makes the simulated requests accept as many
    of their drafted tokens as the measured ones did. Too few requests
    (:data:`DRIFT_MIN_REQUESTS`): a fixed level."""
    fixed = dict(FIXED_LEVEL)
    steps = np.asarray(steps, dtype=np.int64).reshape(-1, 4)
    if len(steps) == 0:
        return fixed
    sd, corr, n_whole, n_both, pooled = _drift_statistics(steps)
    if n_both < DRIFT_MIN_REQUESTS or sd <= 0:
        return fixed
    logits = _logit(rates)
    tokens = np.tile(_request_tokens(steps), DRIFT_REPLICAS)
    se_sd = sd / math.sqrt(2 * n_whole)
    se_corr = max(1e-3, (1 - corr * corr) / math.sqrt(n_both))

    def simulate(phi, scale, shift):
        grid = level_grid(quantiles, scale)
        rng = np.random.default_rng(seed)
        return _drift_statistics(simulate_requests(tokens, logits, edges, grid, phi, shift, rng))

    best, best_loss = (1.0, 1.0), math.inf
    for phi in DRIFT_PER_TOKEN:
        for scale in DRIFT_SCALE:
            s_sd, s_corr, *_ = simulate(phi, scale, 0.0)
            loss = ((s_sd - sd) / se_sd) ** 2 + ((s_corr - corr) / se_corr) ** 2
            if loss < best_loss:
                best, best_loss = (phi, scale), loss
    phi, scale = best
    lo, hi = -1.0, 1.0
    for _ in range(12):  # the shift that accepts as many drafted tokens as measured
        mid = (lo + hi) / 2
        if simulate(phi, scale, mid)[4] < pooled:
            lo = mid
        else:
            hi = mid
    return {"per_token": phi, "scale": scale, "shift": round((lo + hi) / 2, 4)}


def level_quantiles(values: np.ndarray, n: int = LEVEL_QUANTILES) -> list[float]:
    """A group's ``request_levels``: ``n`` quantiles of its requests' offsets, at
    probabilities ``(i + 0.5) / n`` (all 0 for a group with no request that drafted)."""
    if len(values) == 0:
        return [0.0] * n
    return [round(float(q), 4) for q in np.quantile(values, (np.arange(n) + 0.5) / n)]
