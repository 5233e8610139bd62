"""The live env where the shipped profile does not hold: it measures its reward's reference rate
here, warns once, and still refuses a mismatching profile the user passed."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest

import specrl  # noqa: F401  (registers the ids)
import specrl.envs.live as live
from specrl.envs.surrogate import default_profile_path
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.profile.freshness import CellCheck, FreshnessReport
from specrl.profile.schema import load_profile

SMALL_WORKLOAD = {"workload_kwargs": {"n_requests": 4, "peak": 2}, "max_batch": 2}
MEASURED = "reference rate was measured on this machine"


def _measure_spy(monkeypatch) -> list[float]:
    """Record every rate ``measure_plain_decode_tokens_per_s`` returns."""
    rates: list[float] = []
    measure = live.measure_plain_decode_tokens_per_s

    def spy(*args, **kwargs):
        rates.append(measure(*args, **kwargs))
        return rates[-1]

    monkeypatch.setattr(live, "measure_plain_decode_tokens_per_s", spy)
    return rates


def _specrl_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, SpecrlWarning)]


@pytest.fixture(scope="module")
def shipped():
    return load_profile(default_profile_path())


@pytest.fixture(scope="module")
def elsewhere(shipped):
    """``gymnasium.make("specrl/LiveSpec-v0")`` with the default pair (loaded once, passed so
    that gymnasium's checker can make it again cheaply) and the default profile, on a machine
    whose name is not the profile's (for the whole module); with the warnings it gave and the
    rates it measured."""
    from specrl.models.pair import load_default_pair

    pair = load_default_pair()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("specrl.profile.fingerprint.device_name", lambda device="cpu": "cpu: Other x3")
        rates = _measure_spy(mp)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = gym.make("specrl/LiveSpec-v0", pair=pair, **SMALL_WORKLOAD)
        yield env, _specrl_warnings(caught), rates
        env.close()


def test_mismatching_shipped_profile_is_replaced_by_a_measured_reference(elsewhere, shipped):
    env, said, rates = elsewhere
    assert len(said) == 1, said
    assert MEASURED in said[0] and "'cpu: Other x3'" in said[0]
    assert len(rates) == 1 and rates[0] > 0
    assert f"{rates[0]:.1f} tokens/s" in said[0]
    assert env.unwrapped.reference_tokens_per_s == rates[0]
    assert env.unwrapped.reference_tokens_per_s != shipped.plain_decode_tokens_per_s


def test_gymnasium_check_env(elsewhere):
    from gymnasium.utils.env_checker import check_env

    env = elsewhere[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The checker makes the env again from its spec, which measures and says so again.
        warnings.filterwarnings("ignore", "LiveSpecEnv: the shipped profile", SpecrlWarning)
        check_env(env.unwrapped)


def test_sb3_check_env(elsewhere):
    from stable_baselines3.common.env_checker import check_env

    env = elsewhere[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, warn=True)


def test_a_mismatching_profile_passed_explicitly_is_still_refused(elsewhere, monkeypatch):
    monkeypatch.setattr("specrl.profile.fingerprint.device_name", lambda device="cpu": "cpu: Z x3")
    rates = _measure_spy(monkeypatch)
    pair = elsewhere[0].unwrapped.pair
    with pytest.raises(SpecrlError, match=r"other hardware or another model pair.*--force"):
        gym.make("specrl/LiveSpec-v0", pair=pair, profile=default_profile_path(), **SMALL_WORKLOAD)
    assert rates == []


def _shipped_fingerprint_with_other_threads(monkeypatch, shipped) -> None:
    """The shipped profile's own fingerprint but for torch's thread count: compatible, with a
    warning that timings may have shifted."""
    here = {**shipped.fingerprint, "threads": shipped.fingerprint["threads"] + 1}
    monkeypatch.setattr(live, "pair_fingerprint", lambda *args, **kwargs: here)


def _freshness_reads(monkeypatch, ratio: float) -> None:
    """The freshness check reads each step ``ratio`` times the profile's, without timing."""
    cell = CellCheck(batch=1, k=0, profile_s=0.01, measured_s=0.01 * ratio, context=40.0)
    report = FreshnessReport(cells=[cell])
    monkeypatch.setattr("specrl.profile.freshness.check_freshness", lambda *a, **k: report)


def _micro_env(micro_pair):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = live.LiveSpecEnv(pair=micro_pair, max_batch=2, max_len=64, k_max=3)
    return env, _specrl_warnings(caught)


def test_stale_shipped_profile_is_replaced_by_a_measured_reference(
    micro_pair, shipped, monkeypatch
):
    _shipped_fingerprint_with_other_threads(monkeypatch, shipped)
    _freshness_reads(monkeypatch, 2.0)
    rates = _measure_spy(monkeypatch)
    env, said = _micro_env(micro_pair)
    # One warning: the threads warning is held back, the profile it is about is not used.
    assert len(said) == 1, said
    assert MEASURED in said[0]
    assert "step times here differ from the profile's beyond their tolerance" in said[0]
    assert "100% off; tolerance 15%" in said[0]
    assert env.reference_tokens_per_s == rates[0] > 0


def test_fresh_shipped_profile_gives_the_reference_and_its_fingerprint_warnings(
    micro_pair, shipped, monkeypatch
):
    _shipped_fingerprint_with_other_threads(monkeypatch, shipped)
    _freshness_reads(monkeypatch, 1.05)
    rates = _measure_spy(monkeypatch)
    env, said = _micro_env(micro_pair)
    assert rates == []
    assert env.reference_tokens_per_s == shipped.plain_decode_tokens_per_s
    assert len(said) == 1 and "threads differ" in said[0], said
