"""Drifting request levels: the AR(1) Gaussian copula of specrl.profile.levels, its fit from
measured requests, and the surrogate that follows it."""

from __future__ import annotations

import numpy as np
import pytest

from specrl.envs import SurrogateSpecEnv
from specrl.profile.level_fit import _drift_statistics, fit_level_drift, simulate_requests
from specrl.profile.levels import drift, grid_index, level_grid
from specrl.profile.synthetic import linear_profile
from specrl.workload import preset_trace


def test_drift_keeps_z_standard_normal_and_decays_its_correlation_per_token():
    rng = np.random.default_rng(0)
    z0 = rng.standard_normal(200_000)
    z3 = drift(z0, 0.9, 3, rng)
    assert abs(z3.mean()) < 0.01
    assert z3.std() == pytest.approx(1.0, abs=0.01)
    assert np.corrcoef(z0, z3)[0, 1] == pytest.approx(0.9**3, abs=0.01)
    assert np.array_equal(drift(z0[:10], 1.0, 5, rng), z0[:10])  # phi = 1: a fixed level


def test_level_grid_reproduces_the_quantiles_and_scales_them():
    quantiles = np.linspace(-2.0, 2.0, 33) ** 3 / 2  # uneven gaps
    z = np.random.default_rng(2).standard_normal(400_000)
    levels = level_grid(quantiles)[grid_index(z)]
    probs = (np.arange(33) + 0.5) / 33
    assert np.quantile(levels, probs[1:-1]) == pytest.approx(quantiles[1:-1], abs=0.03)
    assert np.array_equal(level_grid(quantiles, 2.0), 2.0 * level_grid(quantiles))
    assert grid_index(np.array([-9.0, 0.0, 9.0])).tolist() == [0, 800, 1600]


def _measured(phi, scale, requests=400, tokens=120, seed=5):
    """Steps of ``requests`` requests of ``tokens`` tokens each at K=4, simulated with a known
    drift: rows of (request, bucket, drafted, accepted) in the order they ran."""
    rates = [[0.75, 0.7, 0.65, 0.6]]
    quantiles = np.linspace(-1.5, 1.5, 33)
    logits = np.log(np.array(rates) / (1 - np.array(rates)))
    grid = level_grid(quantiles, scale)
    rng = np.random.default_rng(seed)
    rows = simulate_requests(np.full(requests, tokens), logits, [], grid, phi, 0.0, rng)
    return rows, rates, quantiles


@pytest.mark.parametrize(("phi", "scale"), [(1.0, 1.0), (0.95, 1.5)])
def test_fit_level_drift_recovers_a_known_drift(phi, scale):
    """A fixed level is found fixed; a drifting one is found drifting, and the fit reproduces
    what can be observed of it (a faster drift with a wider spread looks alike, so the
    parameters themselves are not pinned): on fresh requests, the spread of accepted /
    drafted per request, its correlation between halves and the pooled rate."""
    rows, rates, quantiles = _measured(phi, scale)
    fit = fit_level_drift(rows, rates, quantiles, edges=[])
    if phi == 1.0:
        assert fit["per_token"] >= 0.99
        assert fit["scale"] <= 1.1
        assert abs(fit["shift"]) < 0.1
        return
    assert fit["per_token"] <= 0.97
    truth = _drift_statistics(_measured(phi, scale, requests=2000, seed=11)[0])
    logits = np.log(np.array(rates) / (1 - np.array(rates)))
    grid = level_grid(quantiles, fit["scale"])
    again = simulate_requests(
        np.full(2000, 120),
        logits,
        [],
        grid,
        fit["per_token"],
        fit["shift"],
        np.random.default_rng(12),
    )
    sd, corr, *_, pooled = _drift_statistics(again)
    assert sd == pytest.approx(truth[0], abs=0.015)
    assert corr == pytest.approx(truth[1], abs=0.08)
    assert pooled == pytest.approx(truth[4], abs=0.015)


def test_fit_level_drift_keeps_a_fixed_level_with_too_few_requests():
    rows, rates, quantiles = _measured(0.9, 1.0, requests=10)
    assert fit_level_drift(rows, rates, quantiles, edges=[]) == {
        "per_token": 1.0,
        "scale": 1.0,
        "shift": 0.0,
    }
    assert fit_level_drift(np.zeros((0, 4), dtype=np.int64), rates, quantiles)["per_token"] == 1.0


def _env(drift_fit=None, level_spread=1.0):
    prof = linear_profile(level_spread=level_spread)
    if drift_fit is not None:
        prof.level_drift = {
            d: {b: dict(drift_fit) for b in by} for d, by in prof.acceptance.items()
        }
    trace = preset_trace("steady-8", seed=0, n_requests=24, peak=8)
    return SurrogateSpecEnv(profile=prof, workload=trace, k_max=4, max_batch=8, max_len=384)


def _levels_over_time(env, seed=0):
    env.reset(seed=seed)
    seen, done = [], False
    while not done:
        seen.append(dict(zip(env._index[: env._n].tolist(), env._level[: env._n].tolist())))
        *_, terminated, truncated, _ = env.step(3)
        done = terminated or truncated
    return seen


def test_a_fixed_drift_simulates_exactly_as_no_drift():
    fixed = {"per_token": 1.0, "scale": 1.0, "shift": 0.0}
    assert _levels_over_time(_env(fixed)) == _levels_over_time(_env(None))


def test_levels_drift_within_a_request_only_with_a_drift():
    def changes(env):
        per_request: dict[int, set] = {}
        for step in _levels_over_time(env):
            for index, level in step.items():
                per_request.setdefault(index, set()).add(round(level, 9))
        return max(len(v) for v in per_request.values())

    assert changes(_env(None)) == 1
    assert changes(_env({"per_token": 0.9, "scale": 1.0, "shift": 0.0})) > 5


def _first_draft_outcomes(env, actions, seed=0) -> tuple[dict, dict]:
    """Per (request, output position) where a step drafted its first token: accepted or not;
    and per (request, tokens generated) the level the row decoded at."""
    env.reset(seed=seed)
    outcomes, levels, done, step = {}, {}, False, 0
    while not done:
        k = actions[step % len(actions)]
        n = env._n
        before = dict(zip(env._index[:n].tolist(), env._generated[:n].tolist(), strict=True))
        left = dict(zip(env._index[:n].tolist(), env._left[:n].tolist(), strict=True))
        *_, terminated, truncated, _ = env.step(k)
        done = terminated or truncated
        n = env._n
        for index, generated, level in zip(
            env._index[:n].tolist(), env._generated[:n].tolist(), env._level[:n].tolist()
        ):
            if k and index in before and left[index] >= 3:
                outcomes[index, before[index]] = generated - before[index] >= 2
                levels[index, before[index]] = level
        step += 1
    return outcomes, levels


@pytest.mark.parametrize("drift_fit", [None, {"per_token": 0.9, "scale": 1.0, "shift": 0.0}])
def test_a_token_is_as_easy_to_draft_whatever_k_the_steps_chose(drift_fit):
    # Common random numbers: a request's level at each token it generates and the draw its
    # draft token at each output position is accepted against are the episode's, not the
    # step's; K=1 and K=2 (every other step off) accept the same first draft tokens.
    ones, ones_levels = _first_draft_outcomes(_env(drift_fit), [1])
    twos, twos_levels = _first_draft_outcomes(_env(drift_fit), [2, 0])
    both = ones.keys() & twos.keys()
    assert len(both) > 100
    assert 0 < sum(ones[key] for key in both) < len(both)  # some accepted, some rejected
    assert all(ones[key] == twos[key] for key in both)
    assert all(ones_levels[key] == twos_levels[key] for key in both)


def test_the_oracle_reads_without_changing_the_episode():
    env = _env({"per_token": 0.9, "scale": 1.0, "shift": 0.0})

    def episode(ask_oracle: bool):
        env.reset(seed=3)
        done = False
        while not done:
            if ask_oracle:
                env.oracle_k()
            _, _, terminated, truncated, _ = env.step(2)
            done = terminated or truncated
        return env.episode_tokens, env.episode_seconds, env.episode_steps

    assert episode(True) == episode(False)
