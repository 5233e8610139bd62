"""The per-request acceptance estimate (``acceptance_estimate="requests"``): its posterior
against a per-row computation written out here, and what it leaves of the env unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from specrl.envs import LiveSpecEnv, SurrogateSpecEnv
from specrl.envs.base import ACCEPTANCE, STALENESS
from specrl.envs.request_acceptance import RequestAcceptance, acceptance_logits
from specrl.errors import SpecrlError
from specrl.features import conditional_acceptance
from specrl.profile import pair_fingerprint
from specrl.profile.synthetic import linear_profile
from specrl.workload import LengthDist, temperature_band


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
        self.groups, self.levels, self.logits = env._groups, env._levels, env._logits
        self.k_max = env.k_max

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
        band = self.groups[group][1]
        out = []
        for h, (_, b) in enumerate(self.groups):
            if b == band:
                out += [(h, float(level), 1.0 / len(self.levels[h])) for level in self.levels[h]]
        return out

    def rate(self, group: int, level: float, generated: int, position: int) -> float:
        logit = self.logits[group, generated, position] + level
        return 1.0 / (1.0 + np.exp(-logit))

    def curve(self, request: int | None, group: int, generated: int) -> np.ndarray:
        k_max = self.k_max
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

    def incoming(self) -> list[int]:
        """The groups of the requests the coming step admits and decodes."""
        return [int(g) for g in self.env._incoming()[0]]

    def incoming_left(self) -> list[int]:
        """The tokens left of the requests the coming step admits, after their first."""
        return [int(n) for n in self.env._incoming()[2]]

    def estimate(self, usable: bool = False) -> float:
        rows = self.rows()
        curves = [self.curve(r, g, gen) for r, (g, gen, _) in rows.items()]
        curves += [self.curve(None, g, 1) for g in self.incoming()]
        if usable:  # a row with n tokens left drafts at most n - 1
            lefts = [left for _, _, left in rows.values()] + self.incoming_left()
            curves = [
                [c[j] if j < n - 1 else 0.0 for j in range(len(c))] for c, n in zip(curves, lefts)
            ]
        pooled = np.mean(curves, axis=0)
        return conditional_acceptance(float(pooled.sum()) / self.k_max, self.k_max)


@pytest.mark.parametrize("estimate", ["requests", "usable"])
def test_the_observation_reads_each_requests_posterior_pooled_over_the_batch(estimate):
    """At every step of an episode whose K changes (rows admitted, drafting fewer than K
    near their end, K=0 steps), the observation's acceptance is the per-row computation's
    (``usable``: each row's curve cut where its tokens left end), and it is never stale."""
    env = _env(estimate)
    reference = PerRowReference(env)
    seen, cut = walk_against(reference, env, 3, [4, 1, 0, 2, 3, 0, 0, 4], estimate == "usable")
    assert seen > 10 and len(reference.runs) > 20  # it moved, over many requests
    assert cut  # rows near their end moved the usable figure away from the plain one


def walk_against(reference, env, seed: int, ks: list[int], usable: bool) -> tuple[int, bool]:
    """Play one episode of ``env`` at the Ks ``ks`` in turn, asserting at every step that the
    observation is ``reference``'s estimate and never stale. Returns how many distinct
    figures it showed, and whether cutting rows at their tokens left ever moved it."""
    obs, _ = env.reset(seed=seed)
    done, step, seen, cut = False, 0, set(), False
    while not done:
        expected = reference.estimate(usable)
        assert obs[ACCEPTANCE] == pytest.approx(expected, rel=1e-5, abs=1e-6)
        assert obs[STALENESS] == 0.0
        cut |= abs(reference.estimate(not usable) - expected) > 1e-4
        seen.add(round(float(obs[ACCEPTANCE]), 4))
        before = reference.rows()
        obs, _, done, _, _ = env.step(ks[step % len(ks)])
        reference.record(before, ks[step % len(ks)])
        step += 1
    return len(seen), cut


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
    logits = np.zeros((2, 1, 3))  # one bucket of tokens generated
    levels = [np.array([-1.0, 1.0]), np.array([0.5])]
    posterior = RequestAcceptance(logits, [], 3, levels, ["chat", "chat"])
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


def test_the_estimate_is_checked_by_name_in_both_envs_and_the_config():
    from specrl.config import TrainConfig

    with pytest.raises(
        SpecrlError, match="acceptance_estimate must be one of steps, requests, usable"
    ):
        _env("ema")
    with pytest.raises(
        SpecrlError, match="acceptance_estimate must be one of steps, requests, usable"
    ):
        LiveSpecEnv(pair=object(), reference_tokens_per_s=1.0, acceptance_estimate="ema")
    live = TrainConfig(env="live", n_envs=1, acceptance_estimate="requests")
    assert live.acceptance_estimate == "requests"
    assert TrainConfig(acceptance_estimate="requests").acceptance_estimate == "requests"


# ---------------------------------------------------------------------- the live env

LIVE_TRACE = {
    "n_requests": 14,
    "prompt_lengths": LengthDist(median=12, sigma=0.3, lo=4, hi=20),
    "output_lengths": LengthDist(median=10, sigma=0.4, lo=2, hi=16),
}


def _micro_profile(micro_pair, **kwargs):
    """A profile of the micro pair's weights whose requests' levels spread (so posteriors
    move), its acceptance the synthetic profile's."""
    profile = linear_profile(k_max=3, level_spread=1.0, **kwargs)
    profile.fingerprint = pair_fingerprint(micro_pair, k_max=3)
    return profile


def _live_kwargs(micro_pair, profile, **kwargs) -> dict:
    """A small live env's arguments, on the per-request estimate unless told otherwise."""
    return {
        "pair": micro_pair,
        "workload": "steady-4",
        "workload_kwargs": LIVE_TRACE,
        "max_batch": 4,
        "max_len": 64,
        "k_max": 3,
        "reference_tokens_per_s": 100.0,
        "profile": profile,
        "acceptance_estimate": "requests",
        **kwargs,
    }


def _live(micro_pair, profile, **kwargs) -> LiveSpecEnv:
    return LiveSpecEnv(**_live_kwargs(micro_pair, profile, **kwargs))


class LiveReference(PerRowReference):
    """The per-row computation on the live engine: the rows the coming step decodes read
    from its running batch and queue, each request's runs from its tokens generated before
    and after each step (not from the step's per-row statistics, which the env reads)."""

    def __init__(self, env: LiveSpecEnv, profile):
        self.env, self.runs, self.k_max = env, {}, env.k_max
        self.groups = [(d, b) for d in ("code", "prose", "hard") for b in profile.bands]
        self.logits, self.levels = acceptance_logits(profile, self.groups, env.max_len, 3)

    def group(self, index: int) -> int:
        r = self.env.trace.requests[index]
        return self.groups.index((r.domain, temperature_band(r.temperature)))

    def rows(self) -> dict[int, tuple[int, int, int]]:
        e = self.env
        out = {}
        for rid, generated in e.engine.running_rows():
            index = e._trace_index[rid]
            left = e.trace.requests[index].max_new_tokens - generated
            out[index] = (self.group(index), generated, left)
        return out

    def incoming(self) -> list[int]:
        e = self.env
        free = e.max_batch - e.engine.num_running
        waiting = e.engine.waiting_rows()[:free]
        return [self.group(e._trace_index[rid]) for rid, new in waiting if new > 1]

    def incoming_left(self) -> list[int]:
        e = self.env
        free = e.max_batch - e.engine.num_running
        return [new - 1 for _, new in e.engine.waiting_rows()[:free] if new > 1]


@pytest.mark.parametrize("estimate", ["requests", "usable"])
def test_the_live_env_reads_each_requests_posterior_from_the_engines_runs(micro_pair, estimate):
    """Live, at every step of an episode whose K changes, the observation's acceptance is the
    per-row computation over the engine's running rows and the requests its next step
    admits, from the runs each request showed; it is never stale."""
    profile = _micro_profile(micro_pair)
    env = _live(micro_pair, profile, acceptance_estimate=estimate)
    reference = LiveReference(env, profile)
    seen, cut = walk_against(reference, env, 5, [3, 1, 0, 2, 3, 3, 0], estimate == "usable")
    assert seen > 5 and len(reference.runs) >= 8  # it moved, over many requests
    assert cut  # short outputs: rows near their end move the usable figure


def test_the_live_requests_env_passes_the_gymnasium_and_sb3_checkers(micro_pair):
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    import specrl  # noqa: F401  (registers the ids)

    profile = _micro_profile(micro_pair)
    made = gym.make("specrl/LiveSpec-v0", **_live_kwargs(micro_pair, profile))
    assert made.spec.nondeterministic  # measured step times
    gym_check(made.unwrapped, skip_render_check=True)
    sb3_check(_live(micro_pair, profile), warn=True)


def test_the_live_estimate_needs_a_profile_of_the_pair_and_of_the_traces_groups(micro_pair):
    other = _micro_profile(micro_pair)
    other.fingerprint = {**other.fingerprint, "draft_sha256": "0" * 64}
    with pytest.raises(SpecrlError, match="its draft weights differ from this pair's"):
        _live(micro_pair, other)
    code_only = _micro_profile(micro_pair, acceptance={"code": [0.8, 0.7, 0.6]})
    with pytest.raises(SpecrlError, match=r"\('prose', '[a-z]+'\).*no acceptance for"):
        _live(micro_pair, code_only).reset(seed=0)  # the default mix draws every domain


def test_the_requests_env_passes_the_gymnasium_and_sb3_checkers():
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    gym_check(_env("requests"), skip_render_check=True)
    sb3_check(_env("requests"), warn=True)
