"""The engineer's baselines: ``threshold:tuned`` and ``sweep``, tuned in the surrogate on
seeds apart from the evaluation's, and rated against in ``specrl compare``."""

from __future__ import annotations

import numpy as np
import pytest

from specrl.compare import compare_policies
from specrl.envs import SurrogateSpecEnv
from specrl.errors import SpecrlError
from specrl.policies import default_policies, make_policies, make_policy, parse_policies
from specrl.policies.engineer import (
    TUNE_EPISODES,
    TUNE_SEED,
    fill_unreached,
    sweep_buckets,
    threshold_candidates,
    tuning_env,
    vllm_entries,
)
from specrl.profile.synthetic import linear_profile


def _env(workload="ramp", **kwargs):
    kwargs.setdefault("workload_kwargs", {"n_requests": 20, "peak": 8})
    return SurrogateSpecEnv(
        profile=linear_profile(), workload=workload, max_batch=8, k_max=3, **kwargs
    )


def test_tuned_threshold_is_the_best_threshold_on_the_tuning_seeds():
    env = _env()
    policy = make_policy("threshold:tuned", env=env)
    assert policy.name == "threshold:tuned"
    assert policy.tuning.seeds == list(range(TUNE_SEED, TUNE_SEED + TUNE_EPISODES))
    # Independently: every candidate as a plain threshold, through compare on those seeds.
    specs = [f"threshold:{k}:{b}" for k, b in threshold_candidates(3, 8)]
    assert len(specs) == 3 * 3  # B in 2, 4 (the grid below 8) and 8 itself
    report = compare_policies(
        env,
        make_policies(specs, env=env),
        seed=TUNE_SEED,
        episodes=TUNE_EPISODES,
        progress=False,
    )
    best = max(report.results, key=lambda r: r.tokens_per_s)
    assert best.policy == f"K={policy.k} if B<={policy.max_spec_batch}"
    assert policy.tuning.tokens_per_s == pytest.approx(best.tokens_per_s)
    assert policy.tuning.episodes == len(specs) * TUNE_EPISODES
    assert policy.tuning.surrogate_s > 0
    assert "tuned on seeds 50000-50001 of ramp" in policy.tuning.describe()


def test_sweep_takes_each_buckets_best_static_k():
    env = _env()
    policy = make_policy("sweep", env=env)
    report = compare_policies(
        env,
        make_policies(["off", "fixed:1", "fixed:2", "fixed:3"], env=env),
        seed=TUNE_SEED,
        episodes=TUNE_EPISODES,
        progress=False,
    )
    best = report.best_static_by_bucket()
    assert set(best) == {"1", "2-4", "5-8"}
    for label, name in best.items():
        lo, _, hi = label.partition("-")
        for batch in range(int(lo), int(hi or lo) + 1):
            want = 0 if name == "off" else int(name.removeprefix("K="))
            assert policy.k_for(batch) == want, (label, batch)
    assert policy.entries == vllm_entries(policy.table[:, 0])
    assert policy.tuning.episodes == 4 * TUNE_EPISODES + TUNE_EPISODES  # each K, then itself


def test_a_bucket_no_run_reached_takes_its_neighbours_k():
    # steady-1 decodes one row at a time: buckets 2-4 and 5-8 are never reached.
    env = _env(workload="steady-1", workload_kwargs={"n_requests": 6, "peak": 8})
    policy = make_policy("sweep", env=env)
    assert [policy.k_for(b) for b in range(1, 9)] == [policy.k_for(1)] * 8
    assert "unreached, from neighbours: 2-4, 5-8" in policy.tuning.chosen
    # Below first, then above when nothing below was reached.
    assert fill_unreached({(1, 1): None, (2, 4): 3, (5, 8): None, (9, 16): 1}) == {
        (1, 1): 3,
        (2, 4): 3,
        (5, 8): 3,
        (9, 16): 1,
    }
    assert fill_unreached({(1, 1): None, (2, 4): None}) == {(1, 1): 0, (2, 4): 0}


def test_sweep_buckets_cut_at_max_batch_and_go_on_past_128():
    assert sweep_buckets(8) == [(1, 1), (2, 4), (5, 8)]
    assert sweep_buckets(6) == [(1, 1), (2, 4), (5, 6)]
    assert sweep_buckets(300)[-2:] == [(129, 256), (257, 300)]


def test_vllm_entries_merge_equal_neighbours():
    assert vllm_entries([0, 4, 4, 2, 2, 2, 0]) == [[1, 2, 4], [3, 5, 2], [6, 6, 0]]


def test_compare_rates_every_policy_against_the_engineer():
    env = _env()
    specs = ["off", "fixed:1", "threshold:tuned", "sweep"]
    report = compare_policies(
        env, make_policies(specs, env=env), seed=20_000, episodes=2, progress=False
    )
    eng = max(
        (report.result("threshold:tuned"), report.result("sweep")), key=lambda r: r.tokens_per_s
    )
    assert report.engineer is eng
    text = report.format()
    assert "/ engineer" in text.splitlines()[0]
    assert f"the engineer: {eng.policy}" in text
    assert "threshold:tuned: K=" in text and "sweep: per bucket 1:" in text
    assert set(report.to_json()["tuning"]) == {"threshold:tuned", "sweep"}
    row = next(line for line in text.splitlines() if line.startswith(f"| {eng.policy} |"))
    assert "| 1.000 | 1.000-1.000 |" in row


def test_compare_refuses_to_judge_a_tuned_baseline_on_its_tuning_seeds():
    env = _env()
    policies = make_policies(["off", "sweep"], env=env)
    with pytest.raises(SpecrlError, match=r"sweep was tuned on seeds \[50000, 50001\].*--seed"):
        compare_policies(env, policies, seed=TUNE_SEED + 1, episodes=2, progress=False)


def test_the_engineer_is_in_the_default_set_and_parses():
    assert {"threshold:tuned", "sweep"} <= set(default_policies(4))
    assert {"threshold:tuned", "sweep"} <= set(default_policies(4, surrogate=False))
    assert parse_policies("threshold:tuned,sweep") == ["threshold:tuned", "sweep"]
    for bad in ("sweep:2", "threshold:tuned:4", "threshold:best"):
        with pytest.raises(SpecrlError, match="unknown or malformed policy|must be an integer"):
            make_policy(bad, env=_env())


def test_tuning_needs_a_profile_off_the_surrogate():
    class Live:  # a specrl env that is not the surrogate and keeps no profile
        k_max, max_batch, max_len = 3, 8, 384
        workload, _workload_kwargs, profile = "ramp", {"peak": 8}, None

    with pytest.raises(SpecrlError, match="tuned in the surrogate on a hardware profile"):
        tuning_env(Live())
    env = tuning_env(Live(), linear_profile())
    assert isinstance(env, SurrogateSpecEnv) and env.max_batch == 8
    assert np.isclose(env.profile.k_max, linear_profile().k_max)


def test_scorers_share_their_episodes_inside_shared_episodes(monkeypatch, tmp_path):
    import specrl.envs.rollout as rollout
    from specrl.policies.engineer import Scorer, shared_episodes, threshold_dense
    from specrl.workload import preset_trace

    played = []
    real = rollout.run_episode
    monkeypatch.setattr(
        rollout,
        "run_episode",
        lambda env, policy, seed: played.append(seed) or real(env, policy, seed=seed),
    )
    dense = threshold_dense(2, 4, 8)

    def score(env, seeds=(0, 1)):
        scorer = Scorer([env], list(seeds))
        return scorer, scorer.score(dense)

    alone, rate = score(_env())
    assert score(_env())[1] == rate and len(played) == 4  # outside: each plays its own
    played.clear()
    with shared_episodes():
        first, shared_rate = score(_env())
        # Another env alike (its profile another object of the same content): not played,
        # and the same count of episodes and surrogate seconds as playing them.
        second, again = score(_env())
        assert (shared_rate, again, len(played)) == (rate, rate, 2)
        assert (second.episodes, second.surrogate_s) == (alone.episodes, alone.surrogate_s)
        score(_env(), seeds=(0, 2))  # seed 0 shared, seed 2 new
        score(_env(workload_kwargs={"n_requests": 21, "peak": 8}))  # other settings: played
        assert played == [0, 1, 2, 0, 1]
        # A fixed trace is never shared: its name could be a preset's.
        trace = preset_trace("ramp", seed=0, peak=8, n_requests=20)
        score(_env(workload=trace))
        score(_env(workload=trace))
        assert played[5:] == [0, 1, 0, 1]
    played.clear()
    score(_env())  # the block's episodes are gone with it
    assert played == [0, 1]


def test_the_engineer_by_tuning_is_the_schedule_its_benchmark_picked():
    from specrl.compare import ComparisonReport
    from specrl.results import PolicyResult

    def result(name, rate):
        return PolicyResult(name, rate, {}, {}, 0.1, 0.2, episode_tokens_per_s=[rate])

    def tuned(rate, seeds=(50_000, 50_001)):
        return {"tokens_per_s": rate, "seeds": list(seeds), "described": "tuned"}

    results = [result("off", 90.0), result("threshold:tuned", 101.0), result("sweep", 100.0)]
    # On its tuning seeds the sweep scored higher; on these episodes the threshold does.
    tuning = {"threshold:tuned": tuned(99.0), "sweep": tuned(99.5)}
    report = ComparisonReport("surrogate", "w", 20_000, 1, results, tuning)
    assert report.engineer.policy == "threshold:tuned"
    assert report.engineer_by_tuning.policy == "sweep"
    assert report.to_json()["engineer_by_tuning"] == {"policy": "sweep", "tokens_per_s": 100.0}
    text = report.format()
    assert "on its tuning seeds the benchmark picks sweep, 0.9901x the engineer here" in text
    # Where the benchmark picks what these episodes favour, no note.
    tuning["threshold:tuned"] = tuned(99.9)
    assert report.engineer_by_tuning.policy == "threshold:tuned"
    assert "the benchmark picks" not in report.format()
    # Tuned on other seeds, or one not tuned at all: no pick to report.
    tuning["sweep"] = tuned(99.5, seeds=(50_002, 50_003))
    assert report.engineer_by_tuning is None
    del tuning["sweep"]
    assert report.engineer_by_tuning is None
    assert report.to_json()["engineer_by_tuning"] is None
