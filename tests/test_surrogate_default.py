"""The shipped default profile: gymnasium.make works with no setup, warning once elsewhere."""

from __future__ import annotations

import warnings

import gymnasium as gym

import specrl  # noqa: F401  (registers the ids)
from specrl.envs import surrogate
from specrl.profile import device_name, load_profile


def test_default_profile_is_a_measured_profile_of_the_small_pair():
    prof = load_profile(surrogate.default_profile_path())
    assert prof.meta["preset"] == "small"
    assert prof.fingerprint["device"].startswith("cpu: ")
    assert prof.k_max == 4 and prof.batch_sizes[-1] == 128
    assert set(prof.acceptance) == {"code", "prose", "hard"}
    assert prof.bands == ["greedy", "chat", "default"]


def test_make_with_no_arguments_warns_at_most_once(monkeypatch):
    monkeypatch.setattr(surrogate, "_warned_default_hardware", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = [gym.make("specrl/SurrogateSpec-v0") for _ in range(2)]
    ours = [w for w in caught if "default profile was measured on" in str(w.message)]
    here = device_name("cpu")
    measured_here = load_profile(surrogate.default_profile_path()).fingerprint["device"] == here
    assert len(ours) == (0 if measured_here else 1)
    obs, _ = envs[0].reset(seed=0)
    for k in (0, 4, 2):
        obs, reward, terminated, truncated, info = envs[0].step(k)
    assert envs[0].observation_space.contains(obs) and info["committed"] > 0
