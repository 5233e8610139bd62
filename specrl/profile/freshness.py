"""Is a profile still true here? Time a few cells now and set them beside the profile's figures.

A profile is only true on the machine, and at the speed, where it was measured: two machines
with the same fingerprint can differ widely, and a shared one drifts (docs/profile.md). The
fingerprint cannot see that; timing a few of the profile's own cells again, by its own
procedure, can (:func:`check_freshness`).
``specrl profile --check PROFILE.json`` prints the comparison; the live env,
``validate-surrogate``, ``compare --env live`` and the demo run the same check and warn, or
refuse unless forced, when a cell is outside its tolerance (:func:`cell_tolerance`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import shlex
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.profile.costs import interp_linear, points_seconds
from specrl.profile.timing import cell_statistics, clean_steps, time_cells
from specrl.workload.prompts import token_streams

TOLERANCE = 0.15
"""Largest accepted |measured / profile - 1| of a cell's step time: the tolerance of a profile
that records no spread, and the most any cell's own tolerance may be."""
TOLERANCE_FLOOR = 0.05
"""The least a cell's tolerance may be: the machine's speed drifts between minutes by more
than one run's samples spread."""
NOISE_SIGMAS = 3.0
"""A cell is stale when its median moves by more than this many of its measured spreads."""
CHECK_BATCHES = (1, 8, 64)
"""Batch sizes timed (those of the profile's grid; the largest grid size if none is)."""
CHECK_ROUNDS = 2
"""Rounds timed for a profile that does not record its own ``reps``."""
ALL_CELLS_MAX_BATCH = 64
"""``specrl profile --check --all-cells`` compares every grid batch size up to this one."""
REMEASURE = "specrl profile --out PROFILE.json"
"""The command that measures the default pair (see :func:`remeasure_command` for others)."""


def all_cell_batches(profile) -> list[int]:
    """The batch sizes ``specrl profile --check --all-cells`` compares: the profile's grid up to
    :data:`ALL_CELLS_MAX_BATCH`."""
    return [b for b in profile.batch_sizes if b <= ALL_CELLS_MAX_BATCH]


def cell_tolerance(spread: float) -> float:
    """The largest |measured / profile - 1| that a cell of measured ``spread`` (robust standard
    deviation of its steps' log time) accepts: :data:`NOISE_SIGMAS` spreads, within
    [:data:`TOLERANCE_FLOOR`, :data:`TOLERANCE`]."""
    return min(TOLERANCE, max(TOLERANCE_FLOOR, NOISE_SIGMAS * spread))


def remeasure_command(pair=None, prompts: str | None = None) -> str:
    """The ``specrl profile`` command that measures ``pair`` (a ``ModelPair``): ``--preset``
    for a default pair, ``--target``/``--draft`` for one loaded by path, and ``--prompts``
    where a profile was measured on a prompts file (paths shell-quoted)."""
    cmd = "specrl profile"
    if pair is not None and getattr(pair, "preset", None):
        cmd += f" --preset {pair.preset}"
    elif pair is not None and getattr(pair, "target_path", None):
        cmd += (
            f" --target {shlex.quote(str(pair.target_path))}"
            f" --draft {shlex.quote(str(pair.draft_path))}"
        )
    if prompts:
        cmd += f" --prompts {shlex.quote(str(prompts))}"
    return cmd + " --out PROFILE.json"


def profile_prompts(profile) -> str | None:
    """The prompts file ``profile`` was measured on (``meta.prompts.file``), if any."""
    return (profile.meta.get("prompts") or {}).get("file")


@dataclass
class CellCheck:
    batch: int
    k: int
    profile_s: float
    """The profile's step time: its cell median (``cell_s``), or, for a profile without one,
    its table at ``context`` (:func:`profile_step_s`)."""
    measured_s: float
    context: float = float("nan")
    """Mean context (longest row) of the timed steps."""
    tolerance: float = TOLERANCE
    """Largest accepted |ratio - 1| (:func:`cell_tolerance` of the profile's spread)."""

    @property
    def ratio(self) -> float:
        return self.measured_s / self.profile_s

    @property
    def off(self) -> float:
        """|ratio - 1| as a share of the tolerance: above 1 is stale."""
        return abs(self.ratio - 1) / self.tolerance


@dataclass
class PrefillCheck:
    """One admission timed by the check: the prefill of ``tokens`` padded prompt tokens
    (rows x the widest prompt) beside the profile's figure there (``FreshnessReport``
    says which). It does not decide freshness; :func:`speed_matched` reads its ratio."""

    tokens: int
    profile_s: float
    measured_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.profile_s


@dataclass
class FreshnessReport:
    cells: list[CellCheck] = field(default_factory=list)
    prefill: list[PrefillCheck] = field(default_factory=list)
    """Each timed cell's admission (the median over its replicas) against the profile's own
    (:func:`profile_admission_s`)."""
    admissions: list[PrefillCheck] = field(default_factory=list)
    """The admissions of served size timed between the rounds (one request, then groups of
    a few, joining a warm engine: the procedure whose samples make most of the profile's
    prefill table) against that table (:func:`profile_prefill_s`)."""
    seconds: float = 0.0
    """Wall time the check took (both passes, where it took two)."""
    first_pass: FreshnessReport | None = None
    """Where the first pass read a cell outside its tolerance and the cells were timed again
    (:func:`check_freshness`, ``confirm``): that first pass; these cells are the second."""

    @property
    def worst(self) -> CellCheck:
        """The cell furthest outside (or least inside) its tolerance."""
        return max(self.cells, key=lambda c: c.off)

    @property
    def fresh(self) -> bool:
        return self.worst.off <= 1

    def format(self) -> str:
        lines = [
            "| batch | K | context | profile ms | now ms | now / profile | tolerance |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in self.cells:
            lines.append(
                f"| {c.batch} | {c.k} | {c.context:.0f} | {c.profile_s * 1e3:.2f} | "
                f"{c.measured_s * 1e3:.2f} | {c.ratio:.2f} | {c.tolerance:.0%} |"
            )
        if self.admissions:
            ratios = [c.ratio for c in self.admissions]
            lines.append(
                "prefill, admissions of served size now / profile (not part of the verdict): "
                f"median {float(np.median(ratios)):.2f} over {len(ratios)} "
                f"({min(ratios):.2f}-{max(ratios):.2f})"
            )
        if self.prefill:
            lines.append(
                "prefill, each cell's admission now / profile (not part of the verdict): "
                + ", ".join(f"{c.tokens} tokens {c.ratio:.2f}" for c in self.prefill)
            )
        return "\n".join(lines)

    def summary(self) -> str:
        """The median and largest |now / profile - 1| over the cells, and where the largest is;
        where the cells were timed twice, what the first pass read."""
        errors = [abs(c.ratio - 1) for c in self.cells]
        top = max(self.cells, key=lambda c: abs(c.ratio - 1))
        text = (
            f"{len(self.cells)} cells: median |now / profile - 1| {float(np.median(errors)):.1%}, "
            f"largest {max(errors):.1%} (batch {top.batch}, K={top.k}: ratio {top.ratio:.3f})"
        )
        if self.first_pass is not None:
            w = self.first_pass.worst
            text += (
                f"; timed twice: the first pass read batch {w.batch}, K={w.k} at "
                f"{w.ratio:.3f}, outside its {w.tolerance:.0%}"
            )
        return text

    def message(self, source: str, remeasure: str = REMEASURE) -> str:
        """Why the profile is stale, and ``remeasure``: the command that measures it again."""
        w = self.worst
        return (
            f"{source}: step times here differ from the profile's beyond their tolerance "
            f"(batch {w.batch}, K={w.k}: {w.measured_s * 1e3:.2f} ms now, "
            f"{w.profile_s * 1e3:.2f} ms in the profile, {abs(w.ratio - 1):.0%} off; tolerance "
            f"{w.tolerance:.0%}). The machine is not the one, or not at the speed, it was "
            f"measured at; re-measure with `{remeasure}`"
        )


def profile_step_s(profile, batch_index: int, k: int, context: float) -> float:
    """The profile's step time (no prefill or catch-up) at grid batch ``batch_index`` and
    ``context`` tokens: linear in the measured contexts, extended past them, as the surrogate
    charges it (:class:`specrl.profile.costs.StepCosts`)."""
    per_context = [profile.step_seconds(batch_index, k, c) for c in range(len(profile.contexts))]
    return float(interp_linear(np.array([float(context)]), profile.contexts, per_context)[0])


def check_freshness(
    profile,
    pair,
    *,
    device: str = "cpu",
    batches: list[int] | None = None,
    confirm: bool = True,
) -> FreshnessReport:
    """Time the profile's shortest level (every batch size of its grid at its shortest prompt
    length) with ``pair`` by the profile's own procedure
    (:func:`specrl.profile.timing.time_cells`, its ``reps``, ``seed`` and
    ``large_batch_repeats``), and return every K of ``batches`` (default:
    :data:`CHECK_BATCHES` of the grid) beside the profile's figure. The whole level is timed
    because a step's time depends on the caches built beside it: the profile timed each cell
    beside its level's others.

    With ``confirm``, a pass that reads a cell outside its tolerance is timed once more, and
    the second pass decides (the first is kept on ``first_pass``): a machine busy for the
    half minute of one pass slows every cell of it, while a profile that no longer holds
    fails both.

    A profile that records its cells (``cell_s``: its rows were cut from the held-out
    corpus) is compared cell for cell: the check rebuilds those cells row for row, so each
    is timed at the same contexts as the profile timed it, within the tolerance of its own
    spread (:func:`cell_tolerance`). Any other profile (its rows from a prompts file, or from
    before cells were recorded) is compared at K=0 and K=k_max with its tables at the context
    the check timed (:func:`profile_step_s`), within :data:`TOLERANCE`."""
    started = time.perf_counter()
    grid = profile.batch_sizes
    if batches is None:
        batches = [b for b in CHECK_BATCHES if b in grid] or [grid[-1]]
    if not set(batches) <= set(grid):
        raise SpecrlError(f"check_freshness: batches {batches} are not all in the grid {grid}")
    report = _one_pass(profile, pair, device, batches)
    if confirm and not report.fresh:
        report = dataclasses.replace(_one_pass(profile, pair, device, batches), first_pass=report)
    report.seconds = time.perf_counter() - started
    return report


def _one_pass(profile, pair, device: str, batches: list[int]) -> FreshnessReport:
    """One timing of ``batches`` by the profile's procedure (:func:`check_freshness`)."""
    grid = profile.batch_sizes
    context = int((profile.meta.get("prompt_lengths") or [16])[0])
    by_cell = profile.cell_s is not None
    timed = time_cells(
        pair,
        token_streams(pair.tokenizer),
        # The whole level, as the profile timed it: a cell's step time depends on the
        # caches built beside it (specrl.profile.timing).
        [(b, context) for b in grid],
        k_max=profile.k_max,
        reps=int(profile.meta.get("reps") or CHECK_ROUNDS),
        device=device,
        seed=int(profile.meta.get("seed") or 0),
        warm_up=(grid[-1], context),
        # A profile from before the repeats timed each K once a round.
        large_batch_repeats=int(profile.meta.get("large_batch_repeats") or 1),
    )
    cells = timed.cells
    # Without the profile's cells, its tables at K=0 and K=k_max: the rest are interpolated.
    ks = range(profile.k_max + 1) if by_cell else sorted({0, profile.k_max})
    report = FreshnessReport()
    for prefill, _ in timed.admissions:
        tokens = prefill["prefill_padded"]
        report.admissions.append(
            PrefillCheck(tokens, profile_prefill_s(profile, tokens), prefill["prefill"])
        )
    for b in batches:
        bi = grid.index(b)
        decode = cells[b, context]
        admitted = float(np.median([s["prefill"] for s in timed.cell_admissions[b, context]]))
        tokens = b * context  # as the profile keys a cell's admission (tables.tabulate)
        report.prefill.append(PrefillCheck(tokens, profile_admission_s(profile, tokens), admitted))
        medians, _ = cell_statistics(decode, profile.k_max)
        for k in ks:
            at = float(np.mean([s["context"] for s in clean_steps(decode, k)]))
            if by_cell:
                expected = profile.cell_s[bi][k]
                tolerance = cell_tolerance(profile.cell_spread[bi][k])
            else:
                expected, tolerance = profile_step_s(profile, bi, k, at), TOLERANCE
            report.cells.append(CellCheck(b, k, expected, medians[k], at, tolerance))
    return report


def profile_prefill_s(profile, tokens: int) -> float:
    """The profile's prefill seconds at ``tokens`` padded tokens, as the surrogate reads its
    table (:func:`specrl.profile.costs.points_seconds`)."""
    return points_seconds(profile.prefill, tokens)


def profile_admission_s(profile, tokens: int) -> float:
    """The profile's own timing-cell admission at ``tokens`` padded tokens
    (``cell_prefill``), which the check's cells repeat; the prefill table
    (:func:`profile_prefill_s`) in a profile from before it was kept. The table pools the
    cells' admissions with the small admissions of served traffic, a different procedure
    (docs/profile.md), so a check set against it would read the difference as drift."""
    if profile.cell_prefill is not None:
        return points_seconds(profile.cell_prefill, tokens)
    return profile_prefill_s(profile, tokens)


def prefill_ratio(reports: list[FreshnessReport]) -> float | None:
    """Median measured / profile prefill seconds over the admissions of served size that
    ``reports`` timed (``admissions``), or, where they timed none, over the cells'
    admissions (``prefill``); None where they timed neither.

    Why the served-size ones: they repeat the procedure behind most of the profile's prefill
    table, a few dozen of them a check, while a cell's admission is one sample (the median
    of a few replicas) of a procedure that the check runs in another order than the profile
    (docs/profile.md: how far they moved)."""
    for attr in ("admissions", "prefill"):
        ratios = [c.ratio for r in reports for c in getattr(r, attr) if c.profile_s > 0]
        if ratios:
            return float(np.median(ratios))
    return None


def speed_ratios(reports: list[FreshnessReport]) -> dict[tuple[int, int], float]:
    """Median measured / profile step time of each checked cell (batch, K) over ``reports``:
    the machine's speed against the profile's, over the minutes the checks spanned."""
    ratios: dict[tuple[int, int], list[float]] = {}
    for report in reports:
        for c in report.cells:
            ratios.setdefault((c.batch, c.k), []).append(c.ratio)
    if not ratios:
        raise SpecrlError("speed_ratios: no freshness checks to read")
    return {cell: float(np.median(r)) for cell, r in sorted(ratios.items())}


def speed_matched(profile, reports: list[FreshnessReport]):
    """``profile`` with its step times (verify, draft, the rest) scaled to the speed that
    ``reports`` measured: each checked cell's median ratio (:func:`speed_ratios`), linear in
    log batch size between the checked sizes (held flat past them); a K the checks did not
    time takes the line between K=0 and K=k_max. The prefill table is scaled by the median
    ratio of the checks' admissions to the profile's (:func:`prefill_ratio`) where the
    checks timed any; the draft's catch-up stays as measured.

    Why: on a shared machine the same cells drift between profiles an hour apart, the
    memory-bound K=0 step more than the K>0 steps (docs/profile.md: by how much), so a live run
    set against a profile measures the drift as much as the surrogate. Checks taken between
    the live episodes give the speed of those minutes (``specrl validate-surrogate`` reports
    both comparisons)."""
    ratios = speed_ratios(reports)
    checked = sorted({b for b, _ in ratios})
    top = profile.k_max
    if any((b, k) not in ratios for b in checked for k in (0, top)):
        raise SpecrlError(f"speed_matched: the checks must time K=0 and K={top} at each batch")
    logs = np.log(checked)

    def at_k(batch: int, k: int) -> float:
        return float(np.interp(math.log(batch), logs, [ratios[b, k] for b in checked]))

    def ratio(batch: int, k: int) -> float:
        if all((b, k) in ratios for b in checked):
            return at_k(batch, k)
        return at_k(batch, 0) + (at_k(batch, top) - at_k(batch, 0)) * k / top

    out = copy.deepcopy(profile)
    for bi, batch in enumerate(out.batch_sizes):
        for k in range(top + 1):
            r = ratio(batch, k)
            out.verify_s[bi][k] = [t * r for t in out.verify_s[bi][k]]
            out.draft_s[bi][k] = [t * r for t in out.draft_s[bi][k]]
            out.overhead_s[bi][k] *= r
            out.tokens_per_s[bi][k] /= r
    prefill = prefill_ratio(reports)
    if prefill is not None:
        out.prefill = _scaled(out.prefill, prefill)
        if out.cell_prefill is not None:
            out.cell_prefill = _scaled(out.cell_prefill, prefill)
    out.meta = {
        **out.meta,
        "speed_matched": {
            "checks": len(reports),
            "ratios": [[b, k, r] for (b, k), r in ratios.items()],
            "prefill_ratio": prefill,
        },
    }
    return out


def _scaled(points: dict, ratio: float) -> dict:
    """``{"tokens", "seconds"}`` points with every time multiplied by ``ratio``."""
    return {**points, "seconds": [t * ratio for t in points["seconds"]]}


def enforce_freshness(
    profile, pair, *, device: str = "cpu", force: bool = False, source: str = "profile"
) -> FreshnessReport:
    """Run :func:`check_freshness`; a stale profile raises :class:`SpecrlError`, or warns
    with ``force=True``."""
    report = check_freshness(profile, pair, device=device)
    if not report.fresh:
        message = report.message(source, remeasure_command(pair, profile_prompts(profile)))
        if not force:
            raise SpecrlError(message + ", or pass --force to use it anyway")
        warnings.warn(message, category=SpecrlWarning, stacklevel=2)
    return report
