"""K by batch size from a serving stack's own table: vLLM Dynamic SD, TensorRT-LLM and
SGLang's adaptive speculative config with one candidate per key.

Each table is read, validated and expanded exactly as the stack does, so a table scored here
behaves the same when served, and one the stack would refuse is refused here. SGLang decides
per step from the batch padded up to a CUDA-graph size, so its table is expanded for the
capture sizes the deployment uses (``cuda_graph_bs``).
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.export import SGLANG_CUDA_GRAPH_BS, SGLANG_KEY, check_cuda_graph_bs, sglang_padded
from specrl.files import read_json
from specrl.policies.base import CONTEXT, KPolicy, check_int, rows_in_batch
from specrl.table import K_MAX_LIMIT

CONTEXT_INFINITY = 2**31 - 1
"""The end of the last context range of a 5-item vLLM table. vLLM sets it to this value
(``_CTX_INFINITY`` in ``vllm/v1/spec_decode/dynamic/utils.py``) whatever the table says, so
any end >= its start is accepted; write ``2147483647`` to say what is meant."""

VLLM_KEY = "num_speculative_tokens_per_batch_size"
TRTLLM_KEY = "draft_len_schedule"
_FIX_FILE = (
    f"give a vLLM speculative config (a {VLLM_KEY!r} list, optionally with "
    f"'num_speculative_tokens'), a TensorRT-LLM one ('max_draft_len' and {TRTLLM_KEY!r}) "
    f'or an SGLang adaptive config ({{"1": {{"{SGLANG_KEY}": [K]}}, ...}})'
)
_SGLANG_FORM = f'{{"BATCH": {{"{SGLANG_KEY}": [K]}}, ...}}'


class BatchSchedule(KPolicy):
    """K looked up by the batch size (and, for 5-item vLLM tables, the longest context).

    Stands for vLLM V1 Dynamic SD (``num_speculative_tokens_per_batch_size``, PR #32374),
    TensorRT-LLM's ``draft_len_schedule`` (upper-bound keys, PR #10860) and SGLang's adaptive
    speculative config with one candidate per key (lower-bound keys read at the padded
    batch size, PR #24055). Build one with :meth:`from_vllm`, :meth:`from_trtllm`,
    :meth:`from_sglang` or :meth:`from_file`.

    :param table: K per batch size ``0..max_batch`` and context bucket, ``[max_batch + 1,
        n_buckets]`` (row 0 unused: a step decodes at least one row).
    :param context_ends: inclusive upper end of each context bucket in tokens, ascending;
        the last is :data:`CONTEXT_INFINITY`. ``(CONTEXT_INFINITY,)`` for batch-only tables.
    :param max_batch: the environment's ``max_batch`` (the observation's batch scale).
    :param max_len: the environment's ``max_len`` (the observation's context scale); needed
        only with more than one context bucket.
    :param k_max: the environment's largest K; every K above it is clamped to it (the
        engine cannot draft more than it was started with). None: no clamp.
    :param name: the name in result tables.
    """

    def __init__(
        self,
        table,
        context_ends: Sequence[int] = (CONTEXT_INFINITY,),
        *,
        max_batch: int,
        max_len: int | None = None,
        k_max: int | None = None,
        name: str = "schedule",
    ):
        max_batch = check_int(max_batch, "BatchSchedule: max_batch", low=1)
        table = np.asarray(table, dtype=np.int64)
        if table.ndim == 1:
            table = table[:, None]
        if table.shape != (max_batch + 1, len(context_ends)) or (table < 0).any():
            raise SpecrlError(
                f"BatchSchedule: table must hold K >= 0 with shape (max_batch + 1, "
                f"len(context_ends)) = ({max_batch + 1}, {len(context_ends)}), got "
                f"{table.shape}"
            )
        if len(context_ends) > 1 and max_len is None:
            raise SpecrlError(
                "BatchSchedule: a table with context ranges needs max_len (the "
                "environment's) to read the context from the observation"
            )
        if k_max is not None:
            table = np.minimum(table, check_int(k_max, "BatchSchedule: k_max", low=0))
        self.table = table  # [max_batch + 1, n_context_buckets]
        self.context_ends = np.asarray(context_ends, dtype=np.int64)
        self.max_batch, self.max_len, self.k_max, self.name = max_batch, max_len, k_max, name

    def k_for(self, batch: int, context: int = 1) -> int:
        """K at ``batch`` rows whose longest row holds ``context`` tokens."""
        bucket = min(np.searchsorted(self.context_ends, context), len(self.context_ends) - 1)
        return int(self.table[min(max(batch, 0), self.max_batch), bucket])

    def _act(self, rows, starts):
        batch = rows_in_batch(rows, self.max_batch)
        if len(self.context_ends) == 1:
            return self.table[batch, 0]
        context = np.rint(rows[:, CONTEXT] * self.max_len).astype(np.int64)
        bucket = np.minimum(np.searchsorted(self.context_ends, context), len(self.context_ends) - 1)
        return self.table[batch, bucket]

    # ------------------------------------------------------------------ vLLM

    @classmethod
    def from_vllm(
        cls,
        config,
        *,
        max_batch: int,
        max_len: int | None = None,
        k_max: int | None = None,
        source: str = "vLLM speculative config",
        name: str = "schedule:vllm",
    ) -> BatchSchedule:
        """vLLM Dynamic SD: ``config`` is the ``num_speculative_tokens_per_batch_size`` list
        or a speculative config dict holding it (and usually ``num_speculative_tokens``;
        other keys are ignored).

        Entries are all ``[bs_lo, bs_hi, K]`` or all ``[bs_lo, bs_hi, ctx_lo, ctx_hi, K]``.
        Validated as vLLM does: integer bounds > 0 with lo <= hi, K >= 0, batch ranges
        non-overlapping with the first starting at 1 (vLLM sorts them first, so their order
        in the list is free), and a 5-item table a full rectangular grid whose context ranges
        start at 1 and are contiguous, the last extending to :data:`CONTEXT_INFINITY`.
        Expanded as vLLM does: a batch size in a gap takes the K of the range before it,
        one above the last range the last K, and every K is clamped to
        ``num_speculative_tokens`` (when given), then to ``k_max``.

        :param source: where ``config`` came from, for error messages.
        Other parameters as for the class.
        """
        max_batch = check_int(max_batch, "BatchSchedule: max_batch", low=1)
        entries, cap = _vllm_parts(config, source)
        rows, context_ranges = _check_vllm_entries(entries, source)
        context_ends = [hi for _, hi in context_ranges]
        table = np.zeros((max_batch + 1, len(context_ranges)), dtype=np.int64)
        batches = np.arange(1, max_batch + 1)
        for c, (ctx_lo, _) in enumerate(context_ranges):
            column = sorted((lo, k) for lo, _, c_lo, _, k in rows if c_lo == ctx_lo)
            starts = np.array([lo for lo, _ in column])
            ks = np.array([k for _, k in column])
            table[1:, c] = ks[np.searchsorted(starts, batches, side="right") - 1]
        if cap is not None:
            table = np.minimum(table, cap)
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
                ", as vLLM does"
                if what == "num_speculative_tokens"
                else ": the engine drafts no more"
            )
            if where:
                warnings.warn(
                    f"{source}: K above {limit} ({what}) at {where}; clamped to {limit}{how}",
                    category=SpecrlWarning,
                    stacklevel=2,
                )
        return cls(
            table, context_ends, max_batch=max_batch, max_len=max_len, k_max=k_max, name=name
        )

    # ------------------------------------------------------------------ TensorRT-LLM

    @classmethod
    def from_trtllm(
        cls,
        config: Mapping,
        *,
        max_batch: int,
        k_max: int | None = None,
        source: str = "TensorRT-LLM speculative config",
        name: str = "schedule:trtllm",
    ) -> BatchSchedule:
        """TensorRT-LLM ``draft_len_schedule``: ``config`` is ``{"max_draft_len": K,
        "draft_len_schedule": {batch: K}}`` (other keys ignored) or the schedule alone.

        Keys are *upper* bounds (current semantics, PR #10860): ``{4: 4, 8: 2, 32: 1}``
        drafts 4 at batch 1-4, 2 at 5-8, 1 at 9-32 and nothing above 32. Keys (JSON strings
        allowed) are integers >= 1, values integers >= 0; the smallest key's value equals
        ``max_draft_len`` (when it is not given, it is that value, and must be >= 1) and no
        value exceeds it. K above ``k_max`` is clamped to it.

        :param source: where ``config`` came from, for error messages.
        Other parameters as for the class.
        """
        max_batch = check_int(max_batch, "BatchSchedule: max_batch", low=1)
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
        ks = np.array([schedule[key] for key in keys] + [0])
        table = ks[np.searchsorted(keys, np.arange(max_batch + 1), side="left")]
        table[0] = 0
        return cls(table, max_batch=max_batch, k_max=k_max, name=name)

    # ------------------------------------------------------------------ SGLang

    @classmethod
    def from_sglang(
        cls,
        config: Mapping,
        *,
        max_batch: int,
        k_max: int | None = None,
        cuda_graph_bs: Sequence[int] = SGLANG_CUDA_GRAPH_BS,
        source: str = "SGLang adaptive speculative config",
        name: str = "schedule:sglang",
    ) -> BatchSchedule:
        """SGLang's adaptive speculative config (``--speculative-adaptive-config``) holding
        one candidate per key: ``{"1": {"candidate_steps": [4]}, "9": {"candidate_steps":
        [2]}}``.

        Keys are batch-size *lower* bounds, integers >= 1 (JSON strings), one of them 1 and
        none given twice (``"1"`` and ``"01"`` are the same); each value is an object whose
        only key is ``candidate_steps``, a list of exactly one integer K >= 0 (at most
        specrl's ``K_MAX_LIMIT``, 256; repeats of it count as one). Any other key is
        refused, SGLang's tuning keys such as ``ema_alpha`` included: they act only between
        several candidates. Several candidates are refused too: SGLang then adapts K to the
        acceptance it sees, which no static batch -> K table says. One candidate
        and K=0 need SGLang's newest ``adaptive_spec_params.py`` (after PR #24055); older
        versions want at least two.

        Expanded as SGLang decides at each step: the batch size is padded up to the
        smallest of ``cuda_graph_bs`` >= it (a batch above the largest is not padded), and
        the entry of the largest key <= the padded size applies. K above ``k_max`` is
        clamped to it, with a warning naming the keys.

        :param cuda_graph_bs: the deployment's CUDA-graph capture sizes
            (``--cuda-graph-bs``); default :data:`specrl.export.SGLANG_CUDA_GRAPH_BS`, the
            sizes SGLang captured by default with speculative decoding in the versions we
            read. Empty: no padding.
        :param source: where ``config`` came from, for error messages.
        Other parameters as for the class.
        """
        max_batch = check_int(max_batch, "BatchSchedule: max_batch", low=1)
        sizes = check_cuda_graph_bs(cuda_graph_bs, f"{source}: cuda_graph_bs")
        entries = _sglang_parts(config, source)  # (lower bound, K, key as given), ascending
        starts = [lo for lo, _, _ in entries]
        picked = [
            bisect.bisect_right(starts, sglang_padded(batch, sizes)) - 1
            for batch in range(1, max_batch + 1)
        ]
        table = [0] + [entries[i][1] for i in picked]
        if k_max is not None:
            k_max = check_int(k_max, "BatchSchedule: k_max", low=0)
            where = ", ".join(
                f"key {entries[i][2]!r}: K={entries[i][1]}"
                for i in sorted(set(picked))  # keys no batch size up to max_batch reads: silent
                if entries[i][1] > k_max
            )
            if where:
                warnings.warn(
                    f"{source}: K above {k_max} (k_max) at {where}; clamped to {k_max}: the "
                    "engine drafts no more",
                    category=SpecrlWarning,
                    stacklevel=2,
                )
        return cls(table, max_batch=max_batch, k_max=k_max, name=name)

    # ------------------------------------------------------------------ files

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        *,
        max_batch: int,
        max_len: int | None = None,
        k_max: int | None = None,
        cuda_graph_bs: Sequence[int] | None = None,
    ) -> BatchSchedule:
        """A JSON file holding a vLLM, a TensorRT-LLM or an SGLang table, told apart by its
        keys: a list or an object with ``num_speculative_tokens_per_batch_size`` is vLLM's,
        an object with ``draft_len_schedule`` TensorRT-LLM's, and an object any of whose
        values is an object holding ``candidate_steps`` SGLang's (so a malformed SGLang
        file is refused naming its key rather than as no table at all). Any of them may sit
        under ``speculative_config``, as ``specrl export`` writes them.
        Named ``schedule:<file name without .json>``.

        :param cuda_graph_bs: SGLang's capture sizes (see :meth:`from_sglang`); None: the
            ``cuda_graph_bs`` the file's ``specrl`` note records (the sizes it was exported
            for), else :data:`specrl.export.SGLANG_CUDA_GRAPH_BS`.
        Other parameters as for the class and :meth:`from_vllm`.
        """
        path = Path(path)
        obj = read_json(path, "K schedule", _FIX_FILE)
        note = obj.get("specrl") if isinstance(obj, Mapping) else None
        if isinstance(obj, Mapping) and isinstance(obj.get("speculative_config"), Mapping):
            obj = obj["speculative_config"]
        name = f"schedule:{path.stem}"
        if isinstance(obj, list) or (isinstance(obj, Mapping) and VLLM_KEY in obj):
            return cls.from_vllm(
                obj,
                max_batch=max_batch,
                max_len=max_len,
                k_max=k_max,
                source=str(path),
                name=name,
            )
        if isinstance(obj, Mapping) and TRTLLM_KEY in obj:
            return cls.from_trtllm(
                obj, max_batch=max_batch, k_max=k_max, source=str(path), name=name
            )
        if isinstance(obj, Mapping) and any(
            isinstance(value, Mapping) and SGLANG_KEY in value for value in obj.values()
        ):
            sizes, where = cuda_graph_bs, f"{path}: cuda_graph_bs"
            if sizes is None and isinstance(note, Mapping) and "cuda_graph_bs" in note:
                sizes, where = note["cuda_graph_bs"], f"{path}: specrl.cuda_graph_bs"
            return cls.from_sglang(
                obj,
                max_batch=max_batch,
                k_max=k_max,
                cuda_graph_bs=SGLANG_CUDA_GRAPH_BS
                if sizes is None
                else check_cuda_graph_bs(sizes, where),
                source=str(path),
                name=name,
            )
        raise SpecrlError(
            f"K schedule file {path}: no {VLLM_KEY!r} or {TRTLLM_KEY!r}, nor SGLang "
            f"{SGLANG_KEY!r} objects; {_FIX_FILE}"
        )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _vllm_parts(config, source: str) -> tuple[list, int | None]:
    """The entries and ``num_speculative_tokens`` (None when not given)."""
    cap = None
    if isinstance(config, Mapping):
        if VLLM_KEY not in config:
            raise SpecrlError(f"{source}: no {VLLM_KEY!r}; {_FIX_FILE}")
        cap = config.get("num_speculative_tokens")
        if cap is not None and (not _is_int(cap) or not 1 <= cap <= K_MAX_LIMIT):
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


def _check_vllm_entries(entries: list, source: str):
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
        if not all(_is_int(x) for x in entry):
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

    context_ranges = sorted({(c_lo, c_hi) for _, _, c_lo, c_hi, _, _ in rows})
    if len(rows) != len(batch_ranges) * len(context_ranges):
        raise SpecrlError(
            f"{source}: {VLLM_KEY} has {len(rows)} entries but {len(batch_ranges)} batch "
            f"ranges x {len(context_ranges)} context ranges need {len(batch_ranges)} x "
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
    last_lo = context_ranges[-1][0]
    context_ranges[-1] = (last_lo, CONTEXT_INFINITY)
    normalized = [
        (b_lo, b_hi, c_lo, CONTEXT_INFINITY if c_lo == last_lo else c_hi, k)
        for b_lo, b_hi, c_lo, c_hi, k, _ in rows
    ]
    return normalized, context_ranges


def _trtllm_parts(config, source: str) -> tuple[dict[int, int], int | None]:
    """The schedule with integer keys, and ``max_draft_len`` (None when not given)."""
    if not isinstance(config, Mapping):
        raise SpecrlError(f"{source}: expected an object, got {config!r}; {_FIX_FILE}")
    max_draft_len = None
    if TRTLLM_KEY in config:
        max_draft_len = config.get("max_draft_len")
        if max_draft_len is not None and (
            not _is_int(max_draft_len) or not 1 <= max_draft_len <= K_MAX_LIMIT
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
        batch = _int_key(key)
        if batch is None or batch < 1:
            raise SpecrlError(f"{where}: keys are batch sizes, integers >= 1")
        if batch in schedule:
            raise SpecrlError(f"{where}: batch size {batch} is given twice")
        if not _is_int(value) or not 0 <= value <= K_MAX_LIMIT:
            raise SpecrlError(
                f"{where} = {value!r}: values are draft lengths, integers 0..{K_MAX_LIMIT}"
            )
        schedule[batch] = value
    return schedule, max_draft_len


def _sglang_parts(config, source: str) -> list[tuple[int, int, object]]:
    """``(lower bound, K, key as given)`` per key, ascending; validated (see
    :meth:`BatchSchedule.from_sglang`)."""
    if not isinstance(config, Mapping):
        raise SpecrlError(f"{source}: expected an object {_SGLANG_FORM}, got {config!r}")
    if not config:
        raise SpecrlError(f"{source}: the SGLang config is empty; give {_SGLANG_FORM}")
    entries: dict[int, tuple[int, int, object]] = {}
    for key, value in config.items():
        where = f"{source}: key {key!r}"
        batch = _int_key(key)
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
            or not all(_is_int(k) and 0 <= k <= K_MAX_LIMIT for k in steps)
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


def _int_key(key) -> int | None:
    if _is_int(key):
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
