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
    """Aggregate tokens/s of each policy live (``live_repeats`` episodes, the policies taking
    turns so a busy spell on the machine hits all of them alike) and in the surrogate
    (``surrogate_seeds`` episodes); both envs must hold the same fixed trace. A short live
    warm-up runs first and is discarded (the first steps of a process are slow)."""
    if warmup_steps:
        run_episode(live, policies[-1], seed=seed, max_steps=warmup_steps)
    live_runs: dict[str, list] = {p.name: [] for p in policies}
    for _ in range(live_repeats):
        for policy in policies:
            live_runs[policy.name].append(run_episode(live, policy, seed=seed))
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
