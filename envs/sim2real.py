"""Sim-to-real: the same policies on the same trace, live and in the surrogate.

Two things are compared per policy: the objective (aggregate tokens/s) and what the controller
sees (the acceptance estimate of the observation, per step: its mean and standard deviation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from specrl.envs.rollout import run_episode


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

    @property
    def ratio(self) -> float:
        """Surrogate tokens/s over live tokens/s; the goal is 0.9-1.1."""
        return self.surrogate_tokens_per_s / self.live_tokens_per_s

    def to_json(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


class LiveRuns:
    """Live episodes of ``policies`` on one fixed trace, ``repeats`` each, the policies taking
    turns so a busy spell on the machine hits all of them alike. Call :meth:`run_next` one
    episode at a time (to interleave them with other measurements) or :meth:`run_all`."""

    def __init__(self, live, policies, *, seed: int = 0, repeats: int = 2, warmup_steps: int = 30):
        self.live, self.seed = live, seed
        self.todo = [p for _ in range(repeats) for p in policies]
        self.results: dict[str, list] = {p.name: [] for p in policies}
        if warmup_steps:  # discarded: the first steps of a process are slow
            run_episode(live, policies[-1], seed=seed, max_steps=warmup_steps)

    def run_next(self, *_) -> None:
        if self.todo:
            policy = self.todo.pop(0)
            self.results[policy.name].append(run_episode(self.live, policy, seed=self.seed))

    def run_all(self) -> dict[str, list]:
        while self.todo:
            self.run_next()
        return self.results


def compare(
    live,
    surrogate,
    policies,
    *,
    seed: int = 0,
    live_repeats: int = 2,
    surrogate_seeds: int = 20,
    warmup_steps: int = 30,
) -> list[Comparison]:
    """Aggregate tokens/s of each policy live (:class:`LiveRuns`) and in the surrogate
    (``surrogate_seeds`` episodes); both envs must hold the same fixed trace."""
    runs = LiveRuns(live, policies, seed=seed, repeats=live_repeats, warmup_steps=warmup_steps)
    return compare_runs(runs.run_all(), surrogate, policies, surrogate_seeds=surrogate_seeds)


def compare_runs(
    live_runs: dict[str, list], surrogate, policies, *, surrogate_seeds: int = 20
) -> list[Comparison]:
    """Rows for live episodes already played (``LiveRuns.results``) against the surrogate."""
    rows = []
    trace = getattr(surrogate.unwrapped.workload, "name", "")
    for policy in policies:
        sims = [run_episode(surrogate, policy, seed=s) for s in range(surrogate_seeds)]
        live = live_runs[policy.name]
        rows.append(
            Comparison(
                policy.name,
                _aggregate(live),
                _aggregate(sims),
                *_acceptance_stats(live),
                *_acceptance_stats(sims),
                trace=trace,
            )
        )
    return rows


def _aggregate(results) -> float:
    return sum(r.tokens for r in results) / sum(r.seconds for r in results)


def _acceptance_stats(results) -> tuple[float, float]:
    """Mean and standard deviation of the observed acceptance estimate over every step."""
    values = np.concatenate([np.asarray(r.step_acceptance, dtype=np.float64) for r in results])
    return float(values.mean()), float(values.std())


def format_comparison(rows: list[Comparison]) -> str:
    lines = [
        "| policy | live tokens/s | surrogate tokens/s | surrogate / live "
        "| acceptance obs live (mean ± std) | surrogate |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.policy} | {r.live_tokens_per_s:.0f} | {r.surrogate_tokens_per_s:.0f} | "
            f"{r.ratio:.2f} | {r.live_acceptance_mean:.3f} ± {r.live_acceptance_std:.3f} | "
            f"{r.surrogate_acceptance_mean:.3f} ± {r.surrogate_acceptance_std:.3f} |"
        )
    return "\n".join(lines)
