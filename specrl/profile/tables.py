"""The profile's step-cost tables, from the timing cells' steps (:mod:`specrl.profile.timing`).

Per batch size, K and context level: the median verify and draft seconds, and the rest of a
step (:func:`rest_of_step`) per batch size and K. Tables are made non-decreasing in context
(more context never makes a step cheaper; what says otherwise is noise), not in batch size.
Prefill and catch-up are charged apart, by padded tokens (:func:`_monotone_points`).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from specrl.errors import SpecrlError
from specrl.profile.schema import Profile
from specrl.profile.synthetic import expected_tokens_per_row
from specrl.profile.timing import TimedCells, cell_statistics, log_spread


def rest_of_step(sample: dict) -> float:
    """A timed step's seconds outside the tables' verify and draft columns (and outside
    prefill and catch-up, charged apart): its ``overhead_s``. At K=0 the engine's "draft"
    interval is the step's setup before the target forward (sampling settings, uniforms,
    input tensors), and ``draft_s`` is 0 there, so it stays in the rest: subtracted, it would
    be left out of every K=0 step, which would read cheaper than served (docs/profile.md)."""
    part = sample["draft"] if sample["k"] else 0.0
    return sample["total"] - part - sample["verify"] - sample["prefill"]


def tabulate(
    timed: TimedCells, batch_sizes, contexts, k_max, acceptance: dict, *, by_cell: bool
) -> Profile:
    """The profile from the :func:`~specrl.profile.timing.time_cells` measurements and the
    acceptance fields (:func:`specrl.profile.measure.acceptance_fields`); with ``by_cell``, the
    cells' medians and spreads for the freshness check (rows it can rebuild: cut from the
    held-out corpus)."""
    samples, small = timed.cells, timed.admissions
    verify, draft, overhead, sigma = _step_tables(samples, batch_sizes, contexts, k_max)
    for table in (verify, draft):
        # Non-decreasing in context only: more context never makes a step cheaper, but a
        # larger batch can (a CPU's kernels change with the shape), and pooling such a pair
        # would make both cells wrong.
        table[:] = _monotone(table, axis=2)
    cells = [cell_statistics(samples[b, contexts[0]], k_max) for b in batch_sizes]
    if not by_cell:
        cells = None
    ctx_seen = _contexts_seen(samples, batch_sizes, contexts)
    if np.any(np.diff(ctx_seen) <= 0):
        raise SpecrlError(
            f"measured contexts {ctx_seen.tolist()} do not increase; space the "
            "--contexts further apart"
        )
    prefill = [
        (b * c, s["prefill"])
        for b in batch_sizes
        for c in contexts
        for s in timed.cell_admissions[b, c]
    ]
    catchup = [
        (s["catchup_padded"], s["catchup"])
        for b in batch_sizes
        for c in contexts
        for s in samples[b, c]
        if s["catchup_tokens"]
    ]
    step = verify[:, :, 0] + draft[:, :, 0] + overhead  # [batch, k]
    return Profile(
        fingerprint={},
        batch_sizes=list(batch_sizes),
        contexts=[round(float(c), 1) for c in ctx_seen],
        k_max=k_max,
        verify_s=verify.tolist(),
        draft_s=draft.tolist(),
        overhead_s=overhead.tolist(),
        time_log_sigma=sigma.tolist(),
        prefill=_monotone_points(prefill + [(s["prefill_padded"], s["prefill"]) for s, _ in small]),
        catchup=_monotone_points(catchup + [(s["catchup_padded"], s["catchup"]) for _, s in small]),
        acceptance=acceptance["acceptance"],
        acceptance_by_output=acceptance["acceptance_by_output"],
        acceptance_counts=acceptance["acceptance_counts"],
        request_levels=acceptance["request_levels"],
        tokens_per_s=_tokens_per_s(acceptance["acceptance"], step, batch_sizes).tolist(),
        level_drift=acceptance["level_drift"],
        cell_s=cells and [medians for medians, _ in cells],
        cell_prefill=_median_points(prefill),
        cell_spread=cells and [spreads for _, spreads in cells],
    )


def _step_tables(samples, batch_sizes, contexts, k_max):
    """Verify and draft medians ``[batch, k, context]``, the rest of a step ``[batch, k]``
    (:func:`rest_of_step`, over every context) and each batch size's spread of its clean
    steps' log time around those tables ``[batch]``, from every cell's decode steps."""
    nb, nk, nc = len(batch_sizes), k_max + 1, len(contexts)
    verify = np.zeros((nb, nk, nc))
    draft = np.zeros((nb, nk, nc))
    overhead = np.zeros((nb, nk))
    sigma = np.zeros(nb)
    for bi, b in enumerate(batch_sizes):
        rest = defaultdict(list)
        for ci, c in enumerate(contexts):
            decode = samples[b, c]
            for k in range(nk):
                at_k = [s for s in decode if s["k"] == k]
                verify[bi, k, ci] = np.median([s["verify"] for s in at_k])
                if k:
                    draft[bi, k, ci] = np.median([s["draft"] - s["catchup"] for s in at_k])
                rest[k] += [rest_of_step(s) for s in at_k]
        for k in range(nk):
            overhead[bi, k] = max(0.0, float(np.median(rest[k])))
        logs = []
        for ci, c in enumerate(contexts):
            for s in samples[b, c]:
                if s["catchup_tokens"] == 0:
                    table = verify[bi, s["k"], ci] + draft[bi, s["k"], ci] + overhead[bi, s["k"]]
                    logs.append(math.log(s["total"] / table))
        sigma[bi] = log_spread(logs)
    return verify, draft, overhead, sigma


def _contexts_seen(samples, batch_sizes, contexts) -> np.ndarray:
    """Each context level's mean context (longest row) over its cells' decode steps."""
    ctx_seen = np.zeros(len(contexts))
    for b in batch_sizes:
        for ci, c in enumerate(contexts):
            decode = samples[b, c]
            ctx_seen[ci] += np.mean([s["context"] for s in decode]) / len(batch_sizes)
    return ctx_seen


def _tokens_per_s(acceptance: dict, step: np.ndarray, batch_sizes) -> np.ndarray:
    """Goodput ``[batch, k]`` at the shortest context: rows x expected tokens per row (the
    mean over the acceptance groups) / the step's seconds (``step``: ``[batch, k]``)."""
    per_row = [
        np.mean(
            [
                expected_tokens_per_row(rates, k)
                for by_band in acceptance.values()
                for rates in by_band.values()
            ]
        )
        for k in range(step.shape[1])
    ]
    return np.array(batch_sizes)[:, None] * np.array(per_row)[None, :] / step


def _pava(y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    blocks: list[list[float]] = []  # [mean, weight, values pooled]
    for v, wv in zip(y, w):
        blocks.append([float(v), float(wv), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, n2), (m1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, _, n in blocks])


def _monotone(table: np.ndarray, axis: int) -> np.ndarray:
    return np.apply_along_axis(_pava, axis, table)


def _by_tokens(pairs: list[tuple[float, float]]) -> dict[float, list[float]]:
    """The seconds measured at each padded token count, the counts in ascending order."""
    by_x: dict[float, list[float]] = defaultdict(list)
    for x, y in pairs:
        by_x[float(x)].append(float(y))
    return {x: by_x[x] for x in sorted(by_x)}


def _median_points(pairs: list[tuple[float, float]]) -> dict:
    """Seconds by padded tokens: the median at each measured token count, as measured (not
    made monotone, nothing pooled across token counts)."""
    by_x = _by_tokens(pairs)
    return {"tokens": list(by_x), "seconds": [float(np.median(ys)) for ys in by_x.values()]}


def _monotone_points(pairs: list[tuple[float, float]]) -> dict:
    """Seconds by padded tokens: :func:`_median_points` made non-decreasing (pool adjacent
    violators, weighted by samples). No line through everything: served traffic's small
    admissions (one request joining a batch) cost a forward's fixed time that a line fitted
    to large prefills underestimates."""
    by_x = _by_tokens(pairs)
    medians = np.array([np.median(ys) for ys in by_x.values()])
    fitted = _pava(medians, np.array([len(ys) for ys in by_x.values()])).tolist()
    return {"tokens": list(by_x), "seconds": fitted}
