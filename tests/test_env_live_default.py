"""The registered live env with default arguments: the small pair and the shipped profile."""

from __future__ import annotations

import gymnasium as gym
import pytest

import specrl  # noqa: F401  (registers the ids)


@pytest.mark.slow
def test_live_env_defaults_work_out_of_the_box():
    # force_profile: the shipped profile's freshness check times this machine, and a VM that
    # runs 15% off the profile's speed would refuse it (timing in a test; the check itself is
    # tested in test_profile.py). Everything else is the default.
    env = gym.make(
        "specrl/LiveSpec-v0", workload_kwargs={"n_requests": 4, "peak": 2}, force_profile=True
    )
    obs, _ = env.reset(seed=0)
    for k in (0, 4, 2):
        obs, reward, terminated, truncated, info = env.step(k)
    assert env.observation_space.contains(obs) and info["committed"] >= 1
