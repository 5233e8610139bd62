"""The serving-side controller: K for the next step from an exported table.

Pure Python (standard library and :mod:`specrl.errors`, :mod:`specrl.files`,
:mod:`specrl.features`, :mod:`specrl.table`): a serving stack calls :meth:`choose_k` once per
step, so importing this module loads neither numpy, torch, gymnasium nor stable-baselines3,
and a call allocates nothing. No pickle: the table is JSON. Only a table on a per-request
estimate (below) loads numpy, for :mod:`specrl.posterior`.

Use::

    controller = LookupController.load("TABLE.json", profile="PROFILE.json")
    while serving:
        k = controller.choose_k(batch_size, context_len=longest_row)
        drafted, accepted = engine.step(k)            # over the whole batch
        controller.observe(drafted, accepted)         # the step ran the K chosen above

That is a table from a run on the step EMA (``specrl train --acceptance-estimate steps``). A
table exported from a run on a per-request estimate (its provenance's
``acceptance_estimate``, ``"usable"``, the training default, or ``"requests"``) carries that
estimate's curves, and the controller computes it from each request's own accepted runs
(:attr:`LookupController.requests`, a :class:`specrl.posterior.RequestTracker`; numpy is
imported for it), at the batch sizes where the table's K depends on it::

    controller.requests.add(request_id, temperature=0.7, max_tokens=256)  # as it arrives
    k = controller.choose_k(batch_size, rows=[(request_id, generated), ...], incoming=[...])
    step = engine.step(k)                             # per row: drafted, accepted
    controller.requests.observe(ids, generated_before, drafted, accepted)
    controller.requests.finish(request_id)            # as it ends
"""

from __future__ import annotations

import operator
import warnings
from bisect import bisect_right
from pathlib import Path

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.features import STALE_STEPS, AcceptanceTracker
from specrl.files import read_json
from specrl.table import KTable, load_table

HARD_FINGERPRINT_KEYS = ("device", "target_sha256", "draft_sha256")
"""A table trained on another device or pair is refused unless forced; the same keys as
``specrl.profile.fingerprint.HARD_KEYS`` (a module that imports torch, so not imported here)."""


class LookupController:
    """K per step looked up in a :class:`~specrl.table.KTable`.

    The acceptance estimate and its staleness come from
    :class:`~specrl.features.AcceptanceTracker`, the same computation as the environments'
    observation, so the table is read with the signal the policy was trained on.

    :meth:`choose_k` at ``batch_size`` rows:

    * ``batch_size <= 0``: 0 (nothing is decoded, nothing to draft for).
    * Above the table's ``max_batch``: the last bucket's K (the table is clamped, as vLLM
      extends its last range).
    * The estimate stale (no step drafted in :data:`~specrl.features.STALE_STEPS` steps,
      as at the start): the table's ``stale_k``; otherwise K at the estimate's acceptance bin.
    * When that K is 0 and no step has drafted for the probe rule's ``after_steps``
      steps (or none ever has: the first step probes): the probe's K, so that a step
      measures acceptance again. The probe repeats until a step reports drafted tokens to
      :meth:`observe`. Only at batch sizes (and context bins) where the rule's ``scope``
      lets it fire (:meth:`specrl.table.KTable.probes_at`).

    ``context_len`` (the batch's longest row, tokens) picks the context bin of a table that
    has them; None means the first bin. ``rows`` and ``incoming`` feed the per-request
    estimate of a table that carries one (:attr:`requests`): the coming step's decoding rows
    as ``(request_id, tokens generated)`` and the ids of the requests it admits; the
    estimate is then never stale, as in the environments that compute it. ``step_time_s`` is
    accepted so that every controller takes the same arguments, and ignored: the table does
    not index step time.

    :param table: the table to serve.
    :param profile: the serving machine's profile: a ``specrl.profile.Profile``, its
        fingerprint dict, or the path of its JSON file (only its ``fingerprint`` is read,
        without loading torch). A table whose provenance fingerprint names another device or model
        pair (:data:`HARD_FINGERPRINT_KEYS`) is refused. None: no check.
    :param force: use such a table anyway, with a warning.
    :param source: names the table in messages.
    :param acceptance_estimate: the acceptance figure the table is read with. None (the
        default): the table's own (its provenance's ``acceptance_estimate``), computed here:
        ``"steps"`` from :meth:`observe`, a per-request one from :attr:`requests` and
        ``choose_k(rows=...)`` (the table must carry its ``request_acceptance`` block). A
        name: the figure the caller sets on :attr:`tracker` (an environment's observation);
        a table trained on another is refused.

    :attr:`requests` is the per-request estimate's :class:`~specrl.posterior.RequestTracker`
    where the controller computes that estimate itself (``acceptance_estimate=None``), else
    None. It computes the figure only at a batch size (and context bin) whose acceptance bins
    hold more than one K; elsewhere the figure could not change the K, and :attr:`tracker`
    keeps the figure of the last step that computed it, marked fresh.
    """

    __slots__ = (
        "table",
        "tracker",
        "requests",
        "_per_request",
        "_cells",
        "_max_batch",
        "_inner_edges",
        "_context_starts",
        "_stale_index",
        "_probe_after",
        "_probe_k",
        "_last_k",
    )

    def __init__(
        self,
        table: KTable,
        *,
        profile=None,
        force: bool = False,
        source: str = "K table",
        acceptance_estimate: str | None = None,
    ):
        if profile is not None:
            check_provenance(table, profile, force=force, source=source)
        trained = table.provenance.get("acceptance_estimate", "steps")
        if acceptance_estimate is None and trained != "steps":
            if table.request_acceptance is None:
                raise SpecrlError(
                    f"{source} was trained on the {trained!r} acceptance estimate and has no "
                    "'request_acceptance' field, which a controller needs to compute it; export "
                    "it again with this specrl (`specrl export --run RUN_DIR --out TABLE.json`), "
                    f"or serve it where the observation is {trained!r} (an env built with "
                    f"acceptance_estimate={trained!r})"
                )
        elif acceptance_estimate is not None and trained != acceptance_estimate:
            raise SpecrlError(
                f"{source} was trained on the {trained!r} acceptance estimate, and this "
                f"controller reads {acceptance_estimate!r}: its acceptance bins would be "
                f"read with another figure. Serve it where the observation is {trained!r} "
                f"(an env built with acceptance_estimate={trained!r}), or with the "
                "controller's own estimate (acceptance_estimate=None)"
            )
        self._per_request = trained != "steps"
        self.requests = None
        if acceptance_estimate is None and self._per_request:  # the controller computes it
            from specrl.posterior import RequestTracker  # numpy, for this table only

            self.requests = RequestTracker(
                table.request_acceptance, table.k_max, usable=trained == "usable"
            )
        self.table = table
        self.tracker = AcceptanceTracker()
        self._max_batch = table.max_batch
        self._inner_edges = tuple(table.acceptance_edges[1:-1])
        self._stale_index = len(table.acceptance_edges) - 1
        self._context_starts = tuple(table.context_starts) if table.context_bins else None
        self._probe_after = table.probe["after_steps"]
        self._probe_k = table.probe["k"]
        self._last_k = 0
        # One tuple per (bucket, context bin): K per acceptance bin, the stale K, whether
        # the probe may fire there (its scope), then whether every acceptance bin holds one
        # K (the per-request estimate is then not computed: it could not change the K).
        by_bucket = [
            tuple(
                (
                    *table.cell(b, c),
                    table.stale(b, c),
                    table.probes_at(b, c),
                    len(set(table.cell(b, c))) == 1,
                )
                for c in range(table.n_context)
            )
            for b in range(len(table.batch_buckets))
        ]
        cells = [by_bucket[0]]  # batch 0 never reads it: choose_k returns 0 first
        for b, (lo, hi) in enumerate(table.batch_buckets):
            cells.extend([by_bucket[b]] * (hi - lo + 1))
        self._cells = tuple(cells if self._context_starts else [c[0] for c in cells])

    @classmethod
    def load(cls, path: str | Path, *, profile=None, force: bool = False) -> LookupController:
        """Read, validate and serve the table at ``path`` (see the class for the
        parameters)."""
        return cls(load_table(path), profile=profile, force=force, source=str(path))

    def reset(self) -> None:
        """Forget the acceptance measured so far and the requests held (a new deployment of
        the same table)."""
        self.tracker.reset()
        if self.requests is not None:
            self.requests.clear()
        self._last_k = 0

    def observe(self, drafted: int, accepted: int, k: int | None = None) -> None:
        """Count the step just run: ``drafted`` draft tokens over the whole batch, of which
        ``accepted`` were accepted (0 and 0 for a step with K=0). ``k``: the K the step ran
        with; None means the K that :meth:`choose_k` returned last. The estimate is the
        per-token acceptance, which needs it (:class:`~specrl.features.AcceptanceTracker`).
        A table on a per-request estimate takes each row's run instead
        (``requests.observe``)."""
        if self._per_request:
            raise SpecrlError(
                "observe: this table reads the per-request acceptance estimate; pass each "
                "row's run to controller.requests.observe(request_ids, generated, drafted, "
                "accepted) instead of the batch's totals"
            )
        try:  # index() refuses 2.5 and nan; numpy integers pass
            ok = 0 <= operator.index(accepted) <= operator.index(drafted)
        except TypeError:
            ok = False
        if not ok:
            raise SpecrlError(
                f"observe: accepted={accepted!r} and drafted={drafted!r}; pass the step's draft "
                "tokens over the whole batch and how many of them were accepted (integers, 0 <= "
                "accepted <= drafted)"
            )
        if k is None:
            k = self._last_k
        elif not _index_in(k, self.table.k_max):
            raise SpecrlError(
                f"observe: k={k!r}; pass the K the step ran with, an integer in "
                f"0..{self.table.k_max} (the table's k_max), or None for the K choose_k returned"
            )
        self.tracker.observe(drafted, accepted, k)

    def choose_k(
        self, batch_size: int, step_time_s=None, context_len=None, rows=None, incoming=()
    ) -> int:
        """K for the next step of ``batch_size`` rows (see the class for the rules)."""
        try:
            empty = batch_size <= 0
            if empty:
                cells = None
            elif batch_size <= self._max_batch:
                cells = self._cells[batch_size]
            else:  # index() refuses 1000.5, nan and inf, which compare above max_batch too
                cells = self._cells[operator.index(batch_size) and self._max_batch]
        except TypeError:  # free when nothing is raised: the per-step path stays as fast
            raise SpecrlError(
                f"choose_k: batch_size must be an integer (rows in the next step), got "
                f"{batch_size!r}"
            ) from None
        if empty:  # nothing decoded, nothing to draft for; the rows still move the figure
            if rows is not None:
                self._estimate_requests(rows, incoming, same_k=False)
            return 0
        if self._context_starts is not None:
            if context_len is None or context_len < 1:
                cells = cells[0]
            else:
                cells = cells[bisect_right(self._context_starts, context_len) - 1]
        if rows is not None:
            self._estimate_requests(rows, incoming, same_k=cells[-1])
        tracker = self.tracker
        since = tracker.since_measured
        if since >= STALE_STEPS:
            k = cells[self._stale_index]
        else:
            k = cells[bisect_right(self._inner_edges, tracker.estimate)]
        if k == 0 and since >= self._probe_after and cells[-2]:
            k = self._probe_k
        self._last_k = k
        return k

    def _estimate_requests(self, rows, incoming, same_k: bool) -> None:
        if self.requests is None:
            if self._per_request:  # built with acceptance_estimate named: the caller's figure
                raise SpecrlError(
                    "choose_k: rows= feeds the controller's own per-request estimate, and this "
                    "one reads the figure its caller sets on tracker (acceptance_estimate was "
                    "given); build it with acceptance_estimate=None to compute it here"
                )
            raise SpecrlError(
                "choose_k: rows= feeds the per-request acceptance estimate, and this table "
                "reads the steps' estimate; call choose_k(batch_size) and observe() after "
                "each step"
            )
        if same_k:  # one K at every acceptance: the figure is fresh, and not needed
            if self.requests.decodes(rows, incoming):
                self.tracker.since_measured = 0
            return
        estimate = self.requests.estimate(rows, incoming)
        if estimate is not None:
            self.tracker.estimate, self.tracker.since_measured = estimate, 0


def _index_in(value, hi: int) -> bool:
    """``value`` is an integer (numpy's too) in 0..hi."""
    try:
        return 0 <= operator.index(value) <= hi
    except TypeError:
        return False


def check_provenance(table: KTable, profile, *, force: bool = False, source: str = "") -> None:
    """Refuse ``table`` unless its provenance fingerprint names the same device and model
    pair as ``profile`` (a ``specrl.profile.Profile``, its fingerprint dict or its file's
    path); with ``force=True`` warn instead."""
    if isinstance(profile, (str, Path)):
        remake = "measure one with `specrl profile --out PROFILE.json`"
        obj = read_json(profile, "profile", remake)
        if not isinstance(obj, dict) or not isinstance(obj.get("fingerprint"), dict):
            raise SpecrlError(f"profile file {profile} has no 'fingerprint' object; {remake}")
        profile = obj["fingerprint"]
    ours = getattr(profile, "fingerprint", profile)
    if not isinstance(ours, dict):
        raise SpecrlError(
            "profile must be a specrl Profile, its fingerprint dict or its file's path, got "
            f"{type(profile).__name__}"
        )
    theirs = table.provenance["profile_fingerprint"]
    differ = [key for key in HARD_FINGERPRINT_KEYS if theirs.get(key) != ours.get(key)]
    if not differ:
        return
    detail = "; ".join(f"{k}: {theirs.get(k)!r} vs here {ours.get(k)!r}" for k in differ)
    message = (
        f"{source or 'K table'} was trained for other hardware or another model pair "
        f"({detail}); train and export a table on a profile of this machine"
    )
    if not force:
        raise SpecrlError(f"{message}, or force it (--force, force=True) to use it anyway")
    warnings.warn(f"{message}; using it anyway (forced)", category=SpecrlWarning, stacklevel=3)
