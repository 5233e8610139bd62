"""Surrogate episodes on every core (:mod:`specrl.policies.episode_pool`): the same episodes,
tuning and searched schedules as in one process."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specrl.envs import SurrogateSpecEnv
from specrl.errors import SpecrlError
from specrl.policies import episode_pool
from specrl.policies.engineer import Scorer, best_sweep, best_threshold, shared_episodes
from specrl.policies.episode_pool import parallel_episodes, play_schedules
from specrl.profile.synthetic import linear_profile


def _envs():
    return [
        SurrogateSpecEnv(
            profile=linear_profile(),
            workload=w,
            max_batch=8,
            k_max=3,
            workload_kwargs={"n_requests": 16, "peak": 8},
        )
        for w in ("ramp", "bursts")
    ]


def _tune(seeds=(0, 1)):
    scorer = Scorer(_envs(), list(seeds))
    return scorer, best_threshold(scorer, 3, 8), best_sweep(scorer, 3, 8)


def test_the_pool_plays_every_episode_as_one_process_does(monkeypatch):
    monkeypatch.delenv(episode_pool.WORKERS_ENV, raising=False)
    alone, threshold, sweep = _tune()
    tasks = [(env, np.full(9, k), seed) for env in _envs() for k in (0, 2) for seed in (3, 4)]
    serial = play_schedules(tasks)
    with parallel_episodes(workers=2):
        assert episode_pool._pool is not None
        pooled, threshold2, sweep2 = _tune()
        assert [dataclasses.asdict(r) for r in play_schedules(tasks)] == [
            dataclasses.asdict(r) for r in serial
        ]
        with parallel_episodes(workers=2):  # nested: the outer pool
            assert episode_pool._pool is not None
    assert episode_pool._pool is None
    assert threshold2 == threshold and sweep2 == sweep
    assert (pooled.episodes, pooled.surrogate_s) == (alone.episodes, alone.surrogate_s)
    # envs x seeds x (thresholds + off): K at every batch size is the threshold at 8 rows
    assert alone.episodes == 2 * 2 * (len(threshold[2]) + 1)


def test_shared_episodes_are_played_once_on_the_pool(monkeypatch):
    calls = []
    real = episode_pool.play_schedules

    def counting(tasks):
        calls.append(len(tasks))
        return real(tasks)

    monkeypatch.setattr("specrl.policies.engineer.play_schedules", counting)
    with shared_episodes(), parallel_episodes(workers=2):
        first = Scorer(_envs(), [0, 1])
        first.prefetch([np.full(9, 1), np.full(9, 2), np.full(9, 1)])  # one repeated
        second = Scorer(_envs(), [1, 2])  # seed 1 shared with the first
        second.prefetch([np.full(9, 1)])
        assert calls == [2 * 2 * 2, 2 * 1]
        assert second.episodes == 4  # counted as played, as outside the pool


def test_workers_come_from_the_environment_or_the_cores(monkeypatch):
    monkeypatch.setenv(episode_pool.WORKERS_ENV, "1")
    with parallel_episodes():
        assert episode_pool._pool is None  # one worker: this process
    monkeypatch.setenv(episode_pool.WORKERS_ENV, "many")
    with pytest.raises(SpecrlError, match="SPECRL_WORKERS='many'"):
        with parallel_episodes():
            pass
    monkeypatch.delenv(episode_pool.WORKERS_ENV)
    assert episode_pool.default_workers() == episode_pool.usable_cores()
    with pytest.raises(SpecrlError, match="workers: 0"):
        with parallel_episodes(workers=0):
            pass


class _Dies:
    """An env that kills the worker process that plays it."""

    max_batch, k_max = 8, 3

    def reset(self, seed=None, options=None):
        import os

        os._exit(3)


def test_a_worker_that_dies_is_an_error_that_names_the_way_out():
    with parallel_episodes(workers=2):
        with pytest.raises(SpecrlError, match="SPECRL_WORKERS=1"):
            play_schedules([(_Dies(), np.full(9, 1), 0), (_Dies(), np.full(9, 1), 1)])


def test_a_surrogate_comparison_on_the_pool_reads_as_in_one_process(monkeypatch):
    """Every default policy (the oracle holds its env; hf and ema keep state within an
    episode; the engineer's are tuned), and one that pickle refuses, which plays here."""
    from specrl.compare import compare_policies
    from specrl.policies import default_policies, make_policies
    from specrl.policies.fixed import FixedK

    class Unpicklable(FixedK):
        def __init__(self):
            super().__init__(2)
            self.name = "unpicklable"
            self.hook = lambda: None  # pickle refuses a lambda

    def compare():
        env = _envs()[1]
        policies = [*make_policies(default_policies(3), env=env), Unpicklable()]
        report = compare_policies(env, policies, seed=7, episodes=2, progress=False)
        return [dataclasses.asdict(r) for r in report.results]

    monkeypatch.delenv(episode_pool.WORKERS_ENV, raising=False)
    alone = compare()
    with parallel_episodes(workers=2):
        assert compare() == alone
    assert [r["policy"] for r in alone][-2:] == ["oracle", "unpicklable"]


@pytest.mark.slow  # about 18 s; the pool's agreement with one process is tested above
def test_bench_episodes_prints_both_ratios_and_that_the_results_agree(tmp_path, capsys):
    import re

    from specrl.cli import main

    linear_profile().save(tmp_path / "p.json")
    args = ["bench", "episodes", "--profile", str(tmp_path / "p.json"), "--max-batch", "8"]
    assert main([*args, "--n-requests", "12", "--episodes", "1", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "one process against 2 workers (the pool's start included):"
    lines = re.findall(
        r"^  (.+): (\d+) episodes, [\d.]+ s against [\d.]+ s, ratio [\d.]+; (.+)$", out, flags=re.M
    )
    # 4 workloads x 2 tuning seeds x (12 thresholds + off); 12 default policies x 4 x 1
    assert lines == [
        ("the engineer's tuning on 4 workloads", "104", "same results"),
        ("every default policy on 4 workloads, 1 held-out episode", "48", "same results"),
    ]
