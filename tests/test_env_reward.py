"""The return ranks policies like aggregate goodput, sum(tokens) / sum(time), even where the
mean of per-step tokens/s ranks them the other way round."""

from __future__ import annotations

import pytest

from specrl.envs import SurrogateSpecEnv, run_episode
from specrl.policies import BatchThreshold, FixedK
from specrl.profile.synthetic import linear_profile
from specrl.workload import preset_trace


@pytest.fixture(scope="module")
def results():
    trace = preset_trace("ramp", seed=0, n_requests=64, peak=16)
    env = SurrogateSpecEnv(profile=linear_profile(time_log_sigma=0.0), workload=trace, max_batch=16)
    policies = [FixedK(0), FixedK(1), FixedK(2), FixedK(4), BatchThreshold(2, 4, 16)]
    return trace, env, {p.name: run_episode(env, p, seed=0) for p in policies}


def test_mean_of_step_rates_and_aggregate_goodput_disagree_here(results):
    _, _, r = results
    k1, threshold = r["K=1"], r["K=2 if B<=4"]
    assert k1.tokens_per_s > threshold.tokens_per_s
    assert k1.mean_step_tokens_per_s < threshold.mean_step_tokens_per_s


def test_return_ranks_like_aggregate_goodput(results):
    _, _, r = results
    assert r["K=1"].episode_return > r["K=2 if B<=4"].episode_return
    by_return = sorted(r, key=lambda name: r[name].episode_return)
    by_goodput = sorted(r, key=lambda name: r[name].tokens_per_s)
    assert by_return == by_goodput


def test_return_is_fixed_work_minus_reference_rate_times_time(results):
    trace, env, r = results
    for result in r.values():
        assert result.tokens == trace.total_tokens
        expected = (trace.total_tokens - env.reference_tokens_per_s * result.seconds) / 16
        assert result.episode_return == pytest.approx(expected, rel=1e-9)


# ---------------------------------------------------------------------- mutation gaps


def test_step_acceptance_is_the_estimate_observed_after_each_step(results):
    _, env, r = results
    result = run_episode(env, FixedK(2), seed=0)
    assert result.step_acceptance == r["K=2"].step_acceptance
    assert result.step_acceptance[-1] == pytest.approx(env.acceptance.estimate, rel=1e-6)
    assert min(result.step_acceptance) > 0.0  # every step drafted: measured, never stale
