"""TensorRT-LLM's K schedule (``draft_len_schedule``, upper-bound keys since PR #10860): the
writer :func:`to_trtllm` and the reader :func:`read_trtllm`.

The config is ``{"max_draft_len": M, "draft_len_schedule": {batch upper bound: K}}``:
``{4: 4, 8: 2, 32: 1}`` drafts 4 at batch 1-4, 2 at 5-8, 1 at 9-32 and nothing above 32.
TensorRT-LLM requires the smallest key's value to be ``max_draft_len`` and no value above it;
the reader refuses what TensorRT-LLM refuses.
"""

from __future__ import annotations

import warnings
from bisect import bisect_left
from collections.abc import Mapping

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.table.common import FIX_STACK_FILE, TRTLLM_KEY, int_key, merge_buckets
from specrl.table.format import K_MAX_LIMIT, KTable, check_acceptance, is_int


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
    ranges = merge_buckets(table, lambda b: table.cell(b, context)[column])
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


def read_trtllm(config, *, max_batch: int, source: str) -> list[int]:
    """K per batch size ``0..max_batch`` (0 at 0) from TensorRT-LLM's ``config``:
    ``{"max_draft_len": K, "draft_len_schedule": {batch: K}}`` (other keys ignored) or the
    schedule alone.

    Keys (JSON strings allowed) are integers >= 1, values integers >= 0; the smallest key's
    value equals ``max_draft_len`` (when it is not given, it is that value, and must be
    >= 1) and no value exceeds it. Above the largest key TensorRT-LLM drafts nothing.

    :param source: where ``config`` came from, for error messages.
    """
    schedule, max_draft_len = _trtllm_parts(config, source)
    keys = sorted(schedule)
    first = schedule[keys[0]]
    if max_draft_len is None:
        max_draft_len = first
        if first < 1:
            raise SpecrlError(
                f"{source}: {TRTLLM_KEY}[{keys[0]}] = {first}: the smallest key's value is "
                "the maximum draft length and must be >= 1 (or give max_draft_len)"
            )
    elif first != max_draft_len:
        raise SpecrlError(
            f"{source}: {TRTLLM_KEY}[{keys[0]}] = {first}: the smallest key's value must "
            f"equal max_draft_len ({max_draft_len}); TensorRT-LLM requires it"
        )
    for key in keys:
        if schedule[key] > max_draft_len:
            raise SpecrlError(
                f"{source}: {TRTLLM_KEY}[{key}] = {schedule[key]} is above max_draft_len "
                f"({max_draft_len}); no value may exceed it"
            )
    ks = [schedule[key] for key in keys] + [0]
    return [0] + [ks[bisect_left(keys, batch)] for batch in range(1, max_batch + 1)]


def _trtllm_parts(config, source: str) -> tuple[dict[int, int], int | None]:
    """The schedule with integer keys, and ``max_draft_len`` (None when not given)."""
    if not isinstance(config, Mapping):
        raise SpecrlError(f"{source}: expected an object, got {config!r}; {FIX_STACK_FILE}")
    max_draft_len = None
    if TRTLLM_KEY in config:
        max_draft_len = config.get("max_draft_len")
        if max_draft_len is not None and (
            not is_int(max_draft_len) or not 1 <= max_draft_len <= K_MAX_LIMIT
        ):
            raise SpecrlError(
                f"{source}: max_draft_len must be an integer 1..{K_MAX_LIMIT}, got "
                f"{max_draft_len!r}"
            )
        config = config[TRTLLM_KEY]
        if not isinstance(config, Mapping):
            raise SpecrlError(
                f"{source}: {TRTLLM_KEY} must be an object {{batch: K}}, got {config!r}"
            )
    if not config:
        raise SpecrlError(f"{source}: {TRTLLM_KEY} is empty; give at least one {{batch: K}}")
    schedule: dict[int, int] = {}
    for key, value in config.items():
        where = f"{source}: {TRTLLM_KEY}[{key!r}]"
        batch = int_key(key)
        if batch is None or batch < 1:
            raise SpecrlError(f"{where}: keys are batch sizes, integers >= 1")
        if batch in schedule:
            raise SpecrlError(f"{where}: batch size {batch} is given twice")
        if not is_int(value) or not 0 <= value <= K_MAX_LIMIT:
            raise SpecrlError(
                f"{where} = {value!r}: values are draft lengths, integers 0..{K_MAX_LIMIT}"
            )
        schedule[batch] = value
    return schedule, max_draft_len
