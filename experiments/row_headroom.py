"""How much of the myopic oracle's headroom the same rule takes from what a server knows of
each request (its own accepted runs so far), not from its true acceptance.

    python experiments/row_headroom.py                        # the four workloads, 5 min
    python experiments/row_headroom.py --workloads ramp --profile P.json

The myopic oracle (``SurrogateSpecEnv.oracle_k``) picks, each step, the K with the most
expected committed tokens per second from every row's *true* acceptance level. Here the same
rule runs from estimates a serving engine could keep:

* ``per-row``: each running row's acceptance is its posterior from the accepted runs it has
  shown so far. The prior is the profile's request levels of every domain in the row's
  temperature band, each domain alike (a server knows a request's temperature, not its
  domain); the likelihood, the profile's acceptance by position and tokens generated. A
  request still waiting, or admitted by the coming step, has the prior.
* ``pooled``: the same rule reading one acceptance curve for the whole batch, the mean of the
  per-row ones, as a table indexed by batch size and one acceptance figure reads the batch.
  It expects the same tokens as ``per-row`` wherever every row drafts K; the two differ only
  where rows near their last token draft fewer.
* ``pooled-scalar``: the pooled curve squeezed to one per-token acceptance ``a`` (the curve
  ``a, a^2, ...`` with the same accepted / drafted at K max): the figure the observation's
  acceptance axis is.
* ``ema-scalar``: the same from the observation's own estimate (the batch's EMA over the
  steps that drafted; the pooled figure while it is stale). Against ``pooled-scalar`` it
  says what the estimate costs, with the figure's form held.
* ``counts-scalar``: one figure from counts alone, no profile: each request's accepted
  tokens over its accepted tokens plus rejections, shrunk toward the episode's figure so far
  (:data:`COUNT_PRIOR`), the mean over the rows the step decodes. What a serving stack could
  keep without a profile.
* ``scalar-no-left``, ``scalar-last-context``, ``scalar-table-view``: ``pooled-scalar`` with
  what a table indexed by batch size and one figure does not see taken away, one piece at a
  time: each row's tokens left (every row taken to draft the full K), the coming step's
  context (the last step's, as the observation reads it, in its place), and both. Between
  ``pooled-scalar`` and ``table-rule`` they say which piece holds the headroom, and whether
  the rest is the rule's (the oracle's step costs against the goodput formula's).
* ``usable-table-view``: ``scalar-table-view`` with the figure carrying the rows' tokens
  left: each row's curve is zero past the positions it can still draft (``left - 1``) before
  the batch's curves are pooled and squeezed. Whether one figure can hold what the table
  view loses.
* ``table-rule``: what a table indexed by batch size and one acceptance figure can do with
  ``pooled-scalar``: the goodput formula (:meth:`~specrl.policies.Goodput.best_k`: batch,
  the last step's context and the figure, no row's own tokens left) reading the
  observation's acceptance of an env built with ``acceptance_estimate="requests"``, which
  is that figure (:mod:`specrl.posterior`).
* ``truth``: the rule from the true levels: the myopic oracle itself.

Every mode decides with the oracle's own pieces (the surrogate's ``_incoming`` rows and
``_myopic_k``); only the acceptance they read differs.

Per workload, on fresh seeds (:data:`FRESH_SEED`): tokens/s of each over the engineer (the
better of ``threshold:tuned`` and ``sweep``, tuned on the workload's tuning seeds), and the
share of the oracle's headroom each takes; with ``--table``, a native table's too. The
levels drift in the surrogate; the posterior treats a request's level as fixed (``--forget``
below 1 discounts older runs).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from specrl.dataclass_cli import comma_list, script_main, value
from specrl.options import SEED, float_in, positive_int, workload_preset
from specrl.policies.base import KPolicy

MODES = (
    "per-row",
    "pooled",
    "pooled-scalar",
    "ema-scalar",
    "counts-scalar",
    "scalar-no-left",
    "scalar-last-context",
    "scalar-table-view",
    "usable-table-view",
    "table-rule",
    "truth",
)
POOLED_FIGURE = (
    "pooled-scalar",
    "scalar-no-left",
    "scalar-last-context",
    "scalar-table-view",
    "usable-table-view",
)
"""Modes whose rule reads the batch's pooled curve squeezed to one figure."""
FULL_DRAFT = ("scalar-no-left", "scalar-table-view", "usable-table-view")
"""Modes whose rule takes every row to draft the full K (no row's tokens left)."""
LAST_CONTEXT = ("scalar-last-context", "scalar-table-view", "usable-table-view")
"""Modes whose rule reads the last step's context (the observation's), not the coming one's."""
COUNT_PRIOR = 16.0
"""``counts-scalar``: a request's prior weighs as this many accept-or-reject trials."""
FRESH_SEED = 60_000
"""Seeds no job of specrl.seeds uses (as experiments/table_headroom.py)."""
WORKLOADS = ("ramp", "day", "mixed", "bursts")
MIN_HEADROOM = 0.005
"""Below this gain of the oracle over the engineer no share of it is printed: a few
episodes do not resolve it."""


@dataclass
class Args:
    workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = WORKLOADS
    """Workload presets judged, each at its peak ``max_batch``."""
    profile: str = ""
    """A profile JSON; empty: the shipped one."""
    max_batch: Annotated[int, value(positive_int)] = 128
    """Largest batch of the surrogate env."""
    seed: Annotated[int, value(SEED)] = FRESH_SEED
    """First fresh seed judged."""
    episodes: Annotated[int, value(positive_int)] = 8
    """Fresh episodes per workload (seeds seed..seed+episodes-1)."""
    forget: Annotated[float, value(float_in(0.5, 1.0))] = 1.0
    """Each step multiplies a row's log-likelihood so far by this (1: a fixed level)."""
    modes: Annotated[tuple[str, ...], comma_list(_mode)] = ("per-row", "pooled")
    """Estimates the rule runs from, besides the truth (per-row, pooled, pooled-scalar,
    ema-scalar, counts-scalar, scalar-no-left, scalar-last-context, scalar-table-view,
    usable-table-view, table-rule)."""
    table: str = ""
    """A native table JSON (``specrl export``) judged on the same seeds, in an env whose
    observation is the estimate it was trained on (its provenance's
    ``acceptance_estimate``); empty: none."""


def _mode(text: str) -> str:
    if text not in MODES or text == "truth":
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(MODES[:-1])}, got {text!r}")
    return text


_mode.wanted = "a mode"


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, run, argv, __doc__, "row_headroom")


def run_log_likelihood(rates: np.ndarray, accepted: int, drafted: int) -> np.ndarray:
    """Log-probability, per candidate, of a row accepting exactly ``accepted`` of its
    ``drafted`` draft tokens: ``rates`` ``[candidates, drafted]`` are the probabilities of
    accepting each position given the ones before it. A run stops at its first rejection, so
    it is ``sum(log r[:accepted]) + log(1 - r[accepted])``, without the last term when all
    were accepted."""
    out = np.log(np.clip(rates[:, :accepted], 1e-12, 1.0)).sum(axis=1)
    if accepted < drafted:
        out = out + np.log(np.clip(1.0 - rates[:, accepted], 1e-12, 1.0))
    return out


class RowEstimateRule(KPolicy):
    """The myopic oracle's rule from each row's posterior acceptance (``mode`` ``per-row``),
    their mean for every row (``pooled``) or the true levels (``truth``). Reads the surrogate's
    rows, queue and tables as the oracle does; only the acceptance differs. Evaluate with one
    env at a time."""

    def __init__(self, env, mode: str = "per-row", forget: float = 1.0):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.env, self.mode, self.forget, self.name = env.unwrapped, mode, forget, mode
        e = self.env
        band_groups: dict[str, list[int]] = {}
        for g, (_, band) in enumerate(e._groups):
            band_groups.setdefault(band, []).append(g)
        # Per group: the candidates (group, level) of every domain of its band; each domain's
        # levels weigh alike in the prior.
        self._candidates = {}
        for g, (_, band) in enumerate(e._groups):
            groups = band_groups[band]
            cg = np.concatenate([np.full(len(e._levels[h]), h) for h in groups])
            cl = np.concatenate([e._levels[h] for h in groups])
            prior = np.concatenate(
                [np.full(len(e._levels[h]), -np.log(len(e._levels[h]))) for h in groups]
            )
            self._candidates[g] = (cg, cl, prior)
        self._rows: dict[int, tuple[np.ndarray, int]] = {}
        self._counts: dict[int, list[int]] = {}
        self._totals = [0, 0]
        self._last_k = 0
        self._goodput = None

    def _rates(self, group: int, generated: int, k: int) -> np.ndarray:
        cg, cl, _ = self._candidates[group]
        return self.env._rates(cg, cl, generated, k)

    def _update(self) -> None:
        """Fold the last step's accepted run of every row still running into its posterior."""
        e, k = self.env, self._last_k
        rows = {}
        for i in range(e._n):
            request, group, now = int(e._index[i]), int(e._group[i]), int(e._generated[i])
            if request not in self._rows:
                rows[request] = (self._candidates[group][2].copy(), now)
                continue
            log_post, before = self._rows[request]
            drafted = min(k, int(e._left[i]) + (now - before) - 1)
            if drafted > 0 and now > before:
                accepted = now - before - 1
                counts = self._counts.setdefault(request, [0, 0])
                counts[0] += accepted
                counts[1] += accepted < drafted
                self._totals[0] += accepted
                self._totals[1] += accepted < drafted
                seen = run_log_likelihood(
                    self._rates(group, before, drafted), now - before - 1, drafted
                )
                prior = self._candidates[group][2]
                log_post = prior + self.forget * (log_post - prior) + seen
            rows[request] = (log_post, now)
        self._rows = rows

    def _survival(self, group: int, generated: int, log_post: np.ndarray) -> np.ndarray:
        w = np.exp(log_post - log_post.max())
        return (w / w.sum()) @ np.cumprod(self._rates(group, generated, self.env.k_max), axis=1)

    def _act(self, rows, starts):
        e = self.env
        if starts[0]:
            self._rows, self._counts, self._totals, self._last_k = {}, {}, [0, 0], 0
        if self.mode == "truth":
            self._last_k = e.oracle_k()
            return np.array([self._last_k])
        if self.mode == "table-rule":
            return np.array([self._table_rule(rows[0])])
        self._update()
        n0 = e._n
        incoming, _, left_in, ctx_in = e._incoming()
        survive = [
            self._survival(int(e._group[i]), int(e._generated[i]), self._rows[int(e._index[i])][0])
            for i in range(n0)
        ] + [self._survival(int(g), 1, self._candidates[int(g)][2]) for g in incoming]
        left = np.concatenate([e._left[:n0], left_in])
        ctx = np.concatenate([e._ctx[:n0], ctx_in])
        max_ctx = int(ctx.max()) if len(ctx) else 0
        if self.mode == "usable-table-view" and survive:
            usable = np.arange(e.k_max)[None, :] < (left - 1)[:, None]
            survive = list(np.array(survive) * usable)
        if self.mode in FULL_DRAFT:
            left = np.full_like(left, e.k_max + 1)  # every row drafts the full K
        if self.mode in LAST_CONTEXT:
            from specrl.envs.base import CONTEXT

            max_ctx = min(int(round(float(rows[0][CONTEXT]) * e.max_len)), e.max_len - 1)
        if not survive:
            self._last_k = 0
            return np.array([0])
        if self.mode == "counts-scalar":
            survive = [self._counts_curve(e, n0, len(survive))] * len(survive)
        elif self.mode == "pooled":
            survive = [np.mean(survive, axis=0)] * len(survive)
        elif self.mode in POOLED_FIGURE:
            survive = [scalar_survival(np.mean(survive, axis=0))] * len(survive)
        elif self.mode == "ema-scalar":
            tracker = e.acceptance
            if tracker.measured and tracker.staleness < 1.0:
                a = tracker.estimate
                curve = a ** np.arange(1, e.k_max + 1)
            else:  # nothing measured lately: the pooled estimate's, as the table probes
                curve = scalar_survival(np.mean(survive, axis=0))
            survive = [curve] * len(survive)
        self._last_k = e._myopic_k(np.array(survive), left, max_ctx)
        return np.array([self._last_k])

    def _table_rule(self, row: np.ndarray) -> int:
        """``table-rule``: the goodput formula at the observation's batch, context and
        acceptance (see the module)."""
        from specrl.envs.base import ACCEPTANCE, CONTEXT
        from specrl.policies.base import rows_in_batch
        from specrl.policies.goodput import Goodput

        e = self.env
        if e.acceptance_estimate != "requests":
            raise ValueError("table-rule reads an env built with acceptance_estimate='requests'")
        if self._goodput is None:
            self._goodput = Goodput(
                e.profile, max_batch=e.max_batch, max_len=e.max_len, k_max=e.k_max
            )
        batch = int(rows_in_batch(row[None], e.max_batch)[0])
        if batch == 0:
            return 0
        return self._goodput.best_k(batch, row[CONTEXT] * e.max_len, float(row[ACCEPTANCE]))

    def _counts_curve(self, e, running: int, rows: int) -> np.ndarray:
        """``a, a^2, ...`` from counts alone (no profile): each running request's ``a`` is
        its accepted tokens over accepted tokens plus rejections (the estimate of a constant
        per-token acceptance from truncated geometric runs), shrunk toward the episode's
        figure so far by :data:`COUNT_PRIOR` trials; a request not yet drafted has the
        episode's figure; ``a`` is the mean over the ``rows`` the step decodes."""
        total_a, total_r = self._totals
        a0 = (total_a + 0.5) / (total_a + total_r + 1.0)
        values = []
        for i in range(running):
            acc, rej = self._counts.get(int(e._index[i]), (0, 0))
            values.append((acc + COUNT_PRIOR * a0) / (acc + rej + COUNT_PRIOR))
        values += [a0] * (rows - running)
        return float(np.mean(values)) ** np.arange(1, e.k_max + 1)


def scalar_survival(curve: np.ndarray) -> np.ndarray:
    """The curve ``a, a^2, ..., a^k`` of one per-token acceptance ``a`` with the same
    accepted / drafted at ``k = len(curve)`` as ``curve`` (survival of positions 1..k):
    the one-figure acceptance the observation carries
    (:func:`~specrl.features.conditional_acceptance`)."""
    from specrl.features import conditional_acceptance

    k = len(curve)
    a = conditional_acceptance(float(np.sum(curve)) / k, k)
    return a ** np.arange(1, k + 1)


def run(args: Args) -> dict:
    from specrl.envs import SurrogateSpecEnv
    from specrl.policies.engineer import (
        Scorer,
        best_sweep,
        best_threshold,
        geometric_rate,
        sweep_dense,
        threshold_dense,
        tuning_seeds,
    )
    from specrl.table import load_table

    seeds = list(range(args.seed, args.seed + args.episodes))
    table = load_table(args.table) if args.table else None
    estimate = "steps" if table is None else table.provenance.get("acceptance_estimate", "steps")
    if "table-rule" in args.modes:
        if table is not None and estimate != "requests":
            raise SystemExit(
                f"--modes table-rule reads the 'requests' estimate and {args.table} was trained "
                f"on {estimate!r}: judge them in two runs"
            )
        estimate = "requests"
    out = {}
    print(
        f"fresh seeds {seeds[0]}-{seeds[-1]}; tokens/s over the engineer "
        "(share of the oracle's headroom)",
        flush=True,
    )
    for workload in args.workloads:
        env = SurrogateSpecEnv(
            workload=workload,
            workload_kwargs={"peak": args.max_batch},
            max_batch=args.max_batch,
            # Only the observation differs (the env's steps do not): what the table and
            # table-rule read.
            acceptance_estimate=estimate,
            **({"profile": args.profile} if args.profile else {}),
        )
        tune = Scorer([env], tuning_seeds())
        k, b, _ = best_threshold(tune, env.k_max, args.max_batch)
        bucket_k, _ = best_sweep(tune, env.k_max, args.max_batch)
        fresh = Scorer([env], seeds)
        engineer = max(
            fresh.score(threshold_dense(k, b, args.max_batch)),
            fresh.score(sweep_dense(bucket_k, args.max_batch)),
        )
        ratios = {
            mode: geometric_rate(
                fresh.play_policy(lambda e, m=mode: RowEstimateRule(e, m, args.forget))
            )
            / engineer
            for mode in ("truth", *args.modes)
        }
        if args.table:
            ratios["table"] = fresh.score_table(table) / engineer
        headroom = ratios["truth"] - 1.0
        words = [f"oracle {ratios['truth']:.4f}x"]
        for mode in [m for m in ratios if m != "truth"]:
            share = f" ({(ratios[mode] - 1.0) / headroom:.0%})" if headroom > MIN_HEADROOM else ""
            words.append(f"{mode} {ratios[mode]:.4f}x{share}")
        if headroom <= MIN_HEADROOM:
            words.append(f"the oracle's headroom under {MIN_HEADROOM:.1%}: no share")
        print(f"{workload}: " + ", ".join(words), flush=True)
        out[workload] = ratios
    return out


if __name__ == "__main__":
    sys.exit(main())
