"""K by batch size from a serving stack's own table: vLLM Dynamic SD, TensorRT-LLM and
SGLang's adaptive speculative config with one candidate per key.

Each table is read, validated and expanded exactly as the stack does (by the stack's reader
in :mod:`specrl.table`), so a table scored here behaves the same when served, and one the
stack would refuse is refused here. SGLang decides per step from the batch padded up to a
CUDA-graph size, so its table is expanded for the capture sizes the deployment uses
(``cuda_graph_bs``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from specrl.envs.base import CONTEXT
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.policies.base import KPolicy, check_int, rows_in_batch
from specrl.table.sglang import SGLANG_CUDA_GRAPH_BS, check_cuda_graph_bs, read_sglang
from specrl.table.stacks import read_stack_file
from specrl.table.trtllm import read_trtllm
from specrl.table.vllm import CONTEXT_INFINITY, read_vllm


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

        Validated and expanded as vLLM does (:func:`specrl.table.vllm.read_vllm`): entries
        all ``[bs_lo, bs_hi, K]`` or all ``[bs_lo, bs_hi, ctx_lo, ctx_hi, K]``, the context
        ranges of a 5-item table extending to :data:`CONTEXT_INFINITY`; every K is clamped
        to ``num_speculative_tokens`` (when given), then to ``k_max``, with a warning.

        :param source: where ``config`` came from, for error messages.
        Other parameters as for the class.
        """
        max_batch = check_int(max_batch, "BatchSchedule: max_batch", low=1)
        table, context_ends = read_vllm(config, max_batch=max_batch, k_max=k_max, source=source)
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
        drafts 4 at batch 1-4, 2 at 5-8, 1 at 9-32 and nothing above 32; validated as
        TensorRT-LLM does (:func:`specrl.table.trtllm.read_trtllm`). K above ``k_max`` is
        clamped to it.

        :param source: where ``config`` came from, for error messages.
        Other parameters as for the class.
        """
        max_batch = check_int(max_batch, "BatchSchedule: max_batch", low=1)
        table = read_trtllm(config, max_batch=max_batch, source=source)
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

        Keys are batch-size *lower* bounds read at the batch size padded up to a CUDA-graph
        capture size, validated and expanded as SGLang does
        (:func:`specrl.table.sglang.read_sglang`). K above ``k_max`` is clamped to it, with
        a warning naming the keys.

        :param cuda_graph_bs: the deployment's CUDA-graph capture sizes
            (``--cuda-graph-bs``); default :data:`specrl.table.sglang.SGLANG_CUDA_GRAPH_BS`,
            the sizes SGLang captured by default with speculative decoding in the versions
            we read. Empty: no padding.
        :param source: where ``config`` came from, for error messages.
        Other parameters as for the class.
        """
        max_batch = check_int(max_batch, "BatchSchedule: max_batch", low=1)
        table, read = read_sglang(
            config, max_batch=max_batch, cuda_graph_bs=cuda_graph_bs, source=source
        )
        if k_max is not None:
            k_max = check_int(k_max, "BatchSchedule: k_max", low=0)
            # keys no batch size up to max_batch reads stay silent
            where = ", ".join(f"key {key!r}: K={k}" for key, k in read if k > k_max)
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
        keys (:func:`specrl.table.stacks.stack_kind`), possibly under
        ``speculative_config``, as ``specrl export`` writes them.
        Named ``schedule:<file name without .json>``.

        :param cuda_graph_bs: SGLang's capture sizes (see :meth:`from_sglang`); None: the
            ``cuda_graph_bs`` the file's ``specrl`` note records (the sizes it was exported
            for), else :data:`specrl.table.sglang.SGLANG_CUDA_GRAPH_BS`.
        Other parameters as for the class and :meth:`from_vllm`.
        """
        path = Path(path)
        kind, config, note = read_stack_file(path)
        shared = {"max_batch": max_batch, "k_max": k_max, "source": str(path)}
        name = f"schedule:{path.stem}"
        if kind == "vllm":
            return cls.from_vllm(config, max_len=max_len, name=name, **shared)
        if kind == "trtllm":
            return cls.from_trtllm(config, name=name, **shared)
        sizes, where = cuda_graph_bs, f"{path}: cuda_graph_bs"
        if sizes is None and note is not None and "cuda_graph_bs" in note:
            sizes, where = note["cuda_graph_bs"], f"{path}: specrl.cuda_graph_bs"
        sizes = SGLANG_CUDA_GRAPH_BS if sizes is None else check_cuda_graph_bs(sizes, where)
        return cls.from_sglang(config, cuda_graph_bs=sizes, name=name, **shared)
