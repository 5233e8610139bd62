"""From a decision rule to a :class:`~specrl.table.KTable`, and from a table to the serving
stacks' own formats.

* :func:`table_from_policy`: evaluate ``decide(batch, acceptance, context) -> K`` at every
  bin and merge equal neighbouring batch sizes into buckets.
* :func:`monotone_in_acceptance`: the Ks of one batch size made non-decreasing in the
  acceptance estimate, changing as little as possible where the policy is met most.
* :func:`to_vllm`: vLLM Dynamic SD (``num_speculative_tokens_per_batch_size``, PR #32374).
* :func:`to_trtllm`: TensorRT-LLM ``draft_len_schedule`` in its current upper-bound reading
  (PR #10860).
* :func:`to_sglang`: SGLang's adaptive speculative config (``--speculative-adaptive-config``,
  PRs #21599, #23336, #24055) with one candidate per batch-size lower bound.
* :func:`export_file`: the object ``specrl export`` writes for each format.

No stack indexes acceptance, so every export collapses the table at one operating point,
an acceptance the caller states (for example the profile's mean acceptance on the training
mix). The stacks' config objects are returned exactly as the stacks read them: vLLM's and
TensorRT-LLM's config classes are strict about their keys, and every key of SGLang's file is
a batch size, so the operating point is not written into them. :func:`export_file` puts it
beside them instead::

    {"speculative_config": {...what the stack reads...},
     "specrl": {"exported_from": "specrl-k-table", "acceptance": 0.62, ...}}

``policies.BatchSchedule.from_file`` reads that file as it is; a stack gets
``speculative_config`` (vLLM and TensorRT-LLM merged with their ``method`` and draft model;
SGLang reads it, as it is, as the file ``--speculative-adaptive-config`` names).
"""

from __future__ import annotations

import bisect
import operator
import warnings
from collections.abc import Callable, Sequence

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.features import STALE_STEPS
from specrl.table import (
    K_MAX_LIMIT,
    MAX_BATCH_LIMIT,
    TABLE_FORMAT,
    KTable,
    check_acceptance_edges,
    check_context_bins,
    is_acceptance,
)

CONTEXT_INFINITY = 2**31 - 1
"""vLLM's end of the last context range; the same value as
``specrl.policies.schedule.CONTEXT_INFINITY`` (that module imports numpy)."""
FORMATS = ("native", "vllm", "trtllm", "sglang")

SGLANG_KEY = "candidate_steps"
"""The one key of each object in SGLang's adaptive speculative config that specrl writes and
reads: ``{"1": {"candidate_steps": [K]}, ...}``."""
SGLANG_CUDA_GRAPH_BS = tuple(
    sorted({*range(1, 9), *range(10, 33, 2), *range(40, 64, 8), *range(64, 161, 16)})
)
"""The CUDA-graph capture sizes SGLang captured by default with speculative decoding in the
versions we read (1-8, 10-32 step 2, 40, 48, 56, 64-160 step 16); pass the deployment's
``--cuda-graph-bs`` where it sets them. SGLang pads a running batch up to one of these."""
SGLANG_VERSION_NOTE = (
    "one candidate per key and K=0 need SGLang's adaptive_spec_params.py after PR #24055; "
    "older versions want at least 2 candidate_steps per key"
)


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
    :param provenance: see :func:`specrl.table.provenance`.
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
    """
    where = "table_from_policy"
    if isinstance(acceptance_edges, tuple):
        acceptance_edges = list(acceptance_edges)
    if isinstance(context_bins, (list, tuple)):
        context_bins = [list(r) if isinstance(r, tuple) else r for r in context_bins]
    n_batch = _int_in(max_batch, "max_batch", MAX_BATCH_LIMIT)
    _int_in(k_max, "k_max", K_MAX_LIMIT)
    check_acceptance_edges(acceptance_edges, f"{where}: acceptance_edges")
    if context_bins is not None:
        check_context_bins(context_bins, f"{where}: context_bins")
    points = [(lo + hi) / 2 for lo, hi in zip(acceptance_edges, acceptance_edges[1:])]
    contexts = (
        [1]
        if context_bins is None
        else [lo if hi is None else (lo + hi) // 2 for lo, hi in context_bins]
    )

    def k_of(value, what: str) -> int:
        try:
            k = operator.index(value)
        except TypeError:
            raise SpecrlError(f"{where}: {what} returned {value!r}, not an integer") from None
        if isinstance(value, bool) or not 0 <= k <= k_max:
            raise SpecrlError(f"{where}: {what} returned K={value!r}, not in 0..{k_max}")
        return k

    rows = []  # per batch size: (k[context][acceptance], stale[context])
    changed = 0
    for batch in range(1, n_batch + 1):
        ks = [
            [k_of(decide(batch, a, c), f"decide({batch}, {a}, {c})") for a in points]
            for c in contexts
        ]
        if monotone:
            projected = [
                monotone_in_acceptance(
                    row, k_max, None if monotone_weights is None else monotone_weights(batch, c)
                )
                for c, row in enumerate(ks)
            ]
            changed += sum(x != y for raw, new in zip(ks, projected) for x, y in zip(raw, new))
            ks = projected
        if stale_decide is None:
            stale = [by_acceptance[0] for by_acceptance in ks]
        else:
            stale = [k_of(stale_decide(batch, c), f"stale_decide({batch}, {c})") for c in contexts]
        rows.append((ks, stale))

    buckets, k, stale_k = [], [], []
    for batch, row in enumerate(rows, start=1):
        if buckets and row == rows[buckets[-1][1] - 1]:
            buckets[-1][1] = batch
            continue
        buckets.append([batch, batch])
        ks, stale = row
        k.append(ks if context_bins is not None else ks[0])
        stale_k.append(stale if context_bins is not None else stale[0])
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
        source=where,
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


# ---------------------------------------------------------------------- serving stacks


def to_vllm(table: KTable, *, acceptance: float) -> dict:
    """vLLM Dynamic SD's speculative config at one acceptance.

    ``num_speculative_tokens`` is the table's ``k_max`` (the engine is started for it);
    ``num_speculative_tokens_per_batch_size`` holds ``[bs_lo, bs_hi, K]`` ranges, equal
    neighbours merged. With context bins it is vLLM's 5-item form
    ``[bs_lo, bs_hi, ctx_lo, ctx_hi, K]``: a rectangular grid, every batch range with every
    context bin, the last context range ending at :data:`CONTEXT_INFINITY`. Batch sizes above
    the table's ``max_batch`` take the last range's K in vLLM, as in the controller. A
    table that drafts at no batch size is written as it is, with a warning.
    """
    column = table.acceptance_bin(check_acceptance(acceptance))
    contexts = range(table.n_context)
    ranges = _merge(table, lambda b: tuple(table.cell(b, c)[column] for c in contexts))
    if table.context_bins is None:
        entries = [[lo, hi, ks[0]] for lo, hi, ks in ranges]
    else:
        context_ranges = [
            (lo, CONTEXT_INFINITY if hi is None else hi) for lo, hi in table.context_bins
        ]
        entries = [
            [lo, hi, c_lo, c_hi, k]
            for lo, hi, ks in ranges
            for (c_lo, c_hi), k in zip(context_ranges, ks)
        ]
    if all(entry[-1] == 0 for entry in entries):
        warnings.warn(
            f"the table drafts nothing at any batch size at acceptance {acceptance}: vLLM would "
            "load the draft model and never use it; serve without speculative decoding at "
            "this operating point",
            category=SpecrlWarning,
            stacklevel=2,
        )
    return {"num_speculative_tokens": table.k_max, "num_speculative_tokens_per_batch_size": entries}


def to_trtllm(table: KTable, *, acceptance: float, context_len: int | None = None) -> dict:
    """TensorRT-LLM's ``{"max_draft_len": M, "draft_len_schedule": {batch: K}}`` at one
    acceptance (and, for a table with context bins, one context length; None: the first bin).

    Keys are upper bounds (PR #10860): ``{4: 4, 8: 2, 32: 1}`` drafts 4 at batch 1-4, 2 at
    5-8, 1 at 9-32 and nothing above. TensorRT-LLM requires the smallest key's value to be
    ``max_draft_len`` and no value above it, so ``max_draft_len`` is the K at batch 1:

    * K rising above it at a larger batch cannot be expressed; it is clamped to it, with a
      warning naming the ranges.
    * K=0 at batch 1 cannot be expressed either (``max_draft_len`` is at least 1): a
      :class:`SpecrlError` says to serve without speculation or to export for vLLM (or,
      where the table drafts at no batch size, to serve without speculation).
    * Trailing ranges with K=0 are left out (above the last key TensorRT-LLM drafts
      nothing); batch sizes above the table's ``max_batch`` also draft nothing there, where
      the controller and vLLM keep the last range's K.
    """
    column = table.acceptance_bin(check_acceptance(acceptance))
    context = table.context_bin(context_len)
    ranges = _merge(table, lambda b: table.cell(b, context)[column])
    first = ranges[0][2]
    if all(k == 0 for *_, k in ranges):
        raise SpecrlError(
            f"the table drafts nothing at any batch size at acceptance {acceptance}: serve "
            "without speculative decoding at this operating point, or export at another "
            "--acceptance"
        )
    if first == 0:
        raise SpecrlError(
            f"the table drafts nothing at batch 1 at acceptance {acceptance}; TensorRT-LLM's "
            "draft_len_schedule cannot turn speculation on at a larger batch only (its "
            "smallest key's value is max_draft_len, >= 1): serve without speculative "
            "decoding at this operating point, or export --format vllm"
        )
    clamped = [(lo, hi, k) for lo, hi, k in ranges if k > first]
    if clamped:
        where = ", ".join(f"batch {lo}-{hi}: K={k}" for lo, hi, k in clamped)
        warnings.warn(
            f"TensorRT-LLM cannot draft more than at batch 1 (max_draft_len={first}); "
            f"clamped {where} to {first}",
            category=SpecrlWarning,
            stacklevel=2,
        )
    uppers: list[list[int]] = []  # [batch upper bound, K], ascending
    for _, hi, k in ranges:
        k = min(k, first)
        if uppers and uppers[-1][1] == k:
            uppers[-1][0] = hi
        else:
            uppers.append([hi, k])
    if uppers[-1][1] == 0:
        uppers.pop()
    return {"max_draft_len": first, "draft_len_schedule": dict(uppers)}


def to_sglang(
    table: KTable,
    *,
    acceptance: float,
    context_len: int | None = None,
    cuda_graph_bs: Sequence[int] = SGLANG_CUDA_GRAPH_BS,
) -> dict:
    """SGLang's adaptive speculative config at one acceptance (and, for a table with context
    bins, one context length; None: the first bin): the JSON object
    ``--speculative-adaptive --speculative-adaptive-config CONFIG.json`` reads, such as
    ``{"1": {"candidate_steps": [4]}, "9": {"candidate_steps": [2]}}``.

    Keys are batch-size *lower* bounds, as strings in ascending order starting at ``"1"``,
    each holding exactly one candidate: a static batch -> K table, K=0 drafting nothing.
    Only SGLang's newest ``adaptive_spec_params.py`` (after PR #24055) accepts one candidate
    and 0; older versions want at least two candidates per key and refuse this file.

    At each step SGLang pads the running batch size up to a CUDA-graph capture size (the
    smallest of ``cuda_graph_bs`` >= the batch; a batch above the largest is not padded)
    and takes the entry of the largest key <= that padded size. So every batch size of one
    *padding group* (those sharing a padded size) drafts the same K:

    * A key is written at the first batch size of each group whose K differs from the
      group before it (equal neighbours merged), so wherever the table is constant on the
      padding groups every batch size ``1..max_batch`` gets the table's own K.
    * Where the table's K differs within a group, the group takes the K the table gives
      its padded size (the table's K at ``max_batch`` when the padded size lies above it,
      as the controller clamps): that is the batch SGLang actually runs, so its step time
      is the one that K was chosen for. A :class:`SpecrlWarning` names the groups that
      changed.
    * Above ``max_batch`` every padded size lies above the last key, so SGLang keeps the
      last key's K, the table's K at ``max_batch``: as the controller and vLLM do, where
      TensorRT-LLM drafts nothing above its last key.

    A table that drafts at no batch size is written as it is, with a warning.

    :param cuda_graph_bs: the deployment's capture sizes (``--cuda-graph-bs``); default
        :data:`SGLANG_CUDA_GRAPH_BS`. Empty: no padding (every batch size its own group).
    """
    sizes = check_cuda_graph_bs(cuda_graph_bs, "to_sglang: cuda_graph_bs")
    column = table.acceptance_bin(check_acceptance(acceptance))
    context = table.context_bin(context_len)
    by_batch = [0]  # the table's K per batch size 0..max_batch (0 unused)
    for b, (lo, hi) in enumerate(table.batch_buckets):
        by_batch += [table.cell(b, context)[column]] * (hi - lo + 1)
    entries: list[list[int]] = []  # [lower bound, K], ascending
    changed = []
    for lo, hi, padded in _padding_groups(table.max_batch, sizes):
        k = by_batch[min(padded, table.max_batch)]
        inside = by_batch[lo : hi + 1]
        if any(x != k for x in inside):
            changed.append((lo, hi, padded, list(dict.fromkeys(inside)), k))
        if not entries or entries[-1][1] != k:
            entries.append([lo, k])
    if changed:
        shown = "; ".join(
            f"batch {lo}-{hi} (padded to {padded}): K {'/'.join(map(str, ks))} -> {k}"
            for lo, hi, padded, ks, k in changed[:8]
        )
        more = f"; and {len(changed) - 8} more groups" if len(changed) > 8 else ""
        warnings.warn(
            "SGLang pads the batch to a CUDA-graph size and drafts one K for every batch "
            "size that pads to the same size; where the table's K differs within such a "
            f"group, took the K the table gives the padded size: {shown}{more}",
            category=SpecrlWarning,
            stacklevel=2,
        )
    if all(k == 0 for _, k in entries):
        warnings.warn(
            f"the table drafts nothing at any batch size at acceptance {acceptance}: SGLang "
            "would load the draft model and never use it; serve without speculative "
            "decoding at this operating point",
            category=SpecrlWarning,
            stacklevel=2,
        )
    return {str(lo): {SGLANG_KEY: [k]} for lo, k in entries}


def check_cuda_graph_bs(value, name: str = "cuda_graph_bs") -> tuple[int, ...]:
    """``value`` as SGLang CUDA-graph capture sizes: a list (or tuple or range) of integers
    >= 1, returned sorted without repeats; else an error naming ``name``. Empty is allowed
    (no padding)."""
    if not isinstance(value, (list, tuple, range)) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in value
    ):
        raise SpecrlError(
            f"{name} must be a list of CUDA-graph batch sizes, integers >= 1 (SGLang's "
            f"--cuda-graph-bs), got {value!r}"
        )
    return tuple(sorted(set(value)))


def sglang_padded(batch: int, cuda_graph_bs: Sequence[int]) -> int:
    """The batch size SGLang runs ``batch`` rows at: the smallest of ``cuda_graph_bs``
    (sorted, as :func:`check_cuda_graph_bs` returns them) >= ``batch``, or ``batch`` itself
    above the largest."""
    i = bisect.bisect_left(cuda_graph_bs, batch)
    return cuda_graph_bs[i] if i < len(cuda_graph_bs) else batch


def export_file(
    table: KTable,
    *,
    fmt: str,
    acceptance: float | None = None,
    context_len: int | None = None,
    cuda_graph_bs: Sequence[int] = SGLANG_CUDA_GRAPH_BS,
) -> dict:
    """The object ``specrl export --format FMT`` writes: the table itself for ``native``;
    for ``vllm``, ``trtllm`` and ``sglang`` the stack's config under ``speculative_config``
    and, under ``specrl``, the operating point it was collapsed at and the table's
    provenance. For ``sglang`` the note also holds the CUDA-graph sizes assumed
    (``cuda_graph_bs``, used for ``sglang`` only) and the SGLang version needed."""
    if fmt not in FORMATS:
        raise SpecrlError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "native":
        return table.to_json()
    if acceptance is None:
        raise SpecrlError(f"--format {fmt} collapses the table over acceptance; give --acceptance")
    if fmt == "vllm":
        config = to_vllm(table, acceptance=acceptance)
        note = {"context": "indexed" if table.context_bins else "not indexed"}
    elif fmt == "trtllm":
        config = to_trtllm(table, acceptance=acceptance, context_len=context_len)
        note = {"context_len": context_len}
    else:
        sizes = check_cuda_graph_bs(cuda_graph_bs)
        config = to_sglang(
            table, acceptance=acceptance, context_len=context_len, cuda_graph_bs=sizes
        )
        note = {
            "context_len": context_len,
            "cuda_graph_bs": list(sizes),
            "sglang_version": SGLANG_VERSION_NOTE,
        }
    return {
        "speculative_config": config,
        "specrl": {
            "exported_from": TABLE_FORMAT,
            "format": fmt,
            "acceptance": acceptance,
            **note,
            "provenance": table.provenance,
        },
    }


def check_acceptance(value, name: str = "acceptance") -> float:
    """``value`` as an acceptance, a finite number in [0, 1]; else an error naming ``name``."""
    if not is_acceptance(value):
        raise SpecrlError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def _int_in(value, name: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise SpecrlError(f"table_from_policy: {name} must be an integer 1..{high}, got {value!r}")
    return value


def _padding_groups(max_batch: int, cuda_graph_bs: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(lo, hi, padded)``: the batch sizes ``lo..hi`` (within ``1..max_batch``) that SGLang
    pads to the same size ``padded``, ascending."""
    groups: list[tuple[int, int, int]] = []
    for batch in range(1, max_batch + 1):
        padded = sglang_padded(batch, cuda_graph_bs)
        if groups and groups[-1][2] == padded:
            groups[-1] = (groups[-1][0], batch, padded)
        else:
            groups.append((batch, batch, padded))
    return groups


def _merge(table: KTable, value_of: Callable[[int], object]) -> list[tuple[int, int, object]]:
    """The table's buckets as ``(lo, hi, value_of(bucket))``, equal neighbours merged."""
    ranges: list[tuple[int, int, object]] = []
    for b, (lo, hi) in enumerate(table.batch_buckets):
        value = value_of(b)
        if ranges and ranges[-1][2] == value:
            ranges[-1] = (ranges[-1][0], hi, value)
        else:
            ranges.append((lo, hi, value))
    return ranges
