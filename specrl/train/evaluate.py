"""Held-out evaluation of a policy during training: :class:`Evaluation` plays it and every
static K and the oracle on the same seeded traces, and reports an :class:`EvalResult`."""

from __future__ import annotations

from dataclasses import dataclass, field

from specrl.compare import best_static, summarize
from specrl.config import TrainConfig
from specrl.envs.rollout import run_episode
from specrl.policies import make_policies
from specrl.profile import Profile
from specrl.train.envs import surrogate_env


@dataclass
class EvalResult:
    """The deterministic policy against the best static K and the oracle on held-out seeds."""

    timesteps: int
    tokens_per_s: float
    """The policy's tokens/s over every evaluation episode (sum of tokens / sum of seconds)."""
    ratio_best_static: float
    """Mean over workloads of the policy's tokens/s over the best static K's (the best of off
    and each fixed K on that workload's episodes)."""
    ratio_oracle: float
    """Mean over workloads of the policy's tokens/s over the oracle's."""
    by_workload: dict[str, dict] = field(default_factory=dict)
    """Per workload: tokens_per_s, best_static (name), best_static_tokens_per_s,
    oracle_tokens_per_s, ratio_best_static, ratio_oracle, k_share."""
    k_share: dict[str, float] = field(default_factory=dict)
    """Share of evaluation steps at each K."""
    step_k: list[int] = field(default_factory=list, repr=False)
    """K of every evaluation step (the histogram)."""

    def to_json(self) -> dict:
        return {
            "timesteps": self.timesteps,
            "tokens_per_s": self.tokens_per_s,
            "ratio_best_static": self.ratio_best_static,
            "ratio_oracle": self.ratio_oracle,
            "k_share": self.k_share,
            "by_workload": self.by_workload,
        }


class Evaluation:
    """Held-out evaluation: each of ``config.eval_workloads`` for ``eval_episodes`` episodes
    reset with ``eval_seed + i``. Every static K and the oracle serve the same traces; their
    results are computed once (the env is seeded and they do not learn)."""

    def __init__(self, config: TrainConfig, profile: Profile):
        self.k_max = config.k_max
        self.seeds = [config.eval_seed + i for i in range(config.eval_episodes)]
        self.envs = {name: surrogate_env(config, profile, name) for name in config.eval_workloads}
        self._specs = ["off", *(f"fixed:{k}" for k in range(1, config.k_max + 1)), "oracle"]
        self._baselines: dict[str, list] | None = None

    def _baseline_results(self) -> dict[str, list]:
        if self._baselines is None:
            self._baselines = {}
            for name, env in self.envs.items():
                policies = make_policies(self._specs, env=env)
                self._baselines[name] = [
                    summarize(p.name, [run_episode(env, p, seed=s) for s in self.seeds], self.k_max)
                    for p in policies
                ]
        return self._baselines

    def run(self, policy, timesteps: int) -> EvalResult:
        """Evaluate ``policy`` (anything with ``predict``) at ``timesteps`` of training."""
        baselines = self._baseline_results()
        by_workload, all_episodes = {}, []
        for name, env in self.envs.items():
            episodes = [run_episode(env, policy, seed=s) for s in self.seeds]
            all_episodes += episodes
            mine = summarize(policy.name, episodes, self.k_max)
            best = best_static(baselines[name])
            oracle = next(r for r in baselines[name] if r.policy == "oracle")
            by_workload[name] = {
                "tokens_per_s": mine.tokens_per_s,
                "best_static": best.policy,
                "best_static_tokens_per_s": best.tokens_per_s,
                "oracle_tokens_per_s": oracle.tokens_per_s,
                "ratio_best_static": mine.tokens_per_s / best.tokens_per_s,
                "ratio_oracle": mine.tokens_per_s / oracle.tokens_per_s,
                "k_share": mine.k_share,
            }
        overall = summarize(policy.name, all_episodes, self.k_max)
        n = len(by_workload)
        return EvalResult(
            timesteps=timesteps,
            tokens_per_s=overall.tokens_per_s,
            ratio_best_static=sum(w["ratio_best_static"] for w in by_workload.values()) / n,
            ratio_oracle=sum(w["ratio_oracle"] for w in by_workload.values()) / n,
            by_workload=by_workload,
            k_share=overall.k_share,
            step_k=[k for e in all_episodes for k in e.step_k],
        )
