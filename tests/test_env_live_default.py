"""The registered live env with default arguments: the small pair and the shipped profile."""

from __future__ import annotations

import gymnasium as gym
import pytest

import specrl  # noqa: F401  (registers the ids)


@pytest.mark.slow
def test_live_env_defaults_work_out_of_the_box():
    # Where the shipped profile does not hold (another machine, or this one at another speed)
    # the env measures its reference rate here and warns (test_env_live_unprofiled.py).
    env = gym.make("specrl/LiveSpec-v0", workload_kwargs={"n_requests": 4, "peak": 2})
    obs, _ = env.reset(seed=0)
    for k in (0, 4, 2):
        obs, reward, terminated, truncated, info = env.step(k)
    assert env.observation_space.contains(obs) and info["committed"] >= 1
