"""What the serving-stack modules (:mod:`~specrl.table.vllm`, :mod:`~specrl.table.trtllm`,
:mod:`~specrl.table.sglang` and :mod:`~specrl.table.stacks`) share: the key each stack's file
is told apart by, the hint that names them all, and two helpers.

The keys live here, not in each stack's module, because every reader's error names all
three (a file of the wrong stack is the usual mistake) and the stack modules must not
import one another.
"""

from __future__ import annotations

from collections.abc import Callable

from specrl.table.format import KTable, is_int

VLLM_KEY = "num_speculative_tokens_per_batch_size"
"""vLLM Dynamic SD's list of ``[bs_lo, bs_hi, K]`` (or 5-item) entries."""
TRTLLM_KEY = "draft_len_schedule"
"""TensorRT-LLM's ``{batch upper bound: K}`` object."""
SGLANG_KEY = "candidate_steps"
"""The one key of each object in SGLang's adaptive speculative config that specrl writes and
reads: ``{"1": {"candidate_steps": [K]}, ...}``."""
FIX_STACK_FILE = (
    f"give a vLLM speculative config (a {VLLM_KEY!r} list, optionally with "
    f"'num_speculative_tokens'), a TensorRT-LLM one ('max_draft_len' and {TRTLLM_KEY!r}) "
    f'or an SGLang adaptive config ({{"1": {{"{SGLANG_KEY}": [K]}}, ...}})'
)
"""What a stack's K schedule file must hold: the end of every reader's "wrong file" error."""


def merge_buckets(
    table: KTable, value_of: Callable[[int], object]
) -> list[tuple[int, int, object]]:
    """The table's buckets as ``(lo, hi, value_of(bucket))``, equal neighbours merged."""
    ranges: list[tuple[int, int, object]] = []
    for b, (lo, hi) in enumerate(table.batch_buckets):
        value = value_of(b)
        if ranges and ranges[-1][2] == value:
            ranges[-1] = (ranges[-1][0], hi, value)
        else:
            ranges.append((lo, hi, value))
    return ranges


def int_key(key) -> int | None:
    """A JSON object's key as the integer it spells (``4``, ``"4"``, ``" +4"``), else None."""
    if is_int(key):
        return key
    if isinstance(key, str):
        text = key.strip()
        text = text[1:] if text.startswith("+") else text
        # isdecimal, not isdigit: int() refuses digits such as "²" that isdigit accepts.
        if text.isdecimal():
            try:
                return int(text)
            except ValueError:  # beyond int()'s digit limit
                return None
    return None
