"""LiveSpecEnv on the micro pair: checkers, reproducibility in all but times, fixed work."""

from __future__ import annotations

import math
import warnings

import gymnasium as gym
import pytest

import specrl  # noqa: F401  (registers the ids)
from specrl.envs import LiveSpecEnv, run_episode
from specrl.errors import SpecrlError
from specrl.policies import FixedK
from specrl.profile import pair_fingerprint
from specrl.profile.synthetic import linear_profile
from specrl.workload import LengthDist, preset_trace

TINY = {
    "n_requests": 4,
    "prompt_lengths": LengthDist(median=12, sigma=0.3, lo=4, hi=20),
    "output_lengths": LengthDist(median=10, sigma=0.3, lo=4, hi=16),
}


def _env(micro_pair, **kwargs) -> LiveSpecEnv:
    kwargs.setdefault("workload", "steady-2")
    kwargs.setdefault("workload_kwargs", TINY)
    kwargs.setdefault("max_batch", 2)
    kwargs.setdefault("max_len", 64)
    kwargs.setdefault("k_max", 3)
    kwargs.setdefault("reference_tokens_per_s", 100.0)
    return LiveSpecEnv(pair=micro_pair, **kwargs)


@pytest.fixture(scope="module")
def streams(micro_pair):
    from specrl.workload.prompts import token_streams

    return token_streams(micro_pair.tokenizer)


def test_gymnasium_check_env(micro_pair, streams):
    from gymnasium.utils.env_checker import check_env

    env = gym.make(
        "specrl/LiveSpec-v0",
        pair=micro_pair,
        streams=streams,
        workload="steady-2",
        workload_kwargs=TINY,
        max_batch=2,
        max_len=64,
        k_max=3,
        reference_tokens_per_s=100.0,
    )
    assert env.spec.nondeterministic  # measured step times
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_sb3_check_env(micro_pair, streams):
    from stable_baselines3.common.env_checker import check_env

    env = _env(micro_pair, streams=streams)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, warn=True)


def _play(env, seed, actions):
    obs, _ = env.reset(seed=seed)
    rows = [obs[[0, 1, 2, 3, 6]].tolist()]
    for a in actions:
        obs, _, terminated, _, info = env.step(a)
        stats = env.last_stats
        rows.append(
            (
                obs[[0, 1, 2, 3, 5, 6]].tolist(),
                info["committed"],
                stats.drafted,
                stats.accepted_per_position,
                stats.batch_size,
                terminated,
            )
        )
        if terminated:
            break
    return rows


def test_reproducible_in_everything_but_measured_times(micro_pair, streams):
    actions = [3, 0, 0, 2, 1, 3, 0, 3] * 10
    first = _play(_env(micro_pair, streams=streams), 5, actions)
    again = _play(_env(micro_pair, streams=streams), 5, actions)
    assert first == again
    assert first[-1][-1] is True


def test_every_policy_commits_exactly_the_trace_tokens(micro_pair, streams):
    env = _env(micro_pair, streams=streams)
    trace = preset_trace("steady-2", seed=3, peak=2, **TINY)
    for policy in (FixedK(0), FixedK(3)):
        result = run_episode(env, policy, options={"trace": trace})
        assert result.tokens == trace.total_tokens
        assert result.seconds > 0


def test_profile_from_elsewhere_is_refused_unless_forced(micro_pair, streams):
    other = linear_profile(k_max=3)
    other.fingerprint = {**pair_fingerprint(micro_pair, k_max=3), "device": "cuda: elsewhere"}
    with pytest.raises(SpecrlError, match=r"other hardware or another model pair.*--force") as e:
        _env(micro_pair, streams=streams, reference_tokens_per_s=None, profile=other)
    # The command that measures this pair (loaded by path), not the default small one.
    t, d = micro_pair.target_path, micro_pair.draft_path
    assert f"with `specrl profile --target {t} --draft {d} --out PROFILE.json`" in str(e.value)
    with pytest.warns(UserWarning, match="other hardware"):
        env = _env(
            micro_pair,
            streams=streams,
            reference_tokens_per_s=None,
            profile=other,
            force_profile=True,
            check_profile=False,
        )
    assert env.reference_tokens_per_s == pytest.approx(other.plain_decode_tokens_per_s)
    matching = linear_profile(k_max=3)
    matching.fingerprint = pair_fingerprint(micro_pair, k_max=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _env(
            micro_pair,
            streams=streams,
            reference_tokens_per_s=None,
            profile=matching,
            check_profile=False,
        )


def test_stale_profile_is_refused_unless_forced(micro_pair, streams):
    """Same fingerprint, but step times 100x off what this machine does now: the freshness
    check times a few cells and refuses, naming the command that re-measures."""
    stale = linear_profile(k_max=3, verify_base_s=0.4, verify_token_s=0.02)
    stale.fingerprint = pair_fingerprint(micro_pair, k_max=3)
    args = {"streams": streams, "reference_tokens_per_s": None, "profile": stale}
    with pytest.raises(
        SpecrlError,
        match=r"differ from the profile's.*specrl profile --target .* --out PROFILE.json",
    ):
        _env(micro_pair, **args)
    with pytest.warns(UserWarning, match=r"differ from the profile's beyond their tolerance"):
        _env(micro_pair, force_profile=True, **args)


def test_bad_arguments_name_the_field(micro_pair, streams):
    short = linear_profile(k_max=2)
    short.fingerprint = pair_fingerprint(micro_pair, k_max=2)
    with pytest.raises(SpecrlError, match=r"k_max is 2 but the engine uses k_max=3"):
        _env(micro_pair, streams=streams, reference_tokens_per_s=None, profile=short)
    with pytest.raises(SpecrlError, match=r"max_len=4096 exceeds .*max_position_embeddings"):
        _env(micro_pair, streams=streams, max_len=4096)
    with pytest.raises(SpecrlError, match=r"needs \d+ tokens .* max_len is 20"):
        _env(micro_pair, streams=streams, max_len=20, workload=preset_trace("steady-2", **TINY))


def test_close_frees_the_engine_and_a_reset_builds_a_new_one(micro_pair, streams):
    env = _env(micro_pair, streams=streams)
    trace = preset_trace("steady-2", seed=3, peak=2, **TINY)
    first = run_episode(env, FixedK(3), seed=0, options={"trace": trace})
    assert env.engine is not None
    env.close()
    assert env.engine is None
    again = run_episode(env, FixedK(3), seed=0, options={"trace": trace})
    assert env.engine is not None
    assert again.tokens == first.tokens == trace.total_tokens
    assert again.step_tokens == first.step_tokens and again.step_k == first.step_k


def test_info_carries_each_steps_context_and_catch_up(micro_pair, streams):
    """What a live episode's machine speed is read from (specrl.profile.speed): the engine's
    own figures for each step."""
    env = _env(micro_pair, streams=streams)
    env.reset(seed=2)
    caught_up = 0
    for a in [0, 0, 0, 3, 2] * 10:
        _, _, terminated, _, info = env.step(a)
        stats = env.last_stats
        assert info["caught_up"] == (stats.catchup_tokens > 0)
        assert info["admitted"] == stats.admitted
        assert info["context"] == float(stats.max_context)
        caught_up += info["caught_up"]
        if terminated:
            break
    assert caught_up > 0  # the draft read what it skipped during the K=0 steps
    # Live steps that admitted nothing and caught nothing up exist, so a live episode reads
    # a speed against a profile (the engine times its prefill and catch-up phases on every
    # step, so their times are never 0 and cannot be the test).
    from specrl.envs.rollout import run_episode as play
    from specrl.profile.costs import StepCosts
    from specrl.profile.speed import episode_speed

    episode = play(env, FixedK(2), seed=3)
    costs = StepCosts(linear_profile(k_max=3), max_batch=2, max_len=64, k_max=3)
    assert 0 < episode_speed(episode, costs) < math.inf
