"""Sim-to-real: the same fixed policies on the same trace, live and in the surrogate."""

from __future__ import annotations

from dataclasses import dataclass

from specrl.envs.rollout import run_episode


@dataclass
class Comparison:
    policy: str
    live_tokens_per_s: float
    surrogate_tokens_per_s: float

    @property
    def ratio(self) -> float:
        """Surrogate tokens/s over live tokens/s; the goal is 0.9-1.1."""
        return self.surrogate_tokens_per_s / self.live_tokens_per_s


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
    for policy in policies:
        sims = [run_episode(surrogate, policy, seed=s) for s in range(surrogate_seeds)]
        rows.append(Comparison(policy.name, _aggregate(live_runs[policy.name]), _aggregate(sims)))
    return rows


def _aggregate(results) -> float:
    return sum(r.tokens for r in results) / sum(r.seconds for r in results)


def format_comparison(rows: list[Comparison]) -> str:
    lines = [
        "| policy | live tokens/s | surrogate tokens/s | surrogate / live |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.policy} | {r.live_tokens_per_s:.0f} | "
            f"{r.surrogate_tokens_per_s:.0f} | {r.ratio:.2f} |"
        )
    return "\n".join(lines)
