"""The machine's speed per episode against a profile (specrl.profile.speed), and the note a
live comparison prints from it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specrl.compare import ComparisonReport, compare_policies
from specrl.envs import SurrogateSpecEnv
from specrl.envs.rollout import EpisodeResult, run_episode
from specrl.errors import SpecrlError
from specrl.policies import FixedK
from specrl.profile.costs import StepCosts
from specrl.profile.speed import episode_speed, speed_spread
from specrl.profile.synthetic import linear_profile
from specrl.results import PolicyResult
from specrl.workload import LengthDist

SMALL = {
    "n_requests": 24,
    "prompt_lengths": LengthDist(median=40, sigma=0.3, lo=8, hi=80),
    "output_lengths": LengthDist(median=40, sigma=0.3, lo=8, hi=80),
}
TIMES = (
    "verify_base_s",
    "verify_token_s",
    "verify_kv_s",
    "draft_base_s",
    "draft_row_s",
    "overhead_row_s",
)
DEFAULT_TIMES = (4e-3, 2e-4, 1e-7, 5e-4, 2e-5, 5e-5)


def _profile(scale: float = 1.0):
    """The linear profile with every step time (not prefill or catch-up) times ``scale``."""
    return linear_profile(
        k_max=3, **{name: t * scale for name, t in zip(TIMES, DEFAULT_TIMES, strict=True)}
    )


def _costs(profile) -> StepCosts:
    return StepCosts(profile, max_batch=8, max_len=256, k_max=3)


def _episode(steps) -> EpisodeResult:
    e = EpisodeResult(0, 0.0, len(steps), 0.0, 0.0)
    for batch, k, context, seconds, admitted, caught_up in steps:
        e.step_batch.append(batch)
        e.step_k.append(k)
        e.step_context.append(context)
        e.step_seconds.append(seconds)
        e.step_admitted.append(admitted)
        e.step_caught_up.append(caught_up)
    return e


def test_speed_is_decode_time_over_the_tables_on_steps_without_admissions():
    costs = _costs(_profile())
    table = [costs.seconds(4, 2, 100), costs.seconds(8, 0, 120)]
    episode = _episode(
        [
            (4, 2, 100, 1.3 * table[0], 0, False),
            (8, 0, 120, 1.3 * table[1], 0, False),
            (2, 1, 50, 9.0, 2, False),  # admitted requests: left out
            (8, 3, 130, 5.0, 0, True),  # caught up: left out
            (0, 0, 0, 0.4, 1, False),  # decoded nothing
        ]
    )
    assert episode_speed(episode, costs) == pytest.approx(1.3, rel=1e-12)
    # A step measured at the table's time moves the speed toward 1 by its weight.
    episode = _episode([(4, 2, 100, table[0], 0, False), (8, 0, 120, 2 * table[1], 0, False)])
    assert episode_speed(episode, costs) == pytest.approx(
        (table[0] + 2 * table[1]) / (table[0] + table[1]), rel=1e-12
    )


def test_speed_is_nan_without_a_qualifying_step_and_lists_must_match():
    costs = _costs(_profile())
    assert math.isnan(episode_speed(_episode([(2, 1, 50, 9.0, 1, False)]), costs))
    assert math.isnan(episode_speed(_episode([]), costs))
    broken = _episode([(4, 2, 100, 0.1, 0, False)])
    broken.step_caught_up.clear()
    with pytest.raises(ValueError):
        episode_speed(broken, costs)


def test_speed_spread():
    assert speed_spread([1.0, 1.2, 0.8]) == pytest.approx(0.5)
    assert speed_spread([1.1, math.nan]) == 0.0
    assert speed_spread([]) == 0.0


class _Cycle:
    """Plays ``ks`` over and over: K=0 runs, so the draft falls behind and catches up."""

    name = "cycle"

    def __init__(self, ks):
        self.ks, self.i = ks, 0

    def predict(self, obs, episode_start=None, deterministic=True):
        k = self.ks[self.i % len(self.ks)]
        self.i += 1
        return np.array(k), None


def _surrogate(profile):
    return SurrogateSpecEnv(
        profile=profile,
        workload="steady-8",
        workload_kwargs=SMALL,
        max_batch=8,
        max_len=256,
        k_max=3,
    )


def test_a_surrogate_episode_reads_its_own_profiles_speed_and_a_faster_profiles_ratio():
    profile = _profile()
    episode = run_episode(_surrogate(profile), _Cycle([0, 0, 0, 3, 2]), seed=1)
    assert len(episode.step_context) == len(episode.step_caught_up) == episode.steps
    assert any(episode.step_caught_up)  # the draft caught up after the K=0 runs
    assert any(episode.step_admitted)
    assert max(episode.step_context) > 0
    own = episode_speed(episode, _costs(profile))
    assert 0.97 < own < 1.05  # the surrogate's steps are its profile's, with 5% log noise
    # Read against a profile of a machine 1.25x as fast, the same episode ran 1.25x slower.
    fast = episode_speed(episode, _costs(_profile(1 / 1.25)))
    assert fast / own == pytest.approx(1.25, rel=1e-9)
    # With the steps that caught up, the step times would read slower than the profile.
    clean = [i for i, a in enumerate(episode.step_admitted) if not a and episode.step_batch[i]]
    costs = _costs(profile)
    raw = sum(episode.step_seconds[i] for i in clean) / sum(
        costs.seconds(episode.step_batch[i], episode.step_k[i], episode.step_context[i])
        for i in clean
    )
    assert raw > own


def test_compare_policies_times_each_episode_against_the_speed_profile():
    profile = _profile()
    env = _surrogate(profile)
    report = compare_policies(
        env, [FixedK(0), FixedK(2)], episodes=2, progress=False, speed_profile=_profile(0.5)
    )
    for r in report.results:
        assert len(r.episode_speed) == 2
        assert all(1.9 < s < 2.1 for s in r.episode_speed)  # twice the fast profile's times
        assert r.to_json()["episode_speed"] == r.episode_speed
    assert "machine speed per episode" in report.format()
    plain = compare_policies(env, [FixedK(0)], episodes=1, progress=False)
    assert plain.results[0].episode_speed == [] and plain.speed_note() is None
    with pytest.raises(SpecrlError, match="k_max is 2, below the env's 3"):
        compare_policies(
            env, [FixedK(0)], episodes=1, progress=False, speed_profile=linear_profile(k_max=2)
        )


def _result(name: str, tokens_per_s: float, speeds: list[float]) -> PolicyResult:
    return PolicyResult(
        name,
        tokens_per_s,
        {},
        {},
        0.0,
        0.0,
        episode_tokens_per_s=[tokens_per_s] * len(speeds),
        episode_speed=speeds,
    )


def test_the_note_says_when_the_machine_moved_more_than_the_policies_differ():
    drifting = ComparisonReport(
        "live",
        "mixed",
        0,
        2,
        [_result("off", 500.0, [1.0, 1.3]), _result("K=2", 510.0, [1.1, math.nan])],
    )
    note = drifting.speed_note()
    assert note.startswith("machine speed per episode")
    assert "off 1.00-1.30, K=2 1.10" in note
    assert "up to 30% apart, more than the policies' tokens/s differ (2.0%)" in note
    steady = ComparisonReport(
        "live",
        "mixed",
        0,
        2,
        [_result("off", 500.0, [1.0, 1.01]), _result("K=2", 550.0, [1.0, 1.02])],
    )
    note = steady.speed_note()
    assert "up to 2% apart" in note and "more than" not in note
    assert steady.results[0].to_json()["episode_speed"] == [1.0, 1.01]
    nan = _result("off", 500.0, [math.nan])
    assert nan.to_json()["episode_speed"] == [None]


def test_side_by_side_the_note_reads_the_spread_within_each_episode():
    def report(first: list[float], second: list[float]) -> ComparisonReport:
        results = [_result("off", 500.0, first), _result("K=2", 505.0, second)]
        return ComparisonReport("live", "mixed", 0, 2, results, interleaved=True)

    steady = report([1.0, 1.3], [1.01, 1.313]).speed_note()
    assert steady.endswith(
        "one policy's episodes up to 30% apart; side by side, the policies in one episode up "
        "to 1.0% apart"
    )
    uneven = report([1.0, 1.3], [1.05, 1.3]).speed_note()
    assert uneven.endswith(
        "side by side, the policies in one episode up to 5.0% apart, more than the policies' "
        "tokens/s differ (1.0%): the machine, or the profile's error where their K differ, "
        "moved them apart; compare with more episodes"
    )
