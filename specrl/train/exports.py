"""A finished run's tables, written to a folder: the native table, checked against its
policy, and each serving stack's file. ``specrl demo`` and a sweep's trials write them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specrl.errors import SpecrlError
from specrl.files import write_json
from specrl.table import KTable, load_table
from specrl.table.stacks import export_file
from specrl.train.search import (
    NATIVE_EPISODES,
    STACK_FORMATS,
    SearchResult,
    search_run,
    searched_export,
)
from specrl.train.table_search import TableSearchResult, native_file, search_native
from specrl.train.to_table import Fidelity, checked_table
from specrl.train.trained import TrainedRun

NATIVE_FILE = "table.json"


def stack_file(fmt: str) -> str:
    return f"table-{fmt}.json"


@dataclass
class StackExport:
    """One stack's file: written (``path``, its contents ``config``, and the search that
    chose it) or not (``error``, why)."""

    fmt: str
    path: Path | None = None
    config: dict | None = None
    searched: SearchResult | None = None
    error: SpecrlError | None = None


@dataclass
class Exports:
    table: KTable
    """The native table as a server reads it back, validated."""
    fidelity: Fidelity
    native: Path
    stacks: list[StackExport]
    """In :data:`~specrl.train.search.STACK_FORMATS` order."""
    native_search: TableSearchResult | None = None
    """How the native table was searched from the learned one (None: written as learned)."""


def write_exports(
    run: TrainedRun,
    where: Path,
    *,
    search: bool,
    progress: bool,
    search_episodes: int | None = None,
    native_episodes: int | None = None,
) -> Exports:
    """The run's native table (checked against its policy; with ``search``, the best table
    searched from it) and each stack's file in ``where``: its best schedule (``search``), else
    the table collapsed at its operating acceptance. A format that cannot hold the table is
    recorded, not raised. ``search_episodes``: the searches' tuning episodes per workload
    (None: :data:`~specrl.train.search.NATIVE_EPISODES` for the native table,
    :func:`~specrl.train.search.stack_search_episodes` for the stacks);
    ``native_episodes``, where given, the native table's alone."""
    if native_episodes is None:
        native_episodes = NATIVE_EPISODES if search_episodes is None else search_episodes
    learned, fidelity = checked_table(run, progress=progress)
    native = where / NATIVE_FILE
    native_search = None
    if search:
        native_search = search_native(run, learned, progress=progress, episodes=native_episodes)
        native_file(learned, native_search).save(native)
    else:
        learned.save(native)
    table = load_table(native)  # what a server would read, validated
    acceptance = table.provenance["operating_acceptance"]
    failed: dict[str, SpecrlError] = {}
    searched = {}
    if search:
        formats = list(STACK_FORMATS)
        searched = search_run(
            run,
            learned,
            formats,
            acceptance=acceptance,
            progress=progress,
            errors=failed,
            episodes=search_episodes,
        )
    stacks = []
    for fmt in STACK_FORMATS:
        try:
            if fmt in failed:
                raise failed[fmt]
            obj = (
                searched_export(table, searched[fmt], acceptance)
                if search
                else export_file(table, fmt=fmt, acceptance=acceptance)
            )
        except SpecrlError as err:
            stacks.append(StackExport(fmt, error=err))
            continue
        write_json(where / stack_file(fmt), obj)
        stacks.append(StackExport(fmt, where / stack_file(fmt), obj, searched.get(fmt)))
    return Exports(table, fidelity, native, stacks, native_search)
