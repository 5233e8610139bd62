"""The baseline K controllers on hand-built observations: exact Ks, the serving stacks' table
rules, state across steps and episodes, and the command-line registry."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

from specrl.envs.base import OBS_NAMES
from specrl.errors import SpecrlError
from specrl.features import ACCEPTANCE_EMA, conditional_acceptance, drafted_acceptance
from specrl.policies import (
    CONTEXT_INFINITY,
    AcceptEMA,
    BatchSchedule,
    BatchThreshold,
    FixedK,
    Goodput,
    HFHeuristic,
    Oracle,
    default_policies,
    make_policy,
    parse_policies,
)
from specrl.profile.synthetic import linear_profile

MAX_BATCH = 64


def obs(
    *,
    batch: int = 1,
    max_batch: int = MAX_BATCH,
    acceptance: float = 0.0,
    staleness: float = 0.0,
    context: float = 0.25,
    last_k: float = 0.0,
    last_accept: float = 0.0,
) -> np.ndarray:
    """One observation; ``batch`` in rows, ``last_k`` as the obs holds it (K / k_max)."""
    values = {
        "batch": batch / max_batch,
        "queue": 0.0,
        "acceptance": acceptance,
        "staleness": staleness,
        "step_time": 0.5,
        "context": context,
        "last_k": last_k,
        "last_accept": last_accept,
    }
    return np.array([values[name] for name in OBS_NAMES], dtype=np.float32)


def after_step(k: int, k_max: int, accept: float, **kwargs) -> np.ndarray:
    """The observation after a step that drafted ``k`` tokens per row and accepted
    ``accept`` of them (``k=0``: drafted nothing)."""
    return obs(
        last_k=k / k_max,
        last_accept=accept if k else 0.0,
        staleness=0.0 if k else 1 / 32,
        **kwargs,
    )


def ks(policy, batches, **kwargs) -> list[int]:
    return [int(policy.predict(obs(batch=b, **kwargs))[0]) for b in batches]


# ---------------------------------------------------------------------- fixed


def test_fixed_and_threshold_shapes_and_state_passthrough():
    one, two = obs(batch=4), np.stack([obs(batch=4), obs(batch=9)])
    action, state = FixedK(3).predict(one, state="kept")
    assert type(action) is np.int64 and action == 3 and state == "kept"
    actions, _ = BatchThreshold(2, 8, MAX_BATCH).predict(two)
    assert actions.dtype == np.int64 and actions.tolist() == [2, 0]
    with pytest.raises(SpecrlError, match="shape"):
        FixedK(1).predict(np.zeros(5))


# ---------------------------------------------------------------------- vLLM


def test_vllm_expansion_gaps_tail_and_clamps():
    config = {
        "method": "eagle",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 4, 3], [9, 16, 1], [17, 32, 5]],
    }
    clamp = r"K above 4 \(num_speculative_tokens\) at batch 17-32: K=5; clamped to 4, as vLLM"
    with pytest.warns(UserWarning, match=clamp):
        sched = BatchSchedule.from_vllm(config, max_batch=40)
    assert sched.name == "schedule:vllm"
    expected = [0] + [3] * 4 + [3] * 4 + [1] * 8 + [4] * 16 + [4] * 8
    assert sched.table[:, 0].tolist() == expected
    batches = [1, 4, 5, 8, 9, 16, 17, 32, 33, 40]
    assert ks(sched, batches, max_batch=40) == [3, 3, 3, 3, 1, 1, 4, 4, 4, 4]
    # vLLM sorts the ranges before checking them: list order is free.
    shuffled = dict(
        config, num_speculative_tokens_per_batch_size=[[17, 32, 5], [1, 4, 3], [9, 16, 1]]
    )
    with pytest.warns(UserWarning, match=clamp):
        assert (BatchSchedule.from_vllm(shuffled, max_batch=40).table == sched.table).all()
    # Without num_speculative_tokens nothing clamps but k_max.
    with pytest.warns(UserWarning, match=r"K above 6 \(k_max\) at batch 5-8: K=7; clamped to 6"):
        bare = BatchSchedule.from_vllm([[1, 4, 3], [5, 8, 7]], max_batch=8, k_max=6)
    assert bare.table[1:, 0].tolist() == [3] * 4 + [6] * 4


def test_vllm_five_item_grid_by_batch_and_context():
    grid = [
        [1, 8, 1, 128, 4],
        [1, 8, 129, 512, 2],
        [9, 64, 1, 128, 2],
        [9, 64, 129, 512, 0],
    ]
    sched = BatchSchedule.from_vllm(grid, max_batch=64, max_len=1024)
    assert sched.context_ends.tolist() == [128, CONTEXT_INFINITY]
    assert sched.k_for(8, 128) == 4 and sched.k_for(8, 129) == 2 and sched.k_for(8, 5000) == 2
    for batch, context, k in [(1, 64, 4), (8, 600, 2), (9, 64, 2), (64, 1000, 0)]:
        assert ks(sched, [batch], context=context / 1024) == [k]
    with pytest.raises(SpecrlError, match="max_len"):
        BatchSchedule.from_vllm(grid, max_batch=64)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([[1, 8, 2], [5, 16, 1]], r"\[1\] \(batch 5-16\) overlaps .*\[0\]"),
        ([[1, 8, 2], [8, 16, 1]], r"\[1\] \(batch 8-16\) overlaps .*\[0\] \(batch 1-8\)"),
        ([[2, 8, 2]], r"\[0\]: the first batch range starts at 2; it must start at 1"),
        ([[1, 8, 2], [16, 9, 1]], r"\[1\] = \[16, 9, 1\]: the batch range's start"),
        ([[1, 8, 2], [9, 16, 1, 64, 1]], "mixes 3-item and 5-item"),
        (
            [[1, 8, 1, 100, 2], [1, 8, 101, 200, 1], [9, 16, 1, 100, 1]],
            "rectangular grid",
        ),
        ([[1, 8, 2, 100, 2], [1, 8, 101, 200, 1]], "first context range starts at 2"),
        ([[1, 8, 1, 100, 2], [1, 8, 102, 200, 1]], "must be contiguous"),
        (
            [[1, 8, 1, 100, 2], [1, 8, 50, 200, 1]],
            r"context range 1-100 is followed by 50-200; context ranges must be contiguous",
        ),
        ([[1, 8, -1]], r"\[0\] = \[1, 8, -1\]: K must be in 0..256"),
        ([[1, 8, 10**30]], r"\[0\] = \[1, 8, 10{30}0*\]: K must be in 0..256"),
        (
            {
                "num_speculative_tokens": 10**30,
                "num_speculative_tokens_per_batch_size": [[1, 8, 2]],
            },
            "num_speculative_tokens must be an integer 1..256",
        ),
        ([[0, 8, 1]], "bounds must be > 0"),
        ([[1, 8, 2.0]], "must be an integer"),
        ([[1, 8]], r"\[0\] = \[1, 8\]: each entry is"),
        ([[1, 8, 2], [1, 8, 3]], r"\[1\] repeats the cell .* of .*\[0\]"),
        ([], "non-empty list"),
        ({"num_speculative_tokens": 3}, "no 'num_speculative_tokens_per_batch_size'"),
        (
            {"num_speculative_tokens": 0, "num_speculative_tokens_per_batch_size": [[1, 8, 1]]},
            "num_speculative_tokens must be an integer 1..256",
        ),
    ],
)
def test_vllm_refusals(table, message):
    with pytest.raises(SpecrlError, match=message):
        BatchSchedule.from_vllm(table, max_batch=64, max_len=1024)


# ---------------------------------------------------------------------- TensorRT-LLM


def test_trtllm_keys_are_upper_bounds():
    batches = [1, 4, 5, 8, 9, 32, 33]
    for config in (
        {4: 4, 8: 2, 32: 1},
        {"max_draft_len": 4, "draft_len_schedule": {"8": 2, "4": 4, "32": 1}},
    ):
        sched = BatchSchedule.from_trtllm(config, max_batch=MAX_BATCH)
        assert ks(sched, batches) == [4, 4, 2, 2, 1, 1, 0]
        actions, _ = sched.predict(np.stack([obs(batch=b) for b in batches]))
        assert actions.tolist() == [4, 4, 2, 2, 1, 1, 0]
    clamped = BatchSchedule.from_trtllm({4: 4, 8: 2}, max_batch=MAX_BATCH, k_max=3)
    assert ks(clamped, [1, 5]) == [3, 2]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"max_draft_len": 4, "draft_len_schedule": {4: 3, 8: 2}},
            r"\[4\] = 3: the smallest key's value must equal max_draft_len \(4\)",
        ),
        ({4: 2, 8: 3}, r"\[8\] = 3 is above max_draft_len \(2\)"),
        (
            {"max_draft_len": 4, "draft_len_schedule": {4: 4, 8: 5}},
            r"\[8\] = 5 is above max_draft_len",
        ),
        ({4: 4, 8: -1}, r"\[8\] = -1: values are draft lengths, integers 0..256"),
        ({4: 4, 8: 257}, r"\[8\] = 257: values are draft lengths, integers 0..256"),
        (
            {"max_draft_len": 10**30, "draft_len_schedule": {4: 4}},
            "max_draft_len must be an integer 1..256",
        ),
        ({0: 4}, "keys are batch sizes, integers >= 1"),
        ({"many": 4}, "keys are batch sizes"),
        ({4: 0}, "must be >= 1"),
        ({}, "is empty"),
        ({"max_draft_len": 0, "draft_len_schedule": {4: 0}}, "max_draft_len must be"),
    ],
)
def test_trtllm_refusals(config, message):
    with pytest.raises(SpecrlError, match=message):
        BatchSchedule.from_trtllm(config, max_batch=MAX_BATCH)


# ---------------------------------------------------------------------- files


def test_schedule_files(tmp_path):
    vllm = tmp_path / "vllm_table.json"
    table = [[1, 8, 3], [9, 64, 0]]
    vllm.write_text(json.dumps({"num_speculative_tokens_per_batch_size": table}))
    sched = BatchSchedule.from_file(vllm, max_batch=MAX_BATCH)
    assert sched.name == "schedule:vllm_table" and ks(sched, [8, 9]) == [3, 0]
    trt = tmp_path / "trt.json"
    config = {"decoding_type": "Eagle", "max_draft_len": 2, "draft_len_schedule": {"16": 2}}
    trt.write_text(json.dumps({"speculative_config": config}))
    assert ks(BatchSchedule.from_file(trt, max_batch=MAX_BATCH), [16, 17]) == [2, 0]

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([[1, 8, 2], [4, 16, 1]]))
    with pytest.raises(SpecrlError, match=rf"{bad}: .*\[1\] \(batch 4-16\) overlaps"):
        BatchSchedule.from_file(bad, max_batch=MAX_BATCH)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"k": 1}))
    with pytest.raises(SpecrlError, match="no 'num_speculative_tokens_per_batch_size' or"):
        BatchSchedule.from_file(other, max_batch=MAX_BATCH)
    with pytest.raises(SpecrlError, match="not found"):
        BatchSchedule.from_file(tmp_path / "missing.json", max_batch=MAX_BATCH)


# ---------------------------------------------------------------------- transformers


def test_hf_heuristic_sequence_and_resets():
    hf = HFHeuristic(k_max=6, initial_k=2)
    steps = [  # (accepted fraction of the last step's drafts, K expected next)
        (1.0, 4),
        (1.0, 6),
        (1.0, 6),  # clamped to k_max
        (0.5, 5),
        (None, 5),  # the last step drafted nothing: K unchanged
        (0.9, 4),
        (0.0, 3),
        (0.0, 2),
        (0.0, 1),
        (0.0, 1),  # never below 1
    ]
    k, _ = hf.predict(obs(staleness=1.0), episode_start=np.array([True]))
    assert k == 2
    for accept, expected in steps:
        k, _ = hf.predict(after_step(0 if accept is None else int(k), 6, accept or 0.0))
        assert k == expected
    assert hf.predict(obs(staleness=1.0), episode_start=np.array([True]))[0] == 2
    assert HFHeuristic(k_max=4).predict(obs())[0] == 4  # transformers' 20, clamped to k_max


def test_batched_observations_keep_state_per_env():
    hf = HFHeuristic(k_max=6, initial_k=3)
    two = np.stack([obs(), obs()])
    assert hf.predict(two, episode_start=np.array([True, True]))[0].tolist() == [3, 3]
    both = np.stack([after_step(3, 6, 1.0), after_step(3, 6, 0.5)])
    actions, _ = hf.predict(both, episode_start=np.array([False, False]))
    assert actions.dtype == np.int64 and actions.tolist() == [5, 2]
    actions, _ = hf.predict(both[::-1], episode_start=np.array([False, True]))
    assert actions.tolist() == [4, 3]  # env 1 restarted: its observation is not learned from
    with pytest.raises(SpecrlError, match="episode_start has 1 entries for 2"):
        hf.predict(two, episode_start=np.array([True]))


# ---------------------------------------------------------------------- SGLang


def ema_step(policy, k: int, accepted_per_row: float, *, batch: int = 2) -> int:
    """Feed a step that drafted ``k`` per row and accepted ``accepted_per_row`` of them."""
    obs_ = after_step(k, policy.k_max, accepted_per_row / k, batch=batch)
    return int(policy.predict(obs_)[0])


def test_accept_ema_is_round_ema_plus_one_per_band():
    ema = AcceptEMA(k_max=4, max_batch=MAX_BATCH, ema_alpha=1.0, warmup_steps=0, update_interval=1)
    assert ema.predict(obs(batch=2), episode_start=[True])[0] == 4  # starts at the largest
    assert ema_step(ema, 4, 1.0, batch=8) == 4  # band 1-4 drops to 2; the 5-16 band is untouched
    assert ema_step(ema, 4, 4.0, batch=2) == 2
    assert ema_step(ema, 2, 0.0, batch=2) == 1  # nothing accepted: the smallest candidate, not 0
    assert ema_step(ema, 1, 1.0, batch=2) == 2  # 1 > 1 - 0.5 - 0.25: probe one more
    assert [ema.band_of(b) for b in (1, 4, 5, 16, 17, 64, 65, 500)] == [0, 0, 1, 1, 2, 2, 3, 3]


def _dead_band_ema() -> AcceptEMA:
    """AcceptEMA at K=2 with no smoothing or warm-up and a +-0.25 dead band, started."""
    ema = AcceptEMA(
        k_max=4,
        max_batch=MAX_BATCH,
        ema_alpha=1.0,
        warmup_steps=0,
        update_interval=1,
        down_hysteresis=-0.25,
        up_hysteresis=0.25,
        initial_k=2,
    )
    ema.predict(obs(batch=2), episode_start=[True])
    return ema


def test_accept_ema_hysteresis_dead_band():
    ema = _dead_band_ema()
    assert ema_step(ema, 2, 1.6) == 2  # round(1.6) + 1 = 3, but 1.6 is not 0.25 past 1.5
    assert ema_step(ema, 2, 1.8) == 3
    assert ema_step(ema, 3, 1.4) == 3  # round(1.4) + 1 = 2, but 1.4 is not 0.25 below 1.5
    assert ema_step(ema, 3, 1.2) == 2


def test_accept_ema_sglang_warmup_interval_and_candidates():
    ema = AcceptEMA(k_max=7, max_batch=MAX_BATCH, candidate_steps=[1, 3, 7])  # SGLang defaults
    ema.predict(obs(batch=2), episode_start=[True])
    seen = [ema_step(ema, 7, 0.0) for _ in range(15)]
    assert seen == [7] * 14 + [1]  # 10 warm-up updates, then every 5th decides
    for bad in ({"candidate_steps": [0, 2]}, {"candidate_steps": []}, {"ema_alpha": 0.0}):
        with pytest.raises(SpecrlError, match="AcceptEMA"):
            AcceptEMA(k_max=4, max_batch=8, **bad)


# ---------------------------------------------------------------------- goodput


@pytest.fixture(scope="module")
def goodput():
    # Verify costs 1 ms per token per row: compute-bound early, as at large batch on a GPU.
    profile = linear_profile(verify_token_s=1e-3)
    return Goodput(profile, max_batch=MAX_BATCH, max_len=384, k_max=4, probe_k=2)


def _goodput_after_probe(goodput, rate: float, batch: int = 1) -> int:
    """K after an episode's probe (K=2) measured ``rate`` = accepted / drafted."""
    assert goodput.predict(obs(batch=1, staleness=1.0), episode_start=[True])[0] == 2
    return int(goodput.predict(obs(batch=batch, last_k=2 / 4, last_accept=rate))[0])


def test_goodput_off_at_large_batch_on_at_small(goodput):
    # A probe at K=2 measuring (0.8 + 0.8^2) / 2 reads a = 0.8: E(K) = 1 + 0.8 + ... + 0.8^K.
    rate = drafted_acceptance(0.8, 2)
    assert [_goodput_after_probe(goodput, rate, b) for b in (64, 8, 1, 0)] == [0, 1, 3, 0]
    context = 0.25 * 384
    assert [goodput.best_k(b, context, 0.8) for b in (64, 8, 1)] == [0, 1, 3]
    assert goodput.name == "goodput"


def test_goodput_reads_its_own_moving_average_of_the_measured_rate(goodput):
    # SmartSpec's estimate: an EMA of accepted / drafted (weight ACCEPTANCE_EMA), inverted at
    # the last drafted K; the observation's own estimate (``acceptance``) is not read.
    _goodput_after_probe(goodput, 0.72)
    for batch in (1, 8, 64):
        k_then = goodput.predict(obs(batch=batch, acceptance=0.0, last_k=0.0, staleness=0.1))[0]
        assert k_then == goodput.best_k(batch, 0.25 * 384, 0.8)  # a K=0 step: nothing new
    k = goodput.predict(obs(batch=1, acceptance=0.99, last_k=2 / 4, last_accept=0.32))[0]
    rate = 0.72 + ACCEPTANCE_EMA * (0.32 - 0.72)
    a = (math.sqrt(1 + 8 * rate) - 1) / 2  # a + a^2 = 2 * rate
    assert abs(conditional_acceptance(rate, 2) - a) < 1e-12
    assert k == goodput.best_k(1, 0.25 * 384, a)
    # After a K=4 step the average is read at K=4.
    rate4 = drafted_acceptance(0.5, 4)
    k4 = goodput.predict(obs(batch=1, last_k=1.0, last_accept=rate4))[0]
    mixed = rate + ACCEPTANCE_EMA * (rate4 - rate)
    assert k4 == goodput.best_k(1, 0.25 * 384, conditional_acceptance(mixed, 4))


def test_goodput_probes_when_stale(goodput):
    start = goodput.predict(obs(batch=1, staleness=1.0), episode_start=[True])[0]
    assert start == 2  # nothing measured yet: probe
    # The EMA starts at the first measured step, so one probe is enough.
    assert goodput.predict(obs(batch=1, last_k=2 / 4, last_accept=0.72))[0] == 3
    assert goodput.predict(obs(batch=1, staleness=1.0, last_accept=0.5))[0] == 2
    # Without an episode start and before any drafting step: probe rather than guess.
    fresh = Goodput(linear_profile(verify_token_s=1e-3), max_batch=MAX_BATCH, max_len=384, k_max=4)
    assert fresh.predict(obs(batch=1, staleness=0.5, acceptance=0.9))[0] == 1
    with pytest.raises(SpecrlError, match="above the profile's k_max"):
        Goodput(linear_profile(k_max=2), max_batch=8, max_len=64, k_max=4)


# ---------------------------------------------------------------------- oracle


def test_oracle_needs_the_surrogate():
    from specrl.envs.surrogate import SurrogateSpecEnv

    with pytest.raises(SpecrlError, match="cannot run in the live env"):
        Oracle(SimpleNamespace(unwrapped=SimpleNamespace()))

    class StubSurrogate(SurrogateSpecEnv):
        def __init__(self):  # no tables: only oracle_k is called
            pass

        def oracle_k(self):
            return 3

    oracle = Oracle(StubSurrogate())
    assert oracle.predict(obs())[0] == 3 and oracle.name == "oracle"
    with pytest.raises(SpecrlError, match="one env"):
        oracle.predict(np.stack([obs(), obs()]))


# ---------------------------------------------------------------------- registry


@pytest.fixture
def env():
    return SimpleNamespace(k_max=4, max_batch=8, max_len=384, profile=linear_profile())


def test_registry_builds_every_form(env, tmp_path):
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"draft_len_schedule": {"4": 3}}))
    names = {
        "off": "off",
        "fixed:2": "K=2",
        "threshold:4:8": "K=4 if B<=8",
        f"schedule:{table}": "schedule:t",
        "hf": "hf",
        "ema": "ema",
        "goodput": "goodput",
    }
    for spec, name in names.items():
        assert make_policy(spec, env=env).name == name
    live = SimpleNamespace(k_max=4, max_batch=8, max_len=384)
    assert make_policy("goodput", env=live, profile=linear_profile()).name == "goodput"
    assert parse_policies(" off, fixed:2,,goodput ") == ["off", "fixed:2", "goodput"]
    fixed = ["off", "fixed:1", "fixed:2", "threshold:2:8"]
    engineer = ["threshold:tuned", "sweep"]
    assert default_policies(2) == [*fixed, *engineer, "hf", "ema", "goodput", "oracle"]
    assert "oracle" not in default_policies(2, surrogate=False)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fixed:x", "'fixed:x': K must be an integer 0..4"),
        ("fixed:9", "'fixed:9': K must be an integer 0..4"),
        ("threshold:2", "malformed policy 'threshold:2'"),
        ("threshold:2:-1", "B must be an integer >= 0"),
        ("greedy", "malformed policy 'greedy'"),
        ("schedule:", "malformed policy 'schedule:'"),
        ("oracle", "cannot run in the live env"),
    ],
)
def test_registry_errors(env, spec, message):
    with pytest.raises(SpecrlError, match=message) as err:
        make_policy(spec, env=env)
    if "malformed" in message or "must be" in message:
        assert "fixed:K" in str(err.value) and "threshold:K:B" in str(err.value)


def test_registry_goodput_needs_a_profile():
    live = SimpleNamespace(k_max=4, max_batch=8, max_len=384)
    with pytest.raises(SpecrlError, match="profile"):
        make_policy("goodput", env=live)
    with pytest.raises(SpecrlError, match="malformed policy 'nope'"):
        parse_policies("off,nope")


# ---------------------------------------------------------------------- mutation gaps


def test_threshold_drafts_at_the_threshold_batch():
    assert ks(BatchThreshold(2, 8, MAX_BATCH), [7, 8, 9]) == [2, 2, 0]


@pytest.mark.parametrize(
    "args, message",
    [
        ((True, 8, 64), "BatchThreshold: k must be an integer, got True"),
        ((2, 8.5, 64), "BatchThreshold: max_spec_batch must be an integer, got 8.5"),
        ((2, "8", 64), "BatchThreshold: max_spec_batch must be an integer, got '8'"),
        ((2, 8, None), "BatchThreshold: max_batch must be an integer, got None"),
        ((-1, 8, 64), "BatchThreshold: k must be >= 0, got -1"),
        ((2, 8, 0), "BatchThreshold: max_batch must be >= 1, got 0"),
    ],
)
def test_threshold_refuses_what_is_not_an_integer(args, message):
    # Before: True was accepted as K (named "K=True if B<=8"), and "8" raised a TypeError.
    with pytest.raises(SpecrlError, match=re.escape(message)):
        BatchThreshold(*args)


def test_vllm_context_range_ends_are_inclusive_in_the_observation():
    grid = [[1, 8, 1, 128, 4], [1, 8, 129, 512, 2]]
    sched = BatchSchedule.from_vllm(grid, max_batch=8, max_len=1024)
    assert [ks(sched, [8], context=c / 1024)[0] for c in (1, 128, 129, 512, 1024)] == [
        4,
        4,
        2,
        2,
        2,
    ]


def test_vllm_warns_only_about_ks_it_clamps_where_they_are_read():
    import warnings

    key = "num_speculative_tokens_per_batch_size"
    config = {"num_speculative_tokens": 4, key: [[1, 4, 4], [5, 8, 3], [9, 16, 6]]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # K=4 is the cap, not above it; 9-16 is above max_batch
        sched = BatchSchedule.from_vllm(config, max_batch=8)
    assert sched.table[1:, 0].tolist() == [4] * 4 + [3] * 4


def test_vllm_clamp_warning_names_the_lower_limit():
    key = "num_speculative_tokens_per_batch_size"
    config = {"num_speculative_tokens": 4, key: [[1, 8, 2], [9, 16, 5]]}
    vllm_cap = r"K above 4 \(num_speculative_tokens\) at batch 9-16: K=5; clamped to 4, as vLLM"
    with pytest.warns(UserWarning, match=vllm_cap):
        sched = BatchSchedule.from_vllm(config, max_batch=16, k_max=6)
    assert sched.table[1:, 0].tolist() == [2] * 8 + [4] * 8
    config["num_speculative_tokens"] = 6
    env_cap = r"K above 4 \(k_max\) at batch 9-16: K=5; clamped to 4: the engine drafts no more"
    with pytest.warns(UserWarning, match=env_cap):
        sched = BatchSchedule.from_vllm(config, max_batch=16, k_max=4)
    assert sched.table[1:, 0].tolist() == [2] * 8 + [4] * 8


def test_schedules_draft_nothing_for_an_empty_batch():
    for sched in (
        BatchSchedule.from_trtllm({4: 4}, max_batch=8),
        BatchSchedule.from_vllm([[1, 4, 3]], max_batch=8),
    ):
        assert sched.k_for(0) == 0 and ks(sched, [0, 1], max_batch=8) == [0, sched.k_for(1)]


def test_accept_ema_band_starts_with_its_ema_one_below_its_k():
    """EMA 3 at K=4: one step accepting 1 per row at weight 0.5 gives 2, so K=3 (from an EMA
    of 4 it would be 2.5 and K would stay 4)."""
    ema = AcceptEMA(k_max=4, max_batch=MAX_BATCH, ema_alpha=0.5, warmup_steps=0, update_interval=1)
    assert ema.predict(obs(batch=2), episode_start=[True])[0] == 4
    assert ema_step(ema, 4, 1.0) == 3


def test_accept_ema_steps_down_when_the_ema_reaches_the_threshold():
    """Down while ``EMA <= previous candidate - 0.5 + down_hysteresis``: at exactly 0.25 from
    K=2 with down_hysteresis -0.25, K drops to 1."""
    ema = _dead_band_ema()
    assert ema_step(ema, 2, 0.25) == 1


def test_accept_ema_refuses_band_ends_that_repeat():
    with pytest.raises(SpecrlError, match=r"band_ends must be increasing, got \[4, 4, 16\]"):
        AcceptEMA(k_max=4, max_batch=64, band_ends=[4, 4, 16])


def test_goodput_takes_the_smaller_k_on_a_tie():
    # Step time independent of K and nothing accepted: every K yields the same goodput.
    flat = linear_profile(verify_token_s=0.0, draft_base_s=0.0, draft_row_s=0.0)
    goodput = Goodput(flat, max_batch=MAX_BATCH, max_len=384, k_max=4)
    assert goodput.best_k(8, 96, 0.0) == 0


def test_goodput_reads_the_context_in_tokens():
    """The observation's context is a fraction of max_len; step times are looked up at the
    tokens it stands for (here a long context makes K=4 pay at batch 8, a short one K=1)."""
    profile = linear_profile(verify_token_s=1e-3, verify_kv_s=1e-5)
    goodput = Goodput(profile, max_batch=MAX_BATCH, max_len=4096, k_max=4, probe_k=2)
    assert [goodput.best_k(8, c, 0.8) for c in (0.25, 1024)] == [1, 4]
    assert goodput.predict(obs(batch=1, staleness=1.0), episode_start=[True])[0] == 2
    rate = drafted_acceptance(0.8, 2)
    assert goodput.predict(obs(batch=8, context=0.25, last_k=2 / 4, last_accept=rate))[0] == 4


def test_goodput_empty_batch_gets_k0_even_when_stale(goodput):
    assert goodput.predict(obs(batch=0, staleness=1.0), episode_start=[True])[0] == 0


def test_goodput_refuses_a_probe_above_k_max():
    with pytest.raises(SpecrlError, match=r"Goodput: probe_k must be in 1\.\.4, got 5"):
        Goodput(linear_profile(), max_batch=8, max_len=64, k_max=4, probe_k=5)


def _ktable(**changes):
    from specrl.table import KTable

    fields = {
        "k_max": 4,
        "max_batch": 16,
        "batch_buckets": [[1, 16]],
        "acceptance_edges": [0, 1],
        "k": [[0]],
        "stale_k": [0],
        "probe": {"after_steps": 40, "k": 2},
        "provenance": {
            "profile_sha256": "0" * 64,
            "profile_fingerprint": {"device": "cpu"},
            "target_id": "target",
            "draft_id": "draft",
            "run_id": "run-1",
            "training_steps": 1,
            "specrl_version": "0.1.0",
            "created": "2026-11-02T10:00:00+00:00",
        },
    }
    return KTable(**{**fields, **changes})


def test_lookup_policy_probes_at_once_at_every_episode_start():
    """An episode start counts as never measured, whatever the last episode measured: with
    ``after_steps`` 40 (above the observation's saturation) the first step still probes."""
    from specrl.policies import LookupPolicy

    policy = LookupPolicy(_ktable(), max_batch=16, k_max=4)
    start = obs(batch=12, max_batch=16, staleness=1.0)
    assert policy.predict(start, episode_start=[True])[0] == 2
    measured = obs(batch=12, max_batch=16, acceptance=0.3, staleness=0.0)
    assert policy.predict(measured, episode_start=[False])[0] == 0
    assert policy.predict(start, episode_start=[True])[0] == 2


def test_lookup_policy_rounds_the_context_to_tokens():
    """512 / 800 in float32, times 800, is just below 512: rounded, it opens the second bin."""
    from specrl.policies import LookupPolicy

    table = _ktable(context_bins=[[1, 511], [512, None]], k=[[[0], [3]]], stale_k=[[0, 0]])
    policy = LookupPolicy(table, max_batch=16, k_max=4, max_len=800)
    row = dict(batch=12, max_batch=16, acceptance=0.5, staleness=0.0)
    assert [policy.predict(obs(**row, context=c / 800))[0] for c in (511, 512, 800)] == [0, 3, 3]
