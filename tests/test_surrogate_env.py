"""SurrogateSpecEnv: checkers, determinism, fixed work, acceptance and catch-up as profiled."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

import specrl  # noqa: F401  (registers the ids)
from specrl.compare import compare_policies
from specrl.envs import SurrogateSpecEnv, run_episode
from specrl.errors import SpecrlError
from specrl.policies import BatchThreshold, FixedK
from specrl.profile.synthetic import expected_tokens_per_row, linear_profile
from specrl.workload import LengthDist, make_trace, preset_trace, steady


def _env(**kwargs) -> SurrogateSpecEnv:
    kwargs.setdefault("profile", linear_profile())
    kwargs.setdefault("workload", "ramp")
    kwargs.setdefault("workload_kwargs", {"n_requests": 24, "peak": 8})
    kwargs.setdefault("max_batch", 8)
    return SurrogateSpecEnv(**kwargs)


def test_gymnasium_check_env_passes_without_warnings():
    from gymnasium.utils.env_checker import check_env

    env = gym.make("specrl/SurrogateSpec-v0", profile=linear_profile(), max_batch=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_sb3_check_env_passes_without_warnings():
    from stable_baselines3.common.env_checker import check_env

    env = _env()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, warn=True)


def _trajectory(env, seed, actions):
    out = [env.reset(seed=seed)]
    for a in actions:
        out.append(env.step(a))
    return out


def test_same_seed_and_actions_give_the_same_trajectory():
    actions = np.random.default_rng(0).integers(0, 5, size=300).tolist()
    a = _trajectory(_env(), 7, actions)
    b = _trajectory(_env(), 7, actions)
    c = _trajectory(_env(), 8, actions)
    assert repr(a) == repr(b)
    assert repr(a) != repr(c)


def test_every_policy_commits_exactly_the_trace_tokens():
    trace = preset_trace("bursts", seed=1, n_requests=40, peak=8)
    env = _env(workload=trace)
    for policy in (FixedK(0), FixedK(3), BatchThreshold(4, 2, 8)):
        result = run_episode(env, policy, seed=0)
        assert result.tokens == trace.total_tokens
        assert env.episode_tokens == trace.total_tokens


def test_committed_per_row_matches_the_profiled_acceptance():
    rates = {"code": [0.9, 0.5, 0.5, 0.5]}
    trace = make_trace(
        name="code",
        seed=0,
        n_requests=8,
        load={"kind": "closed", "schedule": steady(8)},
        domains={"code": 1.0},
        output_lengths=LengthDist(median=300, sigma=0, lo=300, hi=300),
        prompt_lengths=LengthDist(median=8, sigma=0, lo=8, hi=8),
    )
    env = _env(profile=linear_profile(acceptance=rates), workload=trace)
    env.reset(seed=0)
    per_row = []
    for _ in range(40):
        _, _, _, _, info = env.step(2)
        per_row.append(info["committed"] / 8)
    # E(2) = 1 + 0.9 + 0.45 = 2.35; 320 row-steps give a standard error of about 0.04.
    assert np.mean(per_row) == pytest.approx(expected_tokens_per_row(rates["code"], 2), abs=0.15)


def _steady_trace(n_requests: int, batch: int, output_len: int, **kwargs):
    """A closed-loop trace at constant concurrency whose requests all generate output_len."""
    return make_trace(
        name="steady",
        seed=0,
        n_requests=n_requests,
        load={"kind": "closed", "schedule": steady(batch)},
        output_lengths=LengthDist(median=output_len, sigma=0, lo=output_len, hi=output_len),
        **kwargs,
    )


def test_acceptance_follows_the_tokens_a_row_has_generated():
    prof = linear_profile(time_log_sigma=0.0)
    prof.acceptance_by_output = {
        "edges": [8],
        "rates": {
            d: {b: [[0.0] * 4, [1.0] * 4] for b in ("greedy", "chat", "default")}
            for d in ("code", "prose", "hard")
        },
    }
    env = _env(profile=prof, workload=_steady_trace(1, 1, 40), max_batch=1)
    env.reset(seed=0)
    committed = [env.step(2)[4]["committed"] for _ in range(9)]
    # Prefill token + 1, then 1 per step (nothing accepted) until 8 are generated, then 2 + 1.
    assert committed == [2, 1, 1, 1, 1, 1, 1, 3, 3]


def test_catch_up_after_plain_steps_is_charged_once():
    prof = linear_profile(time_log_sigma=0.0)
    prof.catchup = {"tokens": [1.0, 1000.0], "seconds": [0.1, 100.0]}  # 0.1 s per token
    prof.prefill = {"tokens": [1.0, 1000.0], "seconds": [0.0, 0.0]}
    trace = _steady_trace(
        1,
        1,
        100,
        domains={"hard": 1.0},
        prompt_lengths=LengthDist(median=10, sigma=0, lo=10, hi=10),
    )
    env = _env(profile=prof, workload=trace, max_batch=1)
    env.reset(seed=0)
    times = [env.step(k)[4]["step_time_s"] for k in (2, 2, 0, 0, 0, 2, 2)]
    # Prompt 10 tokens + the prefill's first token: the draft reads 10 of them on the first
    # K>0 step (as the engine does, it leaves the last one for its proposal forward).
    assert times[0] - times[1] == pytest.approx(1.0)
    # Three plain steps leave it 4 behind (1 or 2 after the block, +3); it reads all but one.
    assert times[5] - times[6] == pytest.approx(0.3, abs=0.11)
    assert times[2] < times[1]


def test_requests_ending_on_their_prefill_token_leave_before_the_decode():
    trace = _steady_trace(6, 3, 1)
    env = _env(profile=linear_profile(time_log_sigma=0.0), workload=trace, max_batch=3)
    env.reset(seed=0)
    infos = []
    done = False
    while not done:
        _, _, done, _, info = env.step(2)
        infos.append(info)
    # Each step admits 3 requests whose prefill commits their only token; nothing decodes.
    assert [i["committed"] for i in infos] == [3, 3]
    assert env.episode_tokens == trace.total_tokens == 6


def test_reference_rate_defaults_to_plain_decoding_at_batch_1():
    prof = linear_profile()
    assert _env(profile=prof).reference_tokens_per_s == pytest.approx(
        1 / prof.step_seconds(0, 0, 0)
    )


def test_bad_input_names_the_field(tmp_path):
    with pytest.raises(SpecrlError, match=r"k_max=6 is larger than the profile's k_max \(4\)"):
        _env(k_max=6)
    with pytest.raises(SpecrlError, match=r"profile file .*missing.json not found"):
        _env(profile=tmp_path / "missing.json")
    only_code = linear_profile(acceptance={"code": [0.5] * 4})
    missing = r"\(domain, temperature band\) \[\('hard'.*'acceptance'"
    with pytest.raises(SpecrlError, match=missing):
        _env(profile=only_code, workload=preset_trace("steady-8", n_requests=30))
    long = preset_trace(
        "steady-1", n_requests=2, output_lengths=LengthDist(median=900, sigma=0, lo=900, hi=900)
    )
    with pytest.raises(SpecrlError, match=r"requests\[0\] needs 9\d\d tokens.*max_len is 384; "):
        _env(workload=long)
    with pytest.raises(SpecrlError, match=r"workload 'busy'.*preset"):
        _env(workload="busy")
    env = _env()
    env.reset(seed=0)
    for bad in (5, -1, 2.7, np.float32(2.0), np.array([1, 2]), "2"):
        with pytest.raises(SpecrlError, match=r"action .*: K must be an integer in 0\.\.4"):
            env.step(bad)
    for good in (np.int64(2), np.array([3]), np.array(1, dtype=np.int32)):
        *_, info = env.step(good)
        assert info["k"] == int(np.asarray(good).reshape(()))

    class Wild:
        name = "wild"

        def predict(self, obs, state=None, episode_start=None, deterministic=False):
            return np.int64(9), state

    with pytest.raises(SpecrlError, match=r"^policy wild at step 0: action 9: K must be"):
        run_episode(env, Wild(), seed=0)

    class NoName(Wild):
        name = None

    with pytest.raises(SpecrlError, match="a NoName policy has no name; set self.name"):
        compare_policies(env, [NoName()], seed=0)


def test_time_per_output_token_is_the_decode_step_time():
    """One request at a time, K=0, no noise: every token after the first costs one step at
    batch 1, so TPOT is the profile's step time exactly (the prefill is not in it)."""
    prof = linear_profile(time_log_sigma=0.0)
    trace = _steady_trace(3, 1, 10, domains={"code": 1.0})
    env = _env(profile=prof, workload=trace, max_batch=1)
    result = run_episode(env, FixedK(0), seed=0)
    step = env.costs.seconds(1, 0, 0)
    assert len(result.request_tpot_s) == 3
    for tpot in result.request_tpot_s:
        assert tpot == pytest.approx(env.costs.seconds(1, 0, 40), rel=0.05)
        assert tpot >= step
    assert result.step_batch == [1] * len(result.step_batch)


def _per_request_acceptance(level_spread: float) -> np.ndarray:
    """Acceptance of each request of a one-at-a-time trace at K=2."""
    prof = linear_profile(acceptance={d: [0.5] * 4 for d in ("code", "prose", "hard")})
    prof = linear_profile(
        acceptance={d: [0.5] * 4 for d in ("code", "prose", "hard")}, level_spread=level_spread
    )
    trace = _steady_trace(60, 1, 60)
    env = _env(profile=prof, workload=trace, max_batch=1)
    env.reset(seed=0)
    rates, drafted, accepted, done = [], 0, 0, False
    while not done:
        _, _, done, _, info = env.step(2)
        drafted, accepted = drafted + info["drafted"], accepted + info["accepted"]
        if len(env.request_tpot_s) > len(rates):
            rates.append(accepted / drafted)
            drafted = accepted = 0
    return np.array(rates)


def test_each_request_keeps_its_own_acceptance_level():
    alike, spread = _per_request_acceptance(0.0), _per_request_acceptance(1.5)
    assert len(alike) == len(spread) == 60
    # Same mean rate either way; the spread between requests is far wider with levels.
    assert np.std(spread) > 2 * np.std(alike)
    assert abs(np.mean(alike) - 0.42) < 0.05  # accepted/drafted at K=2, a=0.5: (0.5+0.25)/2


def test_oracle_reads_the_true_rates_of_the_coming_rows():
    hopeless = linear_profile(acceptance={d: [0.0] * 4 for d in ("code", "prose", "hard")})
    sure = linear_profile(
        acceptance={d: [1.0] * 4 for d in ("code", "prose", "hard")}, verify_token_s=1e-6
    )
    for prof in (hopeless, sure):
        env = _env(profile=prof, workload="steady-4", workload_kwargs={"n_requests": 12})
        env.reset(seed=0)
        chosen, done = [], False
        while not done:
            chosen.append(env.oracle_k())
            _, _, done, _, _ = env.step(chosen[-1])
        if prof is hopeless:
            assert set(chosen) == {0}
        else:
            # Always speculating, K=4 unless the rows' budgets cap what a longer draft adds.
            assert 0 not in chosen and chosen.count(4) > 0.8 * len(chosen)


def test_batches_past_the_profiles_grid_warn_and_keep_the_edge_spread():
    from specrl.errors import SpecrlWarning
    from specrl.profile.costs import StepCosts

    prof = linear_profile(batch_sizes=(1, 2, 4))
    prof.time_log_sigma = [0.30, 0.20, 0.10]
    costs = StepCosts(prof, max_batch=16, max_len=64, k_max=4)
    # Interpolated inside the grid, held at its ends (a line through the last two would
    # read 0.10 - 0.05 * 12 < 0 at batch 16, and grow past a rising pair).
    assert costs.sigma[1] == 0.30 and costs.sigma[3] == pytest.approx(0.15)
    assert costs.sigma[0] == 0.30 and costs.sigma[4:] == [0.10] * 13
    with pytest.warns(SpecrlWarning) as caught:
        SurrogateSpecEnv(profile=prof, max_batch=16)
        SurrogateSpecEnv(profile=prof, max_batch=16)
    assert [str(w.message) for w in caught] == [
        "the profile measured batch sizes up to 4; at max_batch=16 larger batches' step times "
        "are extended linearly from its last two. Measure up to 16 with `specrl profile "
        "--batch-sizes ...,16`, or lower max_batch"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SurrogateSpecEnv(profile=prof, max_batch=4)
