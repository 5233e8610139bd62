"""SGLang's adaptive speculative config (``--speculative-adaptive-config``, PRs #21599,
#23336, #24055) with one candidate per key: the writer :func:`to_sglang` and the reader
:func:`read_sglang`.

The config is ``{"1": {"candidate_steps": [4]}, "9": {"candidate_steps": [2]}}``: keys are
batch-size *lower* bounds, read at the batch size SGLang runs, the running batch padded up
to a CUDA-graph capture size (:func:`sglang_padded`). So a table is written and read for the
capture sizes the deployment uses (``cuda_graph_bs``).
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Mapping, Sequence

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.table.common import SGLANG_KEY, int_key
from specrl.table.format import K_MAX_LIMIT, KTable, check_acceptance, is_int

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
_SGLANG_FORM = f'{{"BATCH": {{"{SGLANG_KEY}": [K]}}, ...}}'


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


def read_sglang(
    config, *, max_batch: int, cuda_graph_bs: Sequence[int] = SGLANG_CUDA_GRAPH_BS, source: str
) -> tuple[list[int], list[tuple[object, int]]]:
    """K per batch size ``0..max_batch`` (0 at 0) from SGLang's adaptive speculative config
    holding one candidate per key, and the keys some batch size up to ``max_batch`` reads
    (as given, with their K), ascending.

    Keys are batch-size *lower* bounds, integers >= 1 (JSON strings), one of them 1 and
    none given twice (``"1"`` and ``"01"`` are the same); each value is an object whose
    only key is ``candidate_steps``, a list of exactly one integer K >= 0 (at most
    :data:`~specrl.table.format.K_MAX_LIMIT`; repeats of it count as one). Any other key is
    refused, SGLang's tuning keys such as ``ema_alpha`` included: they act only between
    several candidates. Several candidates are refused too: SGLang then adapts K to the
    acceptance it sees, which no static batch -> K table says. One candidate and K=0 need
    SGLang's newest ``adaptive_spec_params.py`` (after PR #24055); older versions want at
    least two.

    Expanded as SGLang decides at each step: the batch size is padded up to the smallest
    of ``cuda_graph_bs`` >= it (a batch above the largest is not padded), and the entry of
    the largest key <= the padded size applies.

    :param cuda_graph_bs: the deployment's CUDA-graph capture sizes (``--cuda-graph-bs``);
        default :data:`SGLANG_CUDA_GRAPH_BS`. Empty: no padding.
    :param source: where ``config`` came from, for error messages.
    """
    sizes = check_cuda_graph_bs(cuda_graph_bs, f"{source}: cuda_graph_bs")
    entries = _sglang_parts(config, source)  # (lower bound, K, key as given), ascending
    starts = [lo for lo, _, _ in entries]
    picked = [
        bisect.bisect_right(starts, sglang_padded(batch, sizes)) - 1
        for batch in range(1, max_batch + 1)
    ]
    read = [(entries[i][2], entries[i][1]) for i in sorted(set(picked))]
    return [0] + [entries[i][1] for i in picked], read


def _sglang_parts(config, source: str) -> list[tuple[int, int, object]]:
    """``(lower bound, K, key as given)`` per key, ascending; validated (see
    :func:`read_sglang`)."""
    if not isinstance(config, Mapping):
        raise SpecrlError(f"{source}: expected an object {_SGLANG_FORM}, got {config!r}")
    if not config:
        raise SpecrlError(f"{source}: the SGLang config is empty; give {_SGLANG_FORM}")
    entries: dict[int, tuple[int, int, object]] = {}
    for key, value in config.items():
        where = f"{source}: key {key!r}"
        batch = int_key(key)
        if batch is None or batch < 1:
            raise SpecrlError(f"{where}: keys are batch-size lower bounds, integers >= 1")
        if batch in entries:
            raise SpecrlError(
                f"{where}: batch size {batch} is given twice (also as key {entries[batch][2]!r})"
            )
        if not isinstance(value, Mapping):
            raise SpecrlError(
                f"{where} = {value!r}: each value is an object {{{SGLANG_KEY!r}: [K]}}"
            )
        unknown = [name for name in value if name != SGLANG_KEY]
        if unknown:
            raise SpecrlError(
                f"{where}: unknown keys {unknown!r}; specrl reads only {SGLANG_KEY!r} (a static "
                "table: SGLang's tuning keys such as 'ema_alpha' act only between several "
                "candidates)"
            )
        if SGLANG_KEY not in value:
            raise SpecrlError(f"{where}: no {SGLANG_KEY!r}; give {{{SGLANG_KEY!r}: [K]}}")
        steps = value[SGLANG_KEY]
        if (
            not isinstance(steps, (list, tuple))
            or not steps
            or not all(is_int(k) and 0 <= k <= K_MAX_LIMIT for k in steps)
        ):
            raise SpecrlError(
                f"{where}: {SGLANG_KEY} = {steps!r}: must be a non-empty list of draft "
                f"lengths, integers 0..{K_MAX_LIMIT}"
            )
        if len(set(steps)) > 1:
            raise SpecrlError(
                f"{where}: {SGLANG_KEY} = {steps!r} holds {len(set(steps))} candidates; "
                "specrl reads static tables only, one K per key (with several, SGLang picks "
                "among them by the acceptance it sees, which no batch -> K table says)"
            )
        entries[batch] = (batch, steps[0], key)
    if 1 not in entries:
        raise SpecrlError(
            f"{source}: no key '1' (the smallest is {min(entries)}); the smallest key must be 1 "
            "so every batch size has a K, as SGLang requires"
        )
    return sorted(entries.values(), key=lambda entry: entry[0])
