"""The schedule search: each stack's class, the starts, the local search and smoothing."""

from __future__ import annotations

import numpy as np
import pytest
from search_helpers import small_scorer

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.policies.engineer import Scorer, tune_sweep, tune_threshold, workload_name
from specrl.train.search import (
    MIN_RISE_WORTH,
    WORST_WEIGHT,
    StackFormat,
    VersusEngineer,
    best_schedule,
    compare_engineers,
    compare_objective,
    engineer_starts,
    relative_objective,
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


class PlainScore:
    """What :func:`best_schedule` reads of a scorer besides its ``score``, as a plain
    ``Scorer`` has it (no engineers to be relative to)."""

    envs, seeds, episodes, surrogate_s = [], [1], 0, 0.0
    objective = Scorer.objective

    def prefetch(self, denses):
        pass

    def engineer_ratios(self, dense):
        return {}

    def engineer_methods(self):
        return {}


def test_a_rise_worth_less_than_the_bar_is_smoothed():
    # A scorer whose score rewards K=2 at batch 5-8 by a hair: the rise from 1 is flattened.
    class Fake(PlainScore):
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
    class OffIsBest(PlainScore):  # every K costs: off scores highest; TRT-LLM cannot say off
        def score(self, dense):
            return 100.0 - float(np.sum(dense))

    fmt = StackFormat("trtllm", k_max=2, max_batch=8)
    with pytest.warns(SpecrlWarning, match="cannot turn speculation off at batch 1"):
        result = best_schedule(fmt, OffIsBest(), {"K=1": np.full(9, 1)})
    assert result.dense.tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0]  # the least it can draft
    vllm = StackFormat("vllm", k_max=2, max_batch=8)
    result = best_schedule(vllm, OffIsBest(), {"K=1": np.full(9, 1)})
    assert result.dense[1:].tolist() == [0] * 8  # vLLM can say off


def test_the_score_is_over_each_workloads_own_engineer():
    scorer = small_scorer()
    engineer_starts(scorer, StackFormat("vllm", k_max=3, max_batch=16))  # the mix's tuning
    played = scorer.episodes
    objective = VersusEngineer(scorer, k_max=3, max_batch=16)
    # Beyond the mix's tuning, only each workload's own sweep is new.
    assert scorer.episodes - played <= len(scorer.envs) * len(scorer.envs) * len(scorer.seeds)
    for i, env in enumerate(scorer.envs):
        threshold = tune_threshold(env, seeds=scorer.seeds).tuning
        sweep = tune_sweep(env, seeds=scorer.seeds).tuning
        own = max(threshold, sweep, key=lambda t: t.tokens_per_s)
        assert objective.references[i] == pytest.approx(own.tokens_per_s)
        method, dense = objective.engineers[workload_name(env)]
        assert method == own.method
        assert objective.ratios(dense)[i] == pytest.approx(1.0)  # its own engineer: 1
    dense = np.full(17, 1)
    ratios = objective.ratios(dense)
    rates = [
        sum(r.tokens for r in runs) / sum(r.seconds for r in runs) for runs in scorer.play(dense)
    ]
    assert ratios == pytest.approx([r / ref for r, ref in zip(rates, objective.references)])
    mean = float(np.exp(np.mean(np.log(ratios))))
    assert objective.score(dense) == pytest.approx(
        WORST_WEIGHT * min(ratios) + (1 - WORST_WEIGHT) * mean
    )


def test_the_search_judged_against_each_engineer_records_each_workloads_ratio():
    scorer = small_scorer()
    objective = VersusEngineer(scorer, k_max=3, max_batch=16)
    fmt = StackFormat("vllm", k_max=3, max_batch=16)
    starts = engineer_starts(scorer, fmt)
    starts.update({f"{w}'s {m}": d for w, (m, d) in objective.engineers.items()})
    result = best_schedule(fmt, objective, starts)
    assert result.score == pytest.approx(objective.score(result.dense))
    for _, dense in objective.engineers.values():  # never below a workload's own engineer
        assert result.score >= objective.score(dense) - 1e-9
    assert list(result.ratios) == ["ramp", "bursts"]
    assert list(result.ratios.values()) == pytest.approx(objective.ratios(result.dense))
    chosen = result.to_json()
    assert chosen["objective"].startswith("over each workload's engineer")
    assert set(chosen["engineers"].values()) <= {"threshold", "sweep"}
    assert "over each workload's engineer: ramp " in result.describe()


def test_the_worst_workloads_weight_belongs_to_the_objective():
    """``worst_weight`` sets one objective's score and what its search records, and leaves
    the module's default (and every other objective) as it was; 0 is the geometric mean."""
    scorer = small_scorer()
    default = VersusEngineer(scorer, k_max=3, max_batch=16)
    plain = VersusEngineer(scorer, k_max=3, max_batch=16, worst_weight=0.0)
    dense = np.full(17, 1)
    ratios = plain.ratios(dense)
    assert ratios == default.ratios(dense)
    assert min(ratios) < max(ratios)  # the weight matters here
    assert plain.score(dense) == pytest.approx(float(np.exp(np.mean(np.log(ratios)))))
    assert default.score(dense) == pytest.approx(
        WORST_WEIGHT * min(ratios) + (1 - WORST_WEIGHT) * plain.score(dense)
    )
    assert plain.objective.startswith("over each workload's engineer (tokens/s ratio): 0 x")
    fmt = StackFormat("vllm", k_max=3, max_batch=16)
    result = best_schedule(fmt, plain, engineer_starts(scorer, fmt))
    assert result.to_json()["objective"] == plain.objective
    assert relative_objective() == default.objective  # the default is untouched
    with pytest.raises(SpecrlError, match="worst_weight must be within"):
        VersusEngineer(scorer, k_max=3, max_batch=16, worst_weight=1.5)


def test_two_workloads_of_one_name_each_keep_their_engineer():
    scorer = small_scorer(workloads=("ramp", "ramp"))
    objective = VersusEngineer(scorer, k_max=3, max_batch=16)
    assert list(objective.engineers) == ["ramp (1)", "ramp (2)"]
    assert len(objective.ratios(np.full(17, 1))) == 2


def test_own_start_names_use_the_possessive():
    from specrl.train.search import own_start_name

    assert own_start_name("mixed", "sweep") == "mixed's sweep"
    assert own_start_name("bursts", "threshold") == "bursts' threshold"
    assert own_start_name("bursts (2)", "sweep") == "bursts (2)'s sweep"


def test_a_stack_search_plays_eight_episodes_a_workload_and_thirty_two_in_all_at_least():
    from specrl.train.search import SEARCH_EPISODES, SEARCH_TOTAL_EPISODES, stack_search_episodes

    assert (SEARCH_EPISODES, SEARCH_TOTAL_EPISODES) == (8, 32)
    # One workload (--workload W or a trace): 32; the training mix of eight: 8 each.
    assert [stack_search_episodes(n) for n in (1, 2, 3, 4, 8, 12)] == [32, 16, 11, 8, 8, 8]


def test_a_search_on_more_seeds_also_starts_from_the_engineer_tuned_on_two():
    more = small_scorer(seeds=(50_000, 50_001, 50_002))
    two = small_scorer()
    for name in ("vllm", "trtllm"):
        fmt = StackFormat(name, k_max=3, max_batch=16)
        # The engineer as `specrl compare` tunes it: the mix's and each workload's own, on the
        # first two seeds, tuned here from scratch.
        expected = list(engineer_starts(two, fmt).values())
        for _, dense in VersusEngineer(two, k_max=3, max_batch=16).engineers.values():
            expected.append(dense)
        theirs = compare_objective(more, k_max=3, max_batch=16)
        assert theirs.scorer.seeds == [50_000, 50_001]
        added = compare_engineers(theirs, fmt, {})
        assert added and all(n.endswith(" (2 seeds)") for n in added)
        got = [tuple(d) for d in added.values()]
        for dense in expected:
            if name == "trtllm" and not fmt.feasible(dense):
                continue  # held to the format (nudged), as the search holds it
            assert tuple(dense) in got, (name, dense)
        # Those already among the starts are not added twice; on two seeds, none at all.
        assert compare_engineers(theirs, fmt, dict(added)) == {}
        assert compare_objective(two, k_max=3, max_batch=16) is None
        assert compare_engineers(None, fmt, {}) == {}
        result = best_schedule(fmt, more, {**engineer_starts(more, fmt), **added})
        for dense in added.values():
            assert result.score >= more.score(np.asarray(dense)) - 1e-9


class Table(PlainScore):
    """A score read from a dict: each schedule's K at batch 1 and 5 sets its score."""

    def __init__(self, values: dict, seeds=(1,)):
        self.values, self.seeds = values, list(seeds)

    def score(self, dense):
        return self.values.get((int(dense[1]), int(dense[5])), 100.0)


def test_a_start_better_on_the_tuning_seeds_alone_does_not_replace_the_incumbent():
    fmt = StackFormat("vllm", k_max=3, max_batch=8)
    sweep, eager = np.full(9, 1), np.full(9, 2)
    starts = {"sweep": sweep, "eager": eager}
    tune = Table({(2, 2): 101.0})  # eager 1% better on the tuning seeds
    lucky = Table({(2, 2): 100.05}, seeds=(7,))  # and 0.05% on the confirmation seeds
    result = best_schedule(fmt, tune, starts, confirm=lucky, incumbent="sweep")
    assert result.start == "sweep" and result.dense[1:].tolist() == sweep[1:].tolist()
    assert result.incumbent == "sweep"
    assert result.starts == {"sweep": 100.0, "eager": 101.0}
    assert result.starts_confirm == {"sweep": 100.0, "eager": 100.05}
    assert result.score_confirm == 100.0 and result.confirm_seeds == [7]
    chosen = result.to_json()
    assert chosen["incumbent"] == "sweep" and chosen["confirm_seeds"] == [7]
    assert "the incumbent, sweep, gives way only to" in result.describe()
    # Held on the confirmation seeds too, it replaces the incumbent.
    held = Table({(2, 2): 100.5}, seeds=(7,))
    result = best_schedule(fmt, tune, starts, confirm=held, incumbent="sweep")
    assert result.start == "eager" and result.dense[1:].tolist() == eager[1:].tolist()
    # No start named the incumbent: the best on the tuning seeds, and the file says so.
    result = best_schedule(fmt, tune, starts, confirm=held, incumbent="absent")
    assert result.start == "eager" and result.incumbent is None
    assert "no start holds the engineer's schedules" in result.describe()
    # With no confirmation seeds the best start on the tuning seeds is kept, as before.
    result = best_schedule(fmt, tune, starts)
    assert result.start == "eager" and result.incumbent is None
    assert "confirm_seeds" not in result.to_json()


def test_the_incumbent_is_the_better_of_the_engineers_two_on_both_sets_of_seeds():
    fmt = StackFormat("vllm", k_max=3, max_batch=8)
    sweep, threshold = np.full(9, 1), np.full(9, 2)
    starts = {"sweep": sweep, "threshold": threshold}
    # The threshold 0.05% better on the tuning seeds and level on the confirmation ones:
    # too little to replace an incumbent, enough to be the better of the engineer's two.
    tune, held = Table({(2, 2): 100.05}), Table({}, seeds=(7,))
    result = best_schedule(fmt, tune, starts, confirm=held, incumbent=["sweep", "threshold"])
    assert result.incumbent == "threshold" and result.start == "threshold"
    assert result.dense[1:].tolist() == threshold[1:].tolist()
    result = best_schedule(fmt, tune, starts, confirm=held, incumbent="sweep")
    assert result.incumbent == "sweep" and result.start == "sweep"
    # Level on both sets: the first named; a name no start holds is passed over.
    level = Table({})
    result = best_schedule(fmt, level, starts, confirm=held, incumbent=["sweep", "threshold"])
    assert result.incumbent == "sweep"
    result = best_schedule(fmt, tune, starts, confirm=held, incumbent=["absent", "sweep"])
    assert result.incumbent == "sweep"


def test_a_move_is_kept_only_where_it_gains_on_the_confirmation_seeds_too():
    fmt = StackFormat("vllm", k_max=3, max_batch=8)
    start = np.full(9, 1)
    up = Table({(2, 1): 101.0})  # K=2 at batch 1 only: one move (bucket 1) up
    result = best_schedule(fmt, up, {"sweep": start}, confirm=Table({}, (7,)), incumbent="sweep")
    assert result.moves == 0 and result.dense[1:].tolist() == start[1:].tolist()
    result = best_schedule(
        fmt, up, {"sweep": start}, confirm=Table({(2, 1): 100.2}, (7,)), incumbent="sweep"
    )
    assert result.moves == 1 and result.dense[1:].tolist() == [2, 1, 1, 1, 1, 1, 1, 1]
    assert result.score == 101.0 and result.score_confirm == 100.2


def test_the_incumbent_is_the_sweep_specrl_compare_tunes_held_to_the_format():
    from specrl.policies.engineer import tune_sweep_trtllm
    from specrl.train.search import incumbent_start

    scorer = small_scorer()
    for name in ("vllm", "trtllm"):
        fmt = StackFormat(name, k_max=3, max_batch=16)
        starts = {"all K=1": np.full(17, 1), **engineer_starts(scorer, fmt)}
        found = incumbent_start(scorer, fmt, starts)
        assert found is not None and found.startswith("sweep"), (name, found)
        if name == "trtllm":  # the nudge the sweep:trtllm baseline serves
            for env in scorer.envs[:1]:
                one = small_scorer(workloads=(workload_name(env),))
                own = engineer_starts(one, fmt)
                picked = incumbent_start(one, fmt, own)
                served = tune_sweep_trtllm(env, seeds=one.seeds).table[:, 0]
                assert np.array_equal(fmt.express(own[picked])[1:], served[1:])
    assert incumbent_start(scorer, StackFormat("vllm", k_max=3, max_batch=16), {}) is None


def test_the_engineers_incumbents_are_its_sweep_and_threshold_as_specrl_compare_tunes_them():
    from specrl.policies.engineer import best_threshold, threshold_dense
    from specrl.train.search import engineer_incumbents, incumbent_start

    scorer = small_scorer()
    k, b, _ = best_threshold(scorer, 3, 16)
    for name in ("vllm", "trtllm"):
        fmt = StackFormat(name, k_max=3, max_batch=16)
        starts = {"all K=1": np.full(17, 1), **engineer_starts(scorer, fmt)}
        found = engineer_incumbents(scorer, fmt, starts)
        assert found[0] == incumbent_start(scorer, fmt, starts)
        held = fmt.express(starts[found[-1]])
        assert np.array_equal(held[1:], fmt.express(threshold_dense(k, b, 16))[1:]), name
        assert len(found) == len(set(found))
    assert engineer_incumbents(scorer, StackFormat("vllm", k_max=3, max_batch=16), {}) == []
