"""The schedule search: each stack's class, the starts, the local search and smoothing."""

from __future__ import annotations

import numpy as np
import pytest
from search_helpers import small_scorer

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.train.search import (
    MIN_RISE_WORTH,
    StackFormat,
    best_schedule,
    engineer_starts,
    search_buckets,
)


def _dense(*ks):
    return np.array([0, *ks])


def test_each_format_writes_what_its_stack_reads_back():
    dense = _dense(3, 3, 2, 2, 2, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
    for name in ("vllm", "trtllm", "sglang"):
        fmt = StackFormat(name, k_max=3, max_batch=16)
        assert fmt.feasible(dense), name
        assert np.array_equal(fmt.read(fmt.write(dense)), dense), name
    assert StackFormat("trtllm", k_max=3, max_batch=16).write(dense) == {
        "max_draft_len": 3,
        "draft_len_schedule": {2: 3, 6: 2, 8: 1},
    }


def test_what_each_format_cannot_hold():
    trt = StackFormat("trtllm", k_max=3, max_batch=16)
    rising = _dense(1, 1, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    assert not trt.feasible(rising)  # the smallest key's value must be the largest
    assert np.array_equal(trt.express(rising), np.minimum(rising, 1))
    off_at_1 = _dense(0, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    assert trt.express(off_at_1) is None
    sgl = StackFormat("sglang", k_max=3, max_batch=16, cuda_graph_bs=[1, 2, 4, 8, 16])
    split = _dense(2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)  # 3-4 pad to 4
    assert not sgl.feasible(split)
    assert sgl.feasible(_dense(2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1))
    assert StackFormat("vllm", k_max=3, max_batch=16).feasible(split)
    with pytest.raises(SpecrlError, match="unknown stack format 'native'"):
        StackFormat("native", k_max=3, max_batch=16)


def test_search_buckets_never_split_an_sglang_padding_group():
    from specrl.table.sglang import SGLANG_CUDA_GRAPH_BS

    for lo, hi in search_buckets(160):
        assert hi in SGLANG_CUDA_GRAPH_BS, (lo, hi)


def test_the_search_is_never_worse_than_any_start_and_says_how_it_chose():
    scorer = small_scorer()
    for name in ("vllm", "trtllm", "sglang"):
        fmt = StackFormat(name, k_max=3, max_batch=16)
        starts = engineer_starts(scorer, fmt)
        starts["all K=1"] = np.full(17, 1)
        result = best_schedule(fmt, scorer, starts)
        assert result.score >= max(result.starts.values()) - 1e-9, name
        assert result.score == pytest.approx(scorer.score(result.dense))
        assert fmt.feasible(result.dense)
        assert np.array_equal(fmt.read(result.config), result.dense)
        assert result.seeds == [50_000, 50_001]
        assert result.workloads == ["ramp", "bursts"]
        assert result.to_json()["start"] in result.starts
        for rise in result.rises:  # what is left rising is worth keeping
            assert rise["worth"] >= MIN_RISE_WORTH or result.score == max(result.starts.values())
        assert result.describe().startswith(f"{name}: searched from ")


def test_trtllm_starts_hold_the_sweep_nudged_to_the_smallest_key_rule():
    scorer = small_scorer()
    fmt = StackFormat("trtllm", k_max=3, max_batch=16)
    starts = engineer_starts(scorer, fmt)
    assert "threshold" in starts
    for name, dense in starts.items():
        if name.startswith("sweep"):
            assert fmt.feasible(dense), name


def test_a_start_the_format_cannot_hold_is_left_out_and_none_is_an_error():
    scorer = small_scorer(workloads=("bursts",))
    fmt = StackFormat("trtllm", k_max=3, max_batch=16)
    off_at_1 = np.zeros(17, dtype=np.int64)
    off_at_1[2:5] = 2
    with pytest.raises(SpecrlError, match="TensorRT-LLM needs K >= 1 at batch 1"):
        best_schedule(fmt, scorer, {"off at batch 1": off_at_1})
    result = best_schedule(fmt, scorer, {"off at batch 1": off_at_1, "K=1": np.full(17, 1)})
    assert list(result.starts) == ["K=1"]


def test_a_rise_worth_less_than_the_bar_is_smoothed():
    # A scorer whose score rewards K=2 at batch 5-8 by a hair: the rise from 1 is flattened.
    class Fake:
        envs, seeds, episodes, surrogate_s = [], [1], 0, 0.0

        def prefetch(self, denses):
            pass

        def score(self, dense):
            return 100.0 + 0.1 * (dense[5] == 2) - 0.5 * (dense[1] != 1)

    fmt = StackFormat("vllm", k_max=2, max_batch=8)
    start = _dense(1, 1, 1, 1, 2, 2, 2, 2)
    result = best_schedule(fmt, Fake(), {"start": start})
    assert result.rises == []  # worth 0.1%: flattened, in the start as in the result
    assert result.dense.tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert result.starts == {"start": 100.0}

    class Worthy(Fake):
        def score(self, dense):
            return 100.0 + 1.0 * (dense[5] == 2) - 5.0 * (dense[1] != 1)

    result = best_schedule(fmt, Worthy(), {"start": start})
    assert result.dense.tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert result.rises == [{"batch": 5, "from": 1, "to": 2, "worth": round(1 / 101, 5)}]


def test_trtllm_warns_when_off_beats_every_schedule_it_can_express():
    class OffIsBest:  # every K costs: off scores highest, and TensorRT-LLM cannot say off
        envs, seeds, episodes, surrogate_s = [], [1], 0, 0.0

        def prefetch(self, denses):
            pass

        def score(self, dense):
            return 100.0 - float(np.sum(dense))

    fmt = StackFormat("trtllm", k_max=2, max_batch=8)
    with pytest.warns(SpecrlWarning, match="cannot turn speculation off at batch 1"):
        result = best_schedule(fmt, OffIsBest(), {"K=1": np.full(9, 1)})
    assert result.dense.tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0]  # the least it can draft
    vllm = StackFormat("vllm", k_max=2, max_batch=8)
    result = best_schedule(vllm, OffIsBest(), {"K=1": np.full(9, 1)})
    assert result.dense[1:].tolist() == [0] * 8  # vLLM can say off
