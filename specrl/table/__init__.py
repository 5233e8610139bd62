"""The K table: specrl's own format, built from a policy, and the serving stacks' files.

* :mod:`specrl.table.format`: the native table (:class:`KTable`), its file and validation;
  what :class:`specrl.controller.LookupController` serves. Its public names are re-exported
  here.
* :mod:`specrl.table.build`: a table from any ``decide(batch, acceptance, context) -> K``.
* :mod:`specrl.table.vllm`, :mod:`specrl.table.trtllm`, :mod:`specrl.table.sglang`: for each
  stack its writer (a table at one acceptance) and its reader (the stack's file as K per
  batch size, validated and expanded as the stack does).
* :mod:`specrl.table.common`: the key names and helpers the stack modules share.
* :mod:`specrl.table.stacks`: :func:`~specrl.table.stacks.export_file` (what ``specrl
  export`` writes in each format) and the file-kind detection ``BatchSchedule.from_file``
  uses.

Pure Python: a serving stack vendors these modules, so none imports numpy, torch,
gymnasium or stable-baselines3, nor any other specrl package than ``errors``, ``files``
and ``features``.
"""

from specrl.table.format import (
    CONTEXT_LIMIT,
    K_MAX_LIMIT,
    MAX_BATCH_LIMIT,
    PROBE_SCOPES,
    PROVENANCE_KEYS,
    TABLE_FORMAT,
    TABLE_VERSION,
    KTable,
    check_acceptance,
    check_acceptance_edges,
    check_context_bins,
    is_acceptance,
    is_int,
    load_table,
    provenance,
    table_from_json,
)

__all__ = [
    "CONTEXT_LIMIT",
    "K_MAX_LIMIT",
    "MAX_BATCH_LIMIT",
    "PROBE_SCOPES",
    "PROVENANCE_KEYS",
    "TABLE_FORMAT",
    "TABLE_VERSION",
    "KTable",
    "check_acceptance",
    "check_acceptance_edges",
    "check_context_bins",
    "is_acceptance",
    "is_int",
    "load_table",
    "provenance",
    "table_from_json",
]
