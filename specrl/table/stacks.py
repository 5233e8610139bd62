"""The serving stacks together: the file ``specrl export`` writes for each format
(:func:`export_file`), and which stack a schedule file is for (:func:`read_stack_file`).

No stack indexes acceptance, so every export collapses the table at one operating point,
an acceptance the caller states (for example the profile's mean acceptance on the training
mix). The stacks' config objects are returned exactly as the stacks read them: vLLM's and
TensorRT-LLM's config classes are strict about their keys, and every key of SGLang's file is
a batch size, so the operating point is not written into them. :func:`export_file` puts it
beside them instead::

    {"speculative_config": {...what the stack reads...},
     "specrl": {"exported_from": "specrl-k-table", "acceptance": 0.62, ...}}

:func:`read_stack_file` (``BatchSchedule.from_file``) reads that file as it is; a stack gets
``speculative_config`` (vLLM and TensorRT-LLM merged with their ``method`` and draft model;
SGLang reads it, as it is, as the file ``--speculative-adaptive-config`` names).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from specrl.errors import SpecrlError
from specrl.files import read_json
from specrl.table.common import FIX_STACK_FILE, SGLANG_KEY, TRTLLM_KEY, VLLM_KEY
from specrl.table.format import TABLE_FORMAT, KTable
from specrl.table.sglang import (
    SGLANG_CUDA_GRAPH_BS,
    SGLANG_VERSION_NOTE,
    check_cuda_graph_bs,
    to_sglang,
)
from specrl.table.trtllm import to_trtllm
from specrl.table.vllm import to_vllm

FORMATS = ("native", "vllm", "trtllm", "sglang")
"""``specrl export --format``: specrl's own table, or one serving stack's config."""


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


def stack_kind(config) -> str | None:
    """The stack ``config`` is for, told apart by its keys: ``"vllm"`` for a list or an
    object with ``num_speculative_tokens_per_batch_size``, ``"trtllm"`` for an object with
    ``draft_len_schedule``, ``"sglang"`` for an object any of whose values is an object
    holding ``candidate_steps`` (so a malformed SGLang file is refused naming its key rather
    than as no table at all); None for none of them."""
    if isinstance(config, list) or (isinstance(config, Mapping) and VLLM_KEY in config):
        return "vllm"
    if isinstance(config, Mapping) and TRTLLM_KEY in config:
        return "trtllm"
    if isinstance(config, Mapping) and any(
        isinstance(value, Mapping) and SGLANG_KEY in value for value in config.values()
    ):
        return "sglang"
    return None


def read_stack_file(path: str | Path) -> tuple[str, object, Mapping | None]:
    """A JSON file holding a vLLM, a TensorRT-LLM or an SGLang config, possibly under
    ``speculative_config`` as :func:`export_file` writes them: ``(stack, config, note)``,
    with ``stack`` as :func:`stack_kind` tells it and ``note`` the file's ``specrl`` object
    (None without one). The config is not validated here; the stack's reader does that."""
    obj = read_json(path, "K schedule", FIX_STACK_FILE)
    note = obj.get("specrl") if isinstance(obj, Mapping) else None
    if isinstance(obj, Mapping) and isinstance(obj.get("speculative_config"), Mapping):
        obj = obj["speculative_config"]
    kind = stack_kind(obj)
    if kind is None:
        raise SpecrlError(
            f"K schedule file {path}: no {VLLM_KEY!r} or {TRTLLM_KEY!r}, nor SGLang "
            f"{SGLANG_KEY!r} objects; {FIX_STACK_FILE}"
        )
    return kind, obj, note if isinstance(note, Mapping) else None
