"""The per-request acceptance estimate (``acceptance_estimate="requests"``): its posterior
against a per-row computation written out here, and what it leaves of the env unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from specrl.envs import SurrogateSpecEnv
from specrl.envs.base import ACCEPTANCE, STALENESS
from specrl.envs.request_acceptance import RequestAcceptance
from specrl.errors import SpecrlError
from specrl.features import conditional_acceptance


def _env(estimate: str, peak: int = 12) -> SurrogateSpecEnv:
    return SurrogateSpecEnv(
        workload="ramp",
        workload_kwargs={"peak": peak, "n_requests": 40},
        max_batch=peak,
        acceptance_estimate=estimate,
    )


class PerRowReference:
    """The estimate row by row, in plain loops: each request's runs kept as seen (read off the
    env's rows before and after each step), its posterior recomputed from them over the
    levels of every domain in its band, each domain's levels alike."""

    def __init__(self, env: SurrogateSpecEnv):
        self.env = env
        self.runs: dict[int, list[tuple[int, int, int]]] = {}  # request: (generated, acc, drafted)

    def rows(self) -> dict[int, tuple[int, int, int]]:
        e = self.env
        return {
            int(e._index[i]): (int(e._group[i]), int(e._generated[i]), int(e._left[i]))
            for i in range(e._n)
        }

    def record(self, before: dict, k: int) -> None:
        """Fold in the step just taken at ``k`` from the rows as they were ``before`` it."""
        if k == 0:
            return
        for request, (_, now, left) in self.rows().items():
            # A row not running before the step was admitted by it, then drafted at 1 token.
            generated = before[request][1] if request in before else 1
            committed = now - generated
            drafted = min(k, left + committed - 1)
            if drafted > 0:
                self.runs.setdefault(request, []).append((generated, committed - 1, drafted))

    def candidates(self, group: int) -> list[tuple[int, float, float]]:
        e = self.env
        band = e._groups[group][1]
        out = []
        for h, (_, b) in enumerate(e._groups):
            if b == band:
                out += [(h, float(level), 1.0 / len(e._levels[h])) for level in e._levels[h]]
        return out

    def rate(self, group: int, level: float, generated: int, position: int) -> float:
        logit = self.env._logits[group, generated, position] + level
        return 1.0 / (1.0 + np.exp(-logit))

    def curve(self, request: int | None, group: int, generated: int) -> np.ndarray:
        k_max = self.env.k_max
        weights, curves = [], []
        for h, level, prior in self.candidates(group):
            w = prior
            for at, accepted, drafted in self.runs.get(request, []):
                for j in range(accepted):
                    w *= self.rate(h, level, at, j)
                if accepted < drafted:
                    w *= 1.0 - self.rate(h, level, at, accepted)
            survive, c = 1.0, []
            for j in range(k_max):
                survive *= self.rate(h, level, generated, j)
                c.append(survive)
            weights.append(w)
            curves.append(c)
        weights = np.array(weights) / np.sum(weights)
        return weights @ np.array(curves)

    def estimate(self) -> float:
        e = self.env
        curves = [self.curve(r, g, gen) for r, (g, gen, _) in self.rows().items()]
        curves += [self.curve(None, int(g), 1) for g in e._incoming()[0]]
        pooled = np.mean(curves, axis=0)
        return conditional_acceptance(float(pooled.sum()) / e.k_max, e.k_max)


def test_the_observation_reads_each_requests_posterior_pooled_over_the_batch():
    """At every step of an episode whose K changes (rows admitted, drafting fewer than K
    near their end, K=0 steps), the observation's acceptance is the per-row computation's,
    and it is never stale."""
    env = _env("requests")
    reference = PerRowReference(env)
    obs, _ = env.reset(seed=3)
    ks = [4, 1, 0, 2, 3, 0, 0, 4]
    done, step, seen = False, 0, set()
    while not done:
        assert obs[ACCEPTANCE] == pytest.approx(reference.estimate(), rel=1e-5, abs=1e-6)
        assert obs[STALENESS] == 0.0
        seen.add(round(float(obs[ACCEPTANCE]), 3))
        k = ks[step % len(ks)]
        before = reference.rows()
        obs, _, done, _, _ = env.step(k)
        reference.record(before, k)
        step += 1
    assert len(seen) > 10 and len(reference.runs) > 20  # it moved, over many requests


def test_the_estimate_changes_what_is_observed_and_nothing_the_env_does():
    """The same seed and actions serve the same steps under either estimate: the posterior
    draws nothing from the env's random stream."""
    infos = {}
    for estimate in ("steps", "requests"):
        env = _env(estimate)
        env.reset(seed=11)
        out, done, t = [], False, 0
        while not done:
            _, reward, done, _, info = env.step([3, 0, 1, 4][t % 4])
            out.append((info["committed"], info["step_time_s"], info["accepted"], reward))
            t += 1
        infos[estimate] = out
    assert infos["steps"] == infos["requests"]


def test_a_requests_posterior_moves_toward_the_runs_it_accepted():
    """Two levels a band apart: a request that accepts every draft reads the high level's
    curve more, one that rejects every first draft the low one's, and one never seen reads
    the prior."""
    logits = np.zeros((2, 10, 3))
    levels = [np.array([-1.0, 1.0]), np.array([0.5])]

    def rates(group, level, generated, k):  # the surrogate's form, on these logits
        return 1.0 / (1.0 + np.exp(-(logits[group, generated, :k] + level[..., None])))

    posterior = RequestAcceptance(rates, 3, levels, ["chat", "chat"])
    posterior.start(3)
    for i in range(3):
        posterior.admit(i, 0)
    index, group = np.array([0, 1]), np.array([0, 0])
    for _ in range(3):
        posterior.observe(index, group, np.array([2, 2]), np.array([3, 0]), np.array([3, 3]))
    curves = posterior.curves(np.arange(3), np.zeros(3, dtype=np.int64), np.full(3, 4))
    sig = 1.0 / (1.0 + np.exp(-np.array([-1.0, 1.0, 0.5])))  # each candidate's rate
    # The prior: the two groups of the band alike, group 0's two levels alike within it.
    prior = [0.25 * sig[0] ** j + 0.25 * sig[1] ** j + 0.5 * sig[2] ** j for j in (1, 2, 3)]
    assert curves[2] == pytest.approx(prior)
    assert curves[0, 0] > curves[2, 0] > curves[1, 0]
    # Three runs of 3 accepted of 3 against three of 0: the likelihoods multiply.
    high, low, mid = sig[1], sig[0], sig[2]
    w = np.array([0.25 * (low**3) ** 3, 0.25 * (high**3) ** 3, 0.5 * (mid**3) ** 3])
    assert curves[0, 0] == pytest.approx((w / w.sum()) @ sig[[0, 1, 2]])
    assert posterior.estimate(np.array([], dtype=np.int64), group[:0], group[:0], group[:0]) is None


def test_the_estimate_is_checked_and_surrogate_only():
    from specrl.config import TrainConfig

    with pytest.raises(SpecrlError, match="acceptance_estimate must be one of steps, requests"):
        _env("ema")
    with pytest.raises(SpecrlError, match="computed by the surrogate only"):
        TrainConfig(env="live", n_envs=1, acceptance_estimate="requests")
    assert TrainConfig(acceptance_estimate="requests").acceptance_estimate == "requests"


def test_the_requests_env_passes_the_gymnasium_and_sb3_checkers():
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    gym_check(_env("requests"), skip_render_check=True)
    sb3_check(_env("requests"), warn=True)
