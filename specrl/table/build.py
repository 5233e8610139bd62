"""From a decision rule to a :class:`~specrl.table.format.KTable`.

* :func:`table_from_policy`: evaluate ``decide(batch, acceptance, context) -> K`` at every
  bin and merge equal neighbouring batch sizes into buckets. ``decide`` is any callable, a
  trained policy's lookup included: this module knows no policy class.
* :func:`monotone_in_acceptance`: the Ks of one batch size made non-decreasing in the
  acceptance estimate, changing as little as possible where the policy is met most.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from specrl.errors import SpecrlError
from specrl.features import STALE_STEPS
from specrl.table.format import (
    K_MAX_LIMIT,
    MAX_BATCH_LIMIT,
    KTable,
    check_acceptance_edges,
    check_context_bins,
)

_WHERE = "table_from_policy"
"""The source named in this module's errors and in the tables it builds."""


def table_from_policy(
    decide: Callable[[int, float, int], int],
    *,
    k_max: int,
    max_batch: int,
    acceptance_edges: list[float],
    provenance: dict,
    context_bins: list[list[int | None]] | None = None,
    stale_decide: Callable[[int, int], int] | None = None,
    probe: dict | None = None,
    monotone: bool = False,
    monotone_weights: Callable[[int, int], list[float]] | None = None,
    request_acceptance: dict | None = None,
) -> KTable:
    """A table holding ``decide``'s K at each bin's representative point.

    ``decide(batch, acceptance, context)`` is called for every batch size ``1..max_batch``,
    every acceptance bin's midpoint and every context bin's representative length: the
    midpoint ``(lo + hi) // 2`` of a closed bin, the start of the last (open-ended) one, and
    1 without context bins. Neighbouring batch sizes whose K agree everywhere (stale entry
    included) become one bucket.

    :param decide: K (an integer ``0..k_max``) for a batch size, acceptance and context.
    :param k_max: the engine's largest K.
    :param max_batch: the largest batch size the table covers.
    :param acceptance_edges: bin edges from 0 to 1, strictly increasing.
    :param provenance: see :func:`specrl.table.format.provenance`.
    :param context_bins: ``[lo, hi]`` context ranges from 1, the last ``[lo, None]``; None:
        the table does not index context.
    :param stale_decide: ``stale_decide(batch, context) -> K`` with acceptance unknown or
        stale. None: the K of the lowest acceptance bin (unknown acceptance is treated as
        the worst; the probe rule then measures it where that K is 0).
    :param probe: the probe rule; default ``{"after_steps": STALE_STEPS, "k": 1}``, which
        probes exactly when the estimate becomes fully stale.
    :param monotone: make each batch size's (and context bin's) Ks non-decreasing in the
        acceptance estimate (:func:`monotone_in_acceptance`); the provenance's
        ``monotone_cells_changed`` counts the cells that changed.
    :param monotone_weights: ``monotone_weights(batch, context_index)``: how much each
        acceptance bin's K counts there (for example how often the policy met that state);
        None: every bin alike.
    :param request_acceptance: the per-request estimate's block, for a table whose
        provenance names one (``acceptance_estimate``; see :mod:`specrl.table.format`).
    """
    n_batch, acceptance_edges, context_bins = _checked_arguments(
        k_max, max_batch, acceptance_edges, context_bins
    )
    points, contexts = _representative_points(acceptance_edges, context_bins)

    rows = []  # per batch size: (k[context][acceptance], stale[context])
    changed = 0
    for batch in range(1, n_batch + 1):
        ks, stale, batch_changed = _decided_row(
            batch,
            decide,
            stale_decide,
            points=points,
            contexts=contexts,
            k_max=k_max,
            monotone=monotone,
            monotone_weights=monotone_weights,
        )
        rows.append((ks, stale))
        changed += batch_changed

    buckets, k, stale_k = _bucketed(rows, by_context=context_bins is not None)
    return KTable(
        k_max=k_max,
        max_batch=max_batch,
        batch_buckets=buckets,
        acceptance_edges=acceptance_edges,
        context_bins=context_bins,
        k=k,
        stale_k=stale_k,
        probe={"after_steps": STALE_STEPS, "k": 1} if probe is None else probe,
        provenance={**provenance, "monotone_cells_changed": changed} if monotone else provenance,
        request_acceptance=request_acceptance,
        source=_WHERE,
    )


def monotone_in_acceptance(
    ks: list[int], k_max: int, weights: list[float] | None = None
) -> list[int]:
    """The non-decreasing sequence of Ks in ``0..k_max`` closest to ``ks`` (one batch size's
    K per acceptance bin, lowest bin first) in the sum of ``weights[j] * |K_j - K'_j|``
    (``weights``: every bin 1 when None; each must be positive); of equally close ones, the
    one with the lowest Ks. A sequence already non-decreasing comes back as it is.

    At a fixed batch size a step's time does not depend on acceptance, while the tokens a
    draft of K+1 adds over one of K, ``a^(K+1)`` at per-token acceptance ``a``, grow with
    ``a``: the best K never falls as acceptance rises. A learned policy interpolates between
    the states it visited and can fall (K=1 at middling estimates with off above them, at
    estimates it rarely met). Weighted by how often the policy met each bin, this keeps what
    it chose where it acted and changes the bins it rarely saw.
    Exact: dynamic programming over bins and Ks, ``O(len(ks) * k_max)``.
    """
    if weights is None:
        weights = [1.0] * len(ks)
    if len(weights) != len(ks) or not all(w > 0 for w in weights):
        raise SpecrlError(
            f"monotone_in_acceptance: weights must be {len(ks)} positive numbers, got {weights!r}"
        )
    levels = range(k_max + 1)
    cost = [0.0] * (k_max + 1)  # cost[v]: the best prefix ending at K=v
    back = []  # back[j][v]: K of bin j-1 in the best prefix with K=v at bin j
    for k, w in zip(ks, weights):
        best, arg, prefix, args = None, 0, [], []
        for v in levels:
            if best is None or cost[v] < best:
                best, arg = cost[v], v
            prefix.append(best)
            args.append(arg)
        cost = [prefix[v] + w * abs(v - k) for v in levels]
        back.append(args)
    v = min(levels, key=lambda u: (cost[u], u))
    out = [0] * len(ks)
    for j in range(len(ks) - 1, -1, -1):
        out[j] = v
        v = back[j][v]
    return out


def _checked_arguments(
    k_max: int,
    max_batch: int,
    acceptance_edges: list[float],
    context_bins: list[list[int | None]] | None,
) -> tuple[int, list[float], list[list[int | None]] | None]:
    """:func:`table_from_policy`'s sizes and bins checked, the bins as lists: the batch sizes
    it covers, the acceptance edges and the context bins."""
    if isinstance(acceptance_edges, tuple):
        acceptance_edges = list(acceptance_edges)
    if isinstance(context_bins, (list, tuple)):
        context_bins = [list(r) if isinstance(r, tuple) else r for r in context_bins]
    n_batch = _int_in(max_batch, "max_batch", MAX_BATCH_LIMIT)
    _int_in(k_max, "k_max", K_MAX_LIMIT)
    check_acceptance_edges(acceptance_edges, f"{_WHERE}: acceptance_edges")
    if context_bins is not None:
        check_context_bins(context_bins, f"{_WHERE}: context_bins")
    return n_batch, acceptance_edges, context_bins


def _representative_points(
    acceptance_edges: list[float], context_bins: list[list[int | None]] | None
) -> tuple[list[float], list[int]]:
    """Where ``decide`` is asked: each acceptance bin's midpoint, and each context bin's
    midpoint ``(lo + hi) // 2`` (the last, open-ended one's start; ``[1]`` without context
    bins)."""
    points = [(lo + hi) / 2 for lo, hi in zip(acceptance_edges, acceptance_edges[1:])]
    contexts = (
        [1]
        if context_bins is None
        else [lo if hi is None else (lo + hi) // 2 for lo, hi in context_bins]
    )
    return points, contexts


def _decided_row(
    batch: int,
    decide: Callable[[int, float, int], int],
    stale_decide: Callable[[int, int], int] | None,
    *,
    points: list[float],
    contexts: list[int],
    k_max: int,
    monotone: bool,
    monotone_weights: Callable[[int, int], list[float]] | None,
) -> tuple[list[list[int]], list[int], int]:
    """One batch size's ``k[context][acceptance]`` and ``stale[context]`` as
    :func:`table_from_policy` holds them, and how many cells the monotone projection changed."""
    ks = [
        [
            _checked_k(decide(batch, a, c), f"{_WHERE}: decide({batch}, {a}, {c})", k_max)
            for a in points
        ]
        for c in contexts
    ]
    changed = 0
    if monotone:
        projected = [
            monotone_in_acceptance(
                row, k_max, None if monotone_weights is None else monotone_weights(batch, c)
            )
            for c, row in enumerate(ks)
        ]
        changed = sum(x != y for raw, new in zip(ks, projected) for x, y in zip(raw, new))
        ks = projected
    if stale_decide is None:
        stale = [by_acceptance[0] for by_acceptance in ks]
    else:
        stale = [
            _checked_k(stale_decide(batch, c), f"{_WHERE}: stale_decide({batch}, {c})", k_max)
            for c in contexts
        ]
    return ks, stale, changed


def _checked_k(value, what: str, k_max: int) -> int:
    """``value`` (what ``what`` returned) as a K in ``0..k_max``."""
    try:
        k = operator.index(value)
    except TypeError:
        raise SpecrlError(f"{what} returned {value!r}, not an integer") from None
    if isinstance(value, bool) or not 0 <= k <= k_max:
        raise SpecrlError(f"{what} returned K={value!r}, not in 0..{k_max}")
    return k


def _bucketed(rows: list, *, by_context: bool) -> tuple[list, list, list]:
    """``rows`` (per batch size from 1: ``(k[context][acceptance], stale[context])``) as the
    table's ``batch_buckets``, ``k`` and ``stale_k``, equal neighbouring sizes merged; without
    context bins the context index is dropped."""
    buckets, k, stale_k = [], [], []
    for batch, row in enumerate(rows, start=1):
        if buckets and row == rows[buckets[-1][1] - 1]:
            buckets[-1][1] = batch
            continue
        buckets.append([batch, batch])
        ks, stale = row
        k.append(ks if by_context else ks[0])
        stale_k.append(stale if by_context else stale[0])
    return buckets, k, stale_k


def _int_in(value, name: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise SpecrlError(f"{_WHERE}: {name} must be an integer 1..{high}, got {value!r}")
    return value
