"""vLLM Dynamic SD's K schedule (``num_speculative_tokens_per_batch_size``, PR #32374): the
writer :func:`to_vllm` and the reader :func:`read_vllm`.

The config is ``{"num_speculative_tokens": K_MAX, "num_speculative_tokens_per_batch_size":
[[bs_lo, bs_hi, K], ...]}``, or with context ranges ``[bs_lo, bs_hi, ctx_lo, ctx_hi, K]``
entries on a rectangular grid. The reader validates and expands it exactly as vLLM does, so
a schedule scored here behaves the same when served and one vLLM would refuse is refused.
"""

from __future__ import annotations

import warnings
from bisect import bisect_right
from collections.abc import Mapping

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.table.common import FIX_STACK_FILE, VLLM_KEY, merge_buckets
from specrl.table.format import K_MAX_LIMIT, KTable, check_acceptance, is_int

CONTEXT_INFINITY = 2**31 - 1
"""The end of the last context range of a 5-item vLLM table. vLLM sets it to this value
(``_CTX_INFINITY`` in ``vllm/v1/spec_decode/dynamic/utils.py``) whatever the table says, so
any end >= its start is accepted; write ``2147483647`` to say what is meant."""


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
    ranges = merge_buckets(table, lambda b: tuple(table.cell(b, c)[column] for c in contexts))
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


def read_vllm(
    config, *, max_batch: int, k_max: int | None = None, source: str
) -> tuple[list[list[int]], list[int]]:
    """K per batch size ``0..max_batch`` and context range, ``[max_batch + 1][n_context]``
    (row 0 all 0), and the context ranges' inclusive ends, from vLLM Dynamic SD's
    ``config``: the ``num_speculative_tokens_per_batch_size`` list or a speculative config
    dict holding it (and usually ``num_speculative_tokens``; other keys are ignored).

    Entries are all ``[bs_lo, bs_hi, K]`` or all ``[bs_lo, bs_hi, ctx_lo, ctx_hi, K]``.
    Validated as vLLM does: integer bounds > 0 with lo <= hi, K >= 0, batch ranges
    non-overlapping with the first starting at 1 (vLLM sorts them first, so their order
    in the list is free), and a 5-item table a full rectangular grid whose context ranges
    start at 1 and are contiguous, the last extending to :data:`CONTEXT_INFINITY`.
    Expanded as vLLM does: a batch size in a gap takes the K of the range before it,
    one above the last range the last K, and every K is clamped to
    ``num_speculative_tokens`` (when given). A K above it or above ``k_max`` (the engine's
    largest, which the caller clamps to) at a batch size up to ``max_batch`` is named in a
    :class:`SpecrlWarning`, the caller's caller blamed.

    :param source: where ``config`` came from, for error messages.
    """
    entries, cap = _vllm_parts(config, source)
    rows, context_ranges = _check_entries(entries, source)
    columns = []  # per context range: K per batch size 1..max_batch
    for ctx_lo, _ in context_ranges:
        column = sorted((lo, k) for lo, _, c_lo, _, k in rows if c_lo == ctx_lo)
        starts = [lo for lo, _ in column]
        ks = [k if cap is None else min(k, cap) for _, k in column]
        columns.append([ks[bisect_right(starts, b) - 1] for b in range(1, max_batch + 1)])
    table = [[0] * len(columns)] + [list(ks) for ks in zip(*columns)]
    limits = [
        (x, w) for x, w in ((cap, "num_speculative_tokens"), (k_max, "k_max")) if x is not None
    ]
    if limits:
        # vLLM clamps these silently; say so, since the table then means less than it says.
        limit, what = min(limits, key=lambda lw: lw[0])  # a tie names vLLM's own
        contexts = len(context_ranges) > 1
        where = ", ".join(
            f"batch {lo}-{hi}" + (f", context {c_lo}-{c_hi}" if contexts else "") + f": K={k}"
            for lo, hi, c_lo, c_hi, k in rows
            if k > limit and lo <= max_batch  # ranges above max_batch are never read
        )
        how = (
            ", as vLLM does" if what == "num_speculative_tokens" else ": the engine drafts no more"
        )
        if where:
            warnings.warn(
                f"{source}: K above {limit} ({what}) at {where}; clamped to {limit}{how}",
                category=SpecrlWarning,
                stacklevel=3,
            )
    return table, [hi for _, hi in context_ranges]


def _vllm_parts(config, source: str) -> tuple[list, int | None]:
    """The entries and ``num_speculative_tokens`` (None when not given)."""
    cap = None
    if isinstance(config, Mapping):
        if VLLM_KEY not in config:
            raise SpecrlError(f"{source}: no {VLLM_KEY!r}; {FIX_STACK_FILE}")
        cap = config.get("num_speculative_tokens")
        if cap is not None and (not is_int(cap) or not 1 <= cap <= K_MAX_LIMIT):
            raise SpecrlError(
                f"{source}: num_speculative_tokens must be an integer 1..{K_MAX_LIMIT}, got {cap!r}"
            )
        config = config[VLLM_KEY]
    if not isinstance(config, (list, tuple)) or not config:
        raise SpecrlError(
            f"{source}: {VLLM_KEY} must be a non-empty list of [bs_lo, bs_hi, K] or "
            f"[bs_lo, bs_hi, ctx_lo, ctx_hi, K] entries, got {config!r}"
        )
    return list(config), cap


def _check_entries(entries: list, source: str):
    """vLLM's ``validate_and_normalize_dynamic_sd_schedule``: returns the entries as
    ``(bs_lo, bs_hi, ctx_lo, ctx_hi, K)`` and the sorted context ranges, the last one's end
    set to :data:`CONTEXT_INFINITY`."""
    rows, lengths = [], set()
    for i, entry in enumerate(entries):
        where = f"{source}: {VLLM_KEY}[{i}] = {entry!r}"
        if not isinstance(entry, (list, tuple)) or len(entry) not in (3, 5):
            raise SpecrlError(
                f"{where}: each entry is [bs_lo, bs_hi, K] or [bs_lo, bs_hi, ctx_lo, ctx_hi, K]"
            )
        if not all(is_int(x) for x in entry):
            raise SpecrlError(f"{where}: every item must be an integer")
        lengths.add(len(entry))
        bs_lo, bs_hi, *ctx, k = entry
        ctx_lo, ctx_hi = ctx or (1, CONTEXT_INFINITY)
        if min(bs_lo, bs_hi, ctx_lo, ctx_hi) <= 0:
            raise SpecrlError(f"{where}: batch and context bounds must be > 0")
        if bs_lo > bs_hi:
            raise SpecrlError(f"{where}: the batch range's start {bs_lo} is above its end {bs_hi}")
        if ctx_lo > ctx_hi:
            raise SpecrlError(
                f"{where}: the context range's start {ctx_lo} is above its end {ctx_hi}"
            )
        if not 0 <= k <= K_MAX_LIMIT:
            raise SpecrlError(f"{where}: K must be in 0..{K_MAX_LIMIT}")
        rows.append((bs_lo, bs_hi, ctx_lo, ctx_hi, k, i))
    if len(lengths) > 1:
        raise SpecrlError(
            f"{source}: {VLLM_KEY} mixes 3-item and 5-item entries; use one form throughout"
        )
    n_batch_ranges = _check_batch_ranges(rows, source)
    context_ranges = _check_context_ranges(rows, n_batch_ranges, source)
    last_lo = context_ranges[-1][0]
    context_ranges[-1] = (last_lo, CONTEXT_INFINITY)
    normalized = [
        (b_lo, b_hi, c_lo, CONTEXT_INFINITY if c_lo == last_lo else c_hi, k)
        for b_lo, b_hi, c_lo, c_hi, k, _ in rows
    ]
    return normalized, context_ranges


def _check_batch_ranges(rows: list, source: str) -> int:
    """No cell given twice, batch ranges from 1 without overlaps; returns how many there are.
    ``rows``: ``(bs_lo, bs_hi, ctx_lo, ctx_hi, K, index in the list)``."""
    seen: dict[tuple[int, int, int], int] = {}
    for bs_lo, bs_hi, ctx_lo, _, _, i in rows:
        if (bs_lo, bs_hi, ctx_lo) in seen:
            raise SpecrlError(
                f"{source}: {VLLM_KEY}[{i}] repeats the cell (batch {bs_lo}-{bs_hi}, context "
                f"from {ctx_lo}) of {VLLM_KEY}[{seen[bs_lo, bs_hi, ctx_lo]}]"
            )
        seen[bs_lo, bs_hi, ctx_lo] = i

    first_index: dict[tuple[int, int], int] = {}
    for bs_lo, bs_hi, *_, i in rows:
        first_index.setdefault((bs_lo, bs_hi), i)
    batch_ranges = sorted(first_index)
    if batch_ranges[0][0] != 1:
        raise SpecrlError(
            f"{source}: {VLLM_KEY}[{first_index[batch_ranges[0]]}]: the first batch range "
            f"starts at {batch_ranges[0][0]}; it must start at 1 so every batch size has a K"
        )
    for before, after in zip(batch_ranges, batch_ranges[1:]):
        if after[0] <= before[1]:
            raise SpecrlError(
                f"{source}: {VLLM_KEY}[{first_index[after]}] (batch {after[0]}-{after[1]}) "
                f"overlaps {VLLM_KEY}[{first_index[before]}] (batch {before[0]}-{before[1]}); "
                "batch ranges must not overlap"
            )
    return len(batch_ranges)


def _check_context_ranges(rows: list, n_batch_ranges: int, source: str) -> list:
    """A rectangular grid whose context ranges start at 1 and are contiguous; returns them,
    sorted. ``rows`` as for :func:`_check_batch_ranges`."""
    context_ranges = sorted({(c_lo, c_hi) for _, _, c_lo, c_hi, _, _ in rows})
    if len(rows) != n_batch_ranges * len(context_ranges):
        raise SpecrlError(
            f"{source}: {VLLM_KEY} has {len(rows)} entries but {n_batch_ranges} batch "
            f"ranges x {len(context_ranges)} context ranges need {n_batch_ranges} x "
            f"{len(context_ranges)}: a 5-item table must be a rectangular grid, every batch "
            "range with the same context ranges"
        )
    if context_ranges[0][0] != 1:
        raise SpecrlError(
            f"{source}: the first context range starts at {context_ranges[0][0]}; it must "
            "start at 1 so every context length has a K"
        )
    for before, after in zip(context_ranges, context_ranges[1:]):
        if after[0] != before[1] + 1:
            raise SpecrlError(
                f"{source}: context range {before[0]}-{before[1]} is followed by "
                f"{after[0]}-{after[1]}; context ranges must be contiguous (the next starts "
                "one after the previous ends)"
            )
    return context_ranges
