"""Sim-to-real: the same policies on the same trace, live and in the surrogate.

Two things are compared per policy: the objective (aggregate tokens/s) and what the controller
sees (the acceptance estimate of the observation: its mean and standard deviation over the
steps, each step weighted by the rows it served).
A tokens/s ratio off 1 is split into where the time went: seconds per episode spent decoding
(verify, draft, catch-up) and prefilling admissions, surrogate over live. The trace's tokens
are the same in both, so the two parts say which of the profile's costs is off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from specrl.envs.rollout import LIVE_WARMUP_STEPS, round_order, run_episode, warm_up


@dataclass
class Comparison:
    policy: str
    live_tokens_per_s: float
    surrogate_tokens_per_s: float
    live_acceptance_mean: float = 0.0
    live_acceptance_std: float = 0.0
    surrogate_acceptance_mean: float = 0.0
    surrogate_acceptance_std: float = 0.0
    trace: str = ""
    live_decode_s: float = math.nan
    """Seconds per episode outside the admissions' prefill (mean over episodes)."""
    surrogate_decode_s: float = math.nan
    live_prefill_s: float = math.nan
    """Seconds per episode prefilling admitted requests (mean over episodes)."""
    surrogate_prefill_s: float = math.nan
    matched_tokens_per_s: float = math.nan
    """Surrogate tokens/s on the profile scaled to the speed measured between the live
    episodes (:func:`specrl.profile.freshness.speed_matched`); NaN when not measured."""
    matched_decode_s: float = math.nan
    matched_prefill_s: float = math.nan
    """Prefill seconds per episode on the speed-matched profile, whose prefill is scaled by
    the checked admissions (:func:`specrl.profile.freshness.prefill_ratio`)."""
    surrogate_draw_std: float = math.nan
    """How far one draw of the traces' requests moves the live acceptance mean if the
    surrogate is right: the standard deviation of the surrogate's per-episode means (steps
    by rows) over the square root of the number of traces. Live replays each trace's
    requests, one draw of their acceptance, however many repeats it plays; each surrogate
    seed draws the levels afresh. NaN when not computed."""

    @property
    def ratio(self) -> float:
        """Surrogate tokens/s over live tokens/s; the goal is 0.9-1.1."""
        return self.surrogate_tokens_per_s / self.live_tokens_per_s

    @property
    def matched_ratio(self) -> float:
        """Speed-matched surrogate tokens/s over live tokens/s."""
        return self.matched_tokens_per_s / self.live_tokens_per_s

    @property
    def observed(self) -> bool:
        """Whether either side saw an acceptance observation. A policy that never drafts
        (off) leaves the estimate at 0 in both environments: there is nothing to compare."""
        return any(
            v != 0.0
            for v in (
                self.live_acceptance_mean,
                self.live_acceptance_std,
                self.surrogate_acceptance_mean,
                self.surrogate_acceptance_std,
            )
        )

    @property
    def acceptance_gap(self) -> float:
        """The larger of the live/surrogate gaps in the acceptance observation's mean and
        std (steps weighted by rows); the goal is at most 0.05."""
        return max(self.mean_gap, self.std_gap)

    @property
    def mean_gap(self) -> float:
        """The live/surrogate gap in the acceptance observation's mean (steps by rows)."""
        return abs(self.live_acceptance_mean - self.surrogate_acceptance_mean)

    @property
    def std_gap(self) -> float:
        """The live/surrogate gap in the acceptance observation's std (steps by rows)."""
        return abs(self.live_acceptance_std - self.surrogate_acceptance_std)

    @property
    def gap_in_draws(self) -> float:
        """The mean gap over :attr:`surrogate_draw_std`: within about 2, one draw of the
        traces' requests explains it."""
        return _over(self.mean_gap, self.surrogate_draw_std) if self.mean_gap else 0.0

    @property
    def decode_ratio(self) -> float:
        """Surrogate decode seconds over live: above 1, the profile's step times run slow."""
        return _over(self.surrogate_decode_s, self.live_decode_s)

    @property
    def prefill_ratio(self) -> float:
        """Surrogate prefill seconds over live."""
        return _over(self.surrogate_prefill_s, self.live_prefill_s)

    @property
    def matched_prefill_ratio(self) -> float:
        """Speed-matched surrogate prefill seconds over live."""
        return _over(self.matched_prefill_s, self.live_prefill_s)

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "ratio": self.ratio,
            "decode_ratio": self.decode_ratio,
            "prefill_ratio": self.prefill_ratio,
            "matched_ratio": self.matched_ratio,
            "matched_prefill_ratio": self.matched_prefill_ratio,
        }


def _over(a: float, b: float) -> float:
    return a / b if b else math.nan


class LiveRuns:
    """Live episodes of ``policies`` on one fixed trace, ``repeats`` each, the policies taking
    turns so a busy spell on the machine hits all of them alike (in the given order, then
    reversed: :func:`~specrl.envs.rollout.round_order`). Call :meth:`run_next` one
    episode at a time (to interleave them with other measurements) or :meth:`run_all`."""

    def __init__(
        self,
        live,
        policies,
        *,
        seed: int = 0,
        repeats: int = 2,
        warmup_steps: int = LIVE_WARMUP_STEPS,
        first_round: int = 0,
    ):
        self.live, self.seed = live, seed
        # first_round: where these rounds fall in a longer comparison (several traces), so the
        # play order keeps alternating across them.
        self.todo = [
            p for r in range(first_round, first_round + repeats) for p in round_order(policies, r)
        ]
        self.n_policies = len(policies)
        self.results: dict[str, list] = {p.name: [] for p in policies}
        warm_up(live, policies[-1], seed=seed, steps=warmup_steps)

    def run_next(self, *_) -> str | None:
        """Play the next episode; returns its policy's name (None when all are played)."""
        if not self.todo:
            return None
        policy = self.todo.pop(0)
        self.results[policy.name].append(run_episode(self.live, policy, seed=self.seed))
        return policy.name

    def run_all(
        self,
        on_episode: Callable[[str], None] | None = None,
        before_round: Callable[[], None] | None = None,
    ) -> dict[str, list]:
        """Play every episode left; ``on_episode(policy_name)`` after each (a progress bar),
        ``before_round()`` before each round of one episode per policy (a speed check)."""
        while self.todo:
            if before_round is not None and len(self.todo) % self.n_policies == 0:
                before_round()
            name = self.run_next()
            if on_episode is not None:
                on_episode(name)
        return self.results


def compare(
    live,
    surrogate,
    policies,
    *,
    seed: int = 0,
    live_repeats: int = 2,
    surrogate_seeds: int = 20,
    warmup_steps: int = LIVE_WARMUP_STEPS,
) -> list[Comparison]:
    """Aggregate tokens/s of each policy live (:class:`LiveRuns`) and in the surrogate
    (``surrogate_seeds`` episodes); both envs must hold the same fixed trace."""
    runs = LiveRuns(live, policies, seed=seed, repeats=live_repeats, warmup_steps=warmup_steps)
    return compare_runs(runs.run_all(), surrogate, policies, surrogate_seeds=surrogate_seeds)


def compare_runs(
    live_runs: dict[str, list],
    surrogate,
    policies,
    *,
    surrogate_seeds: int = 20,
    matched=None,
) -> list[Comparison]:
    """Rows for live episodes already played (``LiveRuns.results``) against the surrogate,
    and, given ``matched`` (a surrogate env on the speed-matched profile), against that too.
    The policies are the same objects in every env: one decision rule, other costs.

    ``surrogate`` (and ``matched``) may be a list of envs, one per trace the live episodes
    played (several draws of one preset): ``surrogate_seeds`` episodes are played on each, and
    each row pools every episode, live and simulated."""
    rows = []
    surrogates = surrogate if isinstance(surrogate, list | tuple) else [surrogate]
    fasts = matched if isinstance(matched, list | tuple) or matched is None else [matched]
    trace = getattr(surrogates[0].unwrapped.workload, "name", "")
    for policy in policies:
        sims = [
            run_episode(env, policy, seed=s) for env in surrogates for s in range(surrogate_seeds)
        ]
        live = live_runs[policy.name]
        extra = {}
        if fasts is not None:
            fast = [
                run_episode(env, policy, seed=s) for env in fasts for s in range(surrogate_seeds)
            ]
            extra = {
                "matched_tokens_per_s": _aggregate(fast),
                "matched_decode_s": _mean_part(fast, decode=True),
                "matched_prefill_s": _mean_part(fast, decode=False),
            }
        rows.append(
            Comparison(
                policy.name,
                _aggregate(live),
                _aggregate(sims),
                *_acceptance_stats(live),
                *_acceptance_stats(sims),
                trace=trace,
                surrogate_draw_std=_draw_std(sims, len(surrogates)),
                live_decode_s=_mean_part(live, decode=True),
                surrogate_decode_s=_mean_part(sims, decode=True),
                live_prefill_s=_mean_part(live, decode=False),
                surrogate_prefill_s=_mean_part(sims, decode=False),
                **extra,
            )
        )
    return rows


def _aggregate(results) -> float:
    return sum(r.tokens for r in results) / sum(r.seconds for r in results)


def _mean_part(results, *, decode: bool) -> float:
    """Mean seconds per episode decoding (``decode``) or prefilling."""
    parts = [r.seconds - r.prefill_seconds if decode else r.prefill_seconds for r in results]
    return float(np.mean(parts))


def _acceptance_stats(results) -> tuple[float, float]:
    """Mean and standard deviation of the observed acceptance estimate over every step, each
    step weighted by the rows it served.

    The weight is the decision's: a step's K moves as many rows' tokens as it serves. It also
    keeps an episode's last rows from dominating: a trace drains to one or two requests for
    many steps, and live that tail is the same request in every repeat (one draw of its
    acceptance), while each surrogate seed draws its level afresh."""
    values = np.concatenate([np.asarray(r.step_acceptance, dtype=np.float64) for r in results])
    rows = np.concatenate([np.asarray(r.step_batch, dtype=np.float64) for r in results])
    weights = np.maximum(rows, 1.0)
    mean = float(np.average(values, weights=weights))
    return mean, float(np.sqrt(np.average((values - mean) ** 2, weights=weights)))


def _draw_std(results, traces: int) -> float:
    """Standard deviation (ddof 1) of the episodes' own means (:func:`_acceptance_stats`)
    over ``sqrt(traces)``; NaN with fewer than two episodes."""
    if len(results) < 2:
        return math.nan
    means = [_acceptance_stats([r])[0] for r in results]
    return float(np.std(means, ddof=1) / math.sqrt(traces))


def _acceptance_cells(r: Comparison) -> str:
    if not r.observed:
        return "- | -"
    draw = "" if math.isnan(r.surrogate_draw_std) else f" (one draw ± {r.surrogate_draw_std:.3f})"
    return (
        f"{r.live_acceptance_mean:.3f} ± {r.live_acceptance_std:.3f} | "
        f"{r.surrogate_acceptance_mean:.3f} ± {r.surrogate_acceptance_std:.3f}{draw}"
    )


def format_comparison(rows: list[Comparison]) -> str:
    matched = any(not math.isnan(r.matched_tokens_per_s) for r in rows)
    lines = [
        "| policy | live tokens/s | surrogate tokens/s | surrogate / live "
        "| decode s, surrogate / live | prefill s, surrogate / live "
        "| acceptance obs live (mean ± std, steps by rows) | surrogate |"
        + (
            " speed-matched tokens/s | speed-matched / live | speed-matched prefill / live |"
            if matched
            else ""
        ),
        "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if matched else ""),
    ]
    for r in rows:
        tail = (
            f" {r.matched_tokens_per_s:.0f} | {r.matched_ratio:.2f} | "
            f"{r.matched_prefill_ratio:.2f} |"
            if matched
            else ""
        )
        lines.append(
            f"| {r.policy} | {r.live_tokens_per_s:.0f} | {r.surrogate_tokens_per_s:.0f} | "
            f"{r.ratio:.2f} | {r.surrogate_decode_s:.2f} / {r.live_decode_s:.2f} "
            f"({r.decode_ratio:.2f}) | {r.surrogate_prefill_s:.2f} / {r.live_prefill_s:.2f} "
            f"({r.prefill_ratio:.2f}) | {_acceptance_cells(r)} |" + tail
        )
    return "\n".join(lines)
