"""An exported K table as a policy with SB3's ``predict``: ``lookup:TABLE.json`` in
``specrl compare``, live or in the surrogate.

It is :class:`specrl.controller.LookupController`, the code a serving stack runs, driven from
the env's observation. The controller reads only its acceptance tracker's ``estimate`` and
``since_measured``; both are in the observation (``acceptance`` and ``staleness`` =
``since_measured / STALE_STEPS``, clipped at 1), so the tracker is set from it on every call.
Past :data:`~specrl.features.STALE_STEPS` the observation saturates, and the policy counts
the steps itself, so a probe rule with ``after_steps`` above ``STALE_STEPS`` is followed too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrl.controller import LookupController, check_provenance
from specrl.envs.base import ACCEPTANCE, CONTEXT, STALENESS
from specrl.errors import SpecrlError
from specrl.policies.base import KPolicy, rows_in_batch, since_measured
from specrl.table import KTable, load_table


class LookupPolicy(KPolicy):
    """K from an exported table, exactly as :class:`~specrl.controller.LookupController`
    serves it.

    :param table: a :class:`~specrl.table.KTable` or the path of one.
    :param max_batch: the env's ``max_batch`` (the observation scales the batch by it).
    :param max_len: the env's ``max_len`` (the observation scales the context by it), for a
        table with context bins; the context is the longest row of the step just taken.
    :param k_max: the env's ``k_max``; a table drafting more is refused.
    :param profile: the env's profile, if any: a table made for other hardware or another
        pair is refused unless ``force``.
    :param acceptance_estimate: the env's observation acceptance (its
        ``acceptance_estimate``); a table trained on another is refused.
    """

    def __init__(
        self,
        table: KTable | str | Path,
        *,
        max_batch: int,
        k_max: int,
        max_len: int = 1,
        profile=None,
        force: bool = False,
        acceptance_estimate: str = "steps",
    ):
        source = "K table"
        if not isinstance(table, KTable):
            source = str(table)
            table = load_table(table)
        if table.k_max > k_max:
            raise SpecrlError(
                f"{source} drafts up to K={table.k_max} but the env's k_max is {k_max}; "
                f"export the table for k_max {k_max} or raise the env's k_max"
            )
        self.table = table
        self.max_batch, self.max_len = max_batch, max_len
        self._by_context = table.context_bins is not None
        self.source = source
        if profile is not None:
            check_provenance(table, profile, force=force, source=source)
        self.acceptance_estimate = acceptance_estimate
        self._controllers = [self._controller()]  # refuses a table trained on another figure
        self.name = f"lookup:{Path(source).name}" if source != "K table" else "lookup"

    def _controller(self) -> LookupController:
        return LookupController(
            self.table, source=self.source, acceptance_estimate=self.acceptance_estimate
        )

    def _act(self, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
        while len(self._controllers) < len(rows):
            self._controllers.append(self._controller())
        batches = rows_in_batch(rows, self.max_batch)
        out = np.empty(len(rows), dtype=np.int64)
        for i, row in enumerate(rows):
            controller = self._controllers[i]
            tracker = controller.tracker
            tracker.since_measured = since_measured(
                tracker.since_measured, float(row[STALENESS]), bool(starts[i])
            )
            tracker.estimate = float(row[ACCEPTANCE])
            context = int(round(float(row[CONTEXT]) * self.max_len)) if self._by_context else None
            out[i] = controller.choose_k(int(batches[i]), context_len=context)
        return out
