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
    return np.array(_acceptance_per_request(prof, output_len=60))


def _acceptance_per_request(prof, *, output_len: int) -> list[float]:
    """Acceptance of each of 60 requests served one at a time at K=2."""
    env = _env(profile=prof, workload=_steady_trace(60, 1, output_len), max_batch=1)
    env.reset(seed=0)
    rates, drafted, accepted, done = [], 0, 0, False
    while not done:
        _, _, done, _, info = env.step(2)
        drafted, accepted = drafted + info["drafted"], accepted + info["accepted"]
        if len(env.request_tpot_s) > len(rates):
            rates.append(accepted / drafted)
            drafted = accepted = 0
    return rates


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


# ---------------------------------------------------------------------- mutation gaps


def _all_groups(rates) -> dict:
    """``{domain: {band: rates(domain, band)}}`` over the linear profile's groups."""
    bands = ("greedy", "chat", "default")
    return {d: {b: rates(d, b) for b in bands} for d in ("code", "prose", "hard")}


def _fixed_lengths(trace, prompts, outputs):
    """``trace`` with its requests' prompt and output lengths replaced, in order."""
    import dataclasses

    trace.requests = [
        dataclasses.replace(r, prompt_len=p, max_new_tokens=o)
        for r, p, o in zip(trace.requests, prompts, outputs, strict=True)
    ]
    return trace


def test_observation_is_exact_at_reset_and_after_a_step():
    """Rows ahead and queue count the requests waiting for a row; context is the longest row
    (prompt + its prefill token) at the start of the decode, over max_len."""
    from specrl.features import step_time_feature

    prof = linear_profile(acceptance={d: [1.0] * 4 for d in ("code", "prose", "hard")})
    prof.time_log_sigma = [0.0] * len(prof.batch_sizes)
    trace = _steady_trace(8, 6, 40, prompt_lengths=LengthDist(20, 0, 20, 20))
    env = _env(profile=prof, workload=trace, max_batch=4, max_len=200)
    obs, _ = env.reset(seed=0)
    # 6 due, none running: 4 rows ahead, 2 queued; nothing measured yet (fully stale).
    assert obs.tolist() == [1.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    obs, _, _, _, info = env.step(3)
    assert (info["batch"], info["committed"], info["drafted"], info["accepted"]) == (4, 20, 12, 12)
    expected = [1.0, 0.5, 1.0, 0.0, step_time_feature(info["step_time_s"]), 21 / 200, 3 / 4, 1.0]
    assert obs.tolist() == pytest.approx(expected, rel=1e-6)


def test_prefill_and_catch_up_are_charged_by_padded_tokens_of_the_admitted_rows():
    prof = linear_profile(time_log_sigma=0.0)
    prof.prefill = {"tokens": [1.0, 1000.0], "seconds": [0.01, 10.0]}  # 0.01 s per token
    prof.catchup = {"tokens": [1.0, 1000.0], "seconds": [0.001, 1.0]}  # 0.001 s per token
    trace = _fixed_lengths(_steady_trace(3, 3, 10), prompts=[20, 30, 12], outputs=[2, 10, 10])
    env = _env(profile=prof, workload=trace, max_batch=2)
    env.reset(seed=0)
    infos = [env.step(k)[4] for k in (2, 0)]
    # Step 1 admits requests 0 and 1: 2 rows x 30 (the widest prompt) prefilled, and the draft
    # catches both up on 2 x 30 tokens (all but the last of prompt + first token).
    assert infos[0]["admitted"] == 2
    assert infos[0]["prefill_s"] == pytest.approx(0.6, rel=1e-9)
    decode = env.costs.seconds(2, 2, 31)
    assert infos[0]["step_time_s"] == pytest.approx(decode + 0.6 + 0.06, rel=1e-9)
    # Request 0 (2 tokens) finishes in step 1; step 2 admits request 2 alone next to request
    # 1: 1 row x 12 tokens prefilled, not the running row.
    assert infos[1]["admitted"] == 1
    assert infos[1]["prefill_s"] == pytest.approx(0.12, rel=1e-9)


def test_catch_up_after_a_fully_accepted_block_reads_one_more_token():
    """After a fully accepted block the draft is 2 tokens behind (1 otherwise); three plain
    steps add 3; it then reads all but the last: 4 tokens, or 3."""
    for rate, behind in ((1.0, 4), (0.0, 3)):
        prof = linear_profile(
            acceptance={d: [rate] * 4 for d in ("code", "prose", "hard")}, time_log_sigma=0.0
        )
        prof.catchup = {"tokens": [1.0, 1000.0], "seconds": [0.1, 100.0]}
        prof.prefill = {"tokens": [1.0, 1000.0], "seconds": [0.0, 0.0]}
        trace = _steady_trace(1, 1, 100, prompt_lengths=LengthDist(10, 0, 10, 10))
        env = _env(profile=prof, workload=trace, max_batch=1)
        env.reset(seed=0)
        times = [env.step(k)[4]["step_time_s"] for k in (2, 0, 0, 0, 2, 2)]
        assert times[4] - times[5] == pytest.approx(0.1 * behind, abs=1e-4)


def test_acceptance_is_that_of_the_requests_domain_and_temperature_band():
    prof = linear_profile(
        acceptance=_all_groups(lambda d, b: [1.0 if (d, b) == ("prose", "chat") else 0.0] * 4),
        time_log_sigma=0.0,
    )
    for domain, band, per_row in (
        ("prose", "chat", 3),
        ("prose", "greedy", 1),
        ("code", "chat", 1),
    ):
        trace = _steady_trace(4, 4, 40, domains={domain: 1.0}, sampling={band: 1.0})
        env = _env(profile=prof, workload=trace, max_batch=4)
        env.reset(seed=0)
        info = env.step(2)[4]
        assert info["committed"] == 4 + 4 * per_row, (domain, band)


def test_mean_committed_per_row_is_the_closed_form_for_iid_acceptance():
    """Acceptance a at every position: E(K) = (1 - a^(K+1)) / (1 - a) tokens per row."""
    a, k = 0.6, 4
    prof = linear_profile(acceptance={d: [a] * 4 for d in ("code", "prose", "hard")})
    trace = _steady_trace(8, 8, 300)
    env = _env(profile=prof, workload=trace, max_batch=8)
    env.reset(seed=0)
    env.step(k)  # the admission step also commits the prefill tokens
    per_row = [env.step(k)[4]["committed"] / 8 for _ in range(40)]
    # Per row: mean 2.3056, sd 1.39; 320 rows give a standard error of 0.078 (5 sigma: 0.39).
    expected = (1 - a ** (k + 1)) / (1 - a)
    assert np.mean(per_row) == pytest.approx(expected, abs=0.39)
    assert abs(np.mean(per_row) - (1 + k * a)) > 0.39  # accepted tokens past a rejection


def test_a_row_drafts_no_more_than_its_tokens_left_but_one():
    prof = linear_profile(acceptance={d: [1.0] * 4 for d in ("code", "prose", "hard")})
    trace = _steady_trace(1, 1, 4)
    env = _env(profile=prof, workload=trace, max_batch=1)
    env.reset(seed=0)
    _, _, done, _, info = env.step(4)
    # 3 tokens left after the prefill's: 2 drafted and accepted, plus the bonus token.
    assert (info["drafted"], info["accepted"], info["committed"], done) == (2, 2, 4, True)


def test_step_time_spread_is_the_profiles_at_the_steps_batch():
    prof = linear_profile()
    prof.time_log_sigma = [0.0] + [0.5] * (len(prof.batch_sizes) - 1)
    spreads = {}
    for batch in (1, 4):
        trace = _steady_trace(batch, batch, 61, prompt_lengths=LengthDist(20, 0, 20, 20))
        env = _env(profile=prof, workload=trace, max_batch=batch)
        env.reset(seed=0)
        env.step(0)  # the admission step (prefill)
        ratios = [
            env.step(0)[4]["step_time_s"] / env.costs.seconds(batch, 0, 21 + j)
            for j in range(1, 60)
        ]
        spreads[batch] = np.std(np.log(ratios))
    assert spreads[1] == 0.0
    # 59 draws of N(0, 0.5^2): the sample sd has a standard error of about 0.046.
    assert 0.35 < spreads[4] < 0.65


def test_time_per_output_token_counts_from_each_requests_own_prefill():
    """Two rows, four requests: the last two wait a turn. Each request's TPOT is its decode
    time after its prefill over its tokens but the first."""
    prof = linear_profile(time_log_sigma=0.0)
    prof.prefill = {"tokens": [1.0, 1000.0], "seconds": [0.01, 10.0]}
    trace = _steady_trace(4, 4, 5, prompt_lengths=LengthDist(20, 0, 20, 20))
    env = _env(profile=prof, workload=trace, max_batch=2)
    env.reset(seed=0)
    infos, done = [], False
    while not done:
        _, _, done, _, info = env.step(0)
        infos.append(info)
    assert [i["admitted"] for i in infos] == [2, 0, 0, 0, 2, 0, 0, 0]
    seconds = [i["step_time_s"] for i in infos]
    first = (sum(seconds[:4]) - infos[0]["prefill_s"]) / 4
    second = (sum(seconds[4:]) - infos[4]["prefill_s"]) / 4
    assert infos[0]["prefill_s"] == pytest.approx(0.4)
    assert env.request_tpot_s == pytest.approx([first, first, second, second], rel=1e-9)


def test_a_request_filling_max_len_exactly_fits():
    trace = _steady_trace(2, 1, 44, prompt_lengths=LengthDist(20, 0, 20, 20))
    env = _env(workload=trace, max_batch=1, max_len=64)
    assert run_episode(env, FixedK(2), seed=0).tokens == 88
    with pytest.raises(SpecrlError, match=r"needs 64 tokens .* max_len is 63"):
        _env(workload=trace, max_batch=1, max_len=63)


def test_a_preset_workload_draws_its_trace_from_the_reset_seed():
    env = _env(workload="steady-4", workload_kwargs={"n_requests": 8})
    env.reset(seed=1)
    one = env.trace.requests
    env.reset(seed=1)
    assert env.trace.requests == one
    env.reset(seed=2)
    two = env.trace.requests
    assert two != one
    env.reset()
    assert env.trace.requests not in (one, two)


def test_each_request_draws_its_level_uniformly_from_the_profiles_quantiles():
    """Levels -40 and +40: a request accepts nothing or everything, each half the time."""
    prof = linear_profile(acceptance={d: [0.5] * 4 for d in ("code", "prose", "hard")})
    prof.request_levels = _all_groups(lambda d, b: [-40.0, 40.0])
    rates = _acceptance_per_request(prof, output_len=20)
    assert set(np.round(rates, 6)) == {0.0, 1.0}
    # Binomial(60, 1/2): sd 3.9; 15..45 is +-3.9 sd.
    assert 15 <= rates.count(1.0) <= 45


def test_a_drifting_level_keeps_the_profiles_correlation_per_token():
    """Levels -40 / +40 by the sign of z, z an AR(1) with phi = 0.98 per token: at K=1 a step
    accepts iff z > 0 (nearly), and consecutive steps 1-2 tokens apart flip with probability
    arccos(phi^tokens) / pi = 0.064-0.090. Drifting over all tokens generated so far at every
    step flips them about half the time; a z that keeps all of itself (a random walk) flips
    ever less."""
    prof = linear_profile(acceptance={d: [0.5] * 4 for d in ("code", "prose", "hard")})
    prof.time_log_sigma = [0.0] * len(prof.batch_sizes)
    prof.request_levels = _all_groups(lambda d, b: [-40.0, 40.0])
    prof.level_drift = _all_groups(lambda d, b: {"per_token": 0.98, "scale": 1.0, "shift": 0.0})
    trace = _steady_trace(10, 1, 600, prompt_lengths=LengthDist(8, 0, 8, 8))
    env = _env(profile=prof, workload=trace, max_batch=1, max_len=608)
    env.reset(seed=0)
    accepted, done = [], False
    while not done:
        _, _, done, _, info = env.step(1)
        if info["drafted"]:
            accepted.append(info["accepted"])
    acc = np.array(accepted)
    assert len(acc) > 3000
    # Over 12 seeds: 0.055-0.082 as simulated; about 0.43 and 0.01-0.03 for the two errors.
    assert 0.045 < np.mean(acc[1:] != acc[:-1]) < 0.15


@pytest.mark.parametrize(("a", "best"), [(0.3, 1), (0.6, 2), (0.8, 4)])
def test_oracle_is_the_closed_form_argmax_over_the_rows_that_will_decode(a, best):
    """One 50-token request and three one-token ones (those leave on their prefill token):
    the oracle weighs the one row's E(K) = (1 - a^(K+1)) / (1 - a) against T(1, K)."""
    from specrl.workload import Request, Trace

    prof = linear_profile(acceptance={d: [a] * 4 for d in ("code", "prose", "hard")})
    requests = [Request("code", 0, 8, 50)] + [Request("code", 0, 8, 1)] * 3
    trace = Trace(
        "t",
        0,
        {"code": 1.0},
        {"kind": "closed", "schedule": [[0, 4]]},
        LengthDist(8, 0, 8, 8),
        LengthDist(1, 0, 1, 50),
        requests,
    )
    env = _env(profile=prof, workload=trace, max_batch=4)
    env.reset(seed=0)
    rates = [(1 - a ** (k + 1)) / (1 - a) / env.costs.seconds(1, k, 9) for k in range(5)]
    assert int(np.argmax(rates)) == best
    assert env.oracle_k() == best


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_reference_rate_that_is_not_positive_is_refused(bad):
    # 0.0 was silently replaced by the profile's plain-decode rate.
    with pytest.raises(SpecrlError, match="reference_tokens_per_s must be > 0"):
        SurrogateSpecEnv(profile=linear_profile(), max_batch=8, reference_tokens_per_s=bad)
