"""What a policy achieved over its episodes: aggregate tokens/s (the objective), tokens/s per
batch bucket, the share of steps at each K and per-request TPOT, and which results are the
static policies and which "the engineer" (:mod:`specrl.policies.engineer`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from specrl.features import batch_bucket, bucket_bounds

_STATIC = re.compile(r"^(off|K=\d+)$")
"""Names of the static policies: off and the fixed Ks (not the threshold)."""
ENGINEER = ("threshold:tuned", "sweep")
"""The engineer's baselines: "the engineer" is the better of those that ran."""


@dataclass
class PolicyResult:
    policy: str
    tokens_per_s: float
    """Sum of tokens over sum of seconds, every episode."""
    bucket_tokens_per_s: dict[str, float]
    """By rows decoded per step (:func:`specrl.features.batch_bucket`); buckets no step
    reached are left out."""
    k_share: dict[str, float]
    """Share of steps at each K (``"0"`` .. ``"k_max"``)."""
    tpot_p50_s: float
    tpot_p99_s: float
    bucket_steps: dict[str, int] = field(default_factory=dict)
    """Steps in each bucket of ``bucket_tokens_per_s``, over all episodes: a rate from a
    handful of steps (a trace's drain at one row) says little."""
    episode_tokens_per_s: list[float] = field(default_factory=list)
    """Tokens/s of each episode, in seed order: every policy's episode ``i`` served the same
    trace, so ratios between policies pair up episode by episode."""
    episode_speed: list[float] = field(default_factory=list)
    """Live, with a profile: each episode's machine speed against it, in seed order
    (:func:`specrl.profile.speed.episode_speed`; NaN where no step qualified); empty
    otherwise."""
    episodes: list = field(default_factory=list, repr=False)
    """The :class:`~specrl.envs.EpisodeResult` of each episode (not written to files)."""

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "tokens_per_s": self.tokens_per_s,
            "bucket_tokens_per_s": self.bucket_tokens_per_s,
            "k_share": self.k_share,
            "tpot_p50_s": None if math.isnan(self.tpot_p50_s) else self.tpot_p50_s,
            "tpot_p99_s": None if math.isnan(self.tpot_p99_s) else self.tpot_p99_s,
            "bucket_steps": self.bucket_steps,
            "episode_tokens_per_s": self.episode_tokens_per_s,
            "episode_speed": [None if math.isnan(x) else x for x in self.episode_speed],
        }


def static_results(results: list[PolicyResult]) -> list[PolicyResult]:
    """Off and the fixed Ks among ``results``, in their order."""
    return [r for r in results if _STATIC.match(r.policy)]


def best_static(results: list[PolicyResult]) -> PolicyResult | None:
    """The best of off and the fixed Ks among ``results`` (None if none ran)."""
    return max(static_results(results), key=lambda r: r.tokens_per_s, default=None)


def engineer(results: list[PolicyResult]) -> PolicyResult | None:
    """The better of ``threshold:tuned`` and ``sweep`` among ``results`` (None if neither
    ran)."""
    tuned = [r for r in results if r.policy in ENGINEER]
    return max(tuned, key=lambda r: r.tokens_per_s, default=None)


def standard_error(ratios: list[float]) -> float:
    """The standard error of the mean per-episode log ratio (0 for one episode): a ratio
    that differs from 1 by much less than this is not measured by these episodes."""
    if len(ratios) < 2:
        return 0.0
    logs = np.log(ratios)
    return float(logs.std(ddof=1) / np.sqrt(len(logs)))


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile, NaN for no values."""
    return float(np.percentile(values, q)) if values else math.nan


def summarize(policy: str, episodes: list, k_max: int) -> PolicyResult:
    """A :class:`PolicyResult` from the policy's :class:`~specrl.envs.EpisodeResult` list."""
    tokens = sum(e.tokens for e in episodes)
    seconds = sum(e.seconds for e in episodes)
    by_bucket: dict[str, list[float]] = {}  # label: [tokens, seconds, steps]
    k_steps = [0] * (k_max + 1)
    steps = 0
    for e in episodes:
        for b, k, t, s in zip(e.step_batch, e.step_k, e.step_tokens, e.step_seconds):
            if b > 0:
                acc = by_bucket.setdefault(batch_bucket(b), [0.0, 0.0, 0])
                acc[0] += t
                acc[1] += s
                acc[2] += 1
            k_steps[k] += 1
            steps += 1
    tpot = [x for e in episodes for x in e.request_tpot_s]
    rated = [label for label in sorted(by_bucket, key=bucket_bounds) if by_bucket[label][1] > 0]
    return PolicyResult(
        policy=policy,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        bucket_tokens_per_s={label: by_bucket[label][0] / by_bucket[label][1] for label in rated},
        k_share={str(k): n / steps if steps else 0.0 for k, n in enumerate(k_steps)},
        bucket_steps={label: by_bucket[label][2] for label in rated},
        tpot_p50_s=_percentile(tpot, 50),
        tpot_p99_s=_percentile(tpot, 99),
        episode_tokens_per_s=[e.tokens_per_s for e in episodes],
        episodes=episodes,
    )
