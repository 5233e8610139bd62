"""``specrl bench episodes``: surrogate episodes on every core against one process, side by
side in one run, with the results compared episode for episode."""

from __future__ import annotations

import dataclasses
import time

WORKLOADS = ("ramp", "day", "bursts", "mixed")


def _tuning(profile, sizes: dict) -> tuple:
    """The engineer's threshold and sweep tuned on the tuning seeds of :data:`WORKLOADS` at
    once (what the export's search starts from): the choices, every candidate's episodes,
    and their count."""
    import numpy as np

    from specrl.envs import SurrogateSpecEnv
    from specrl.policies.engineer import (
        Scorer,
        best_sweep,
        best_threshold,
        threshold_candidates,
        threshold_dense,
        tuning_seeds,
    )

    max_batch = sizes["max_batch"]
    envs = [
        SurrogateSpecEnv(
            profile=profile, workload=w, k_max=4, max_batch=max_batch, workload_kwargs=_kw(sizes)
        )
        for w in WORKLOADS
    ]
    scorer = Scorer(envs, tuning_seeds())
    k, b, scores = best_threshold(scorer, 4, max_batch)
    bucket_k, _ = best_sweep(scorer, 4, max_batch)
    candidates = [threshold_dense(k, b, max_batch) for k, b in threshold_candidates(4, max_batch)]
    candidates += [np.full(max_batch + 1, k) for k in range(5)]
    played = [  # all played already: looked up, not played again
        [[dataclasses.asdict(r) for r in runs] for runs in scorer.play(d)] for d in candidates
    ]
    return (k, b, scores, bucket_k), played, scorer.episodes


def _kw(sizes: dict) -> dict:
    n = sizes["n_requests"]
    return {"peak": sizes["max_batch"]} | ({"n_requests": n} if n else {})


def _comparison(profile, sizes: dict, episodes: int) -> tuple:
    """Every default policy in the surrogate on :data:`WORKLOADS`, held-out seeds."""
    from specrl.compare import compare_surrogate
    from specrl.policies import default_policies
    from specrl.seeds import HELD_OUT_SEED

    reports = compare_surrogate(
        profile,
        WORKLOADS,
        default_policies(4),
        episodes=episodes,
        seed=HELD_OUT_SEED,
        max_batch=sizes["max_batch"],
        n_requests=sizes["n_requests"],
        progress=False,
    )
    results = [[dataclasses.asdict(r) for r in report.results] for report in reports]
    return results, sum(len(report.results) * episodes for report in reports)


def run(
    *,
    profile: str | None,
    workers: int | None,
    episodes: int,
    max_batch: int,
    n_requests: int | None = None,
) -> int:
    """Time the engineer's tuning and a comparison in one process, then on the pool; print
    the wall times, their ratio and whether every result is the same."""
    from specrl.envs import default_profile_path
    from specrl.policies.episode_pool import default_workers, parallel_episodes
    from specrl.profile import load_profile

    prof = load_profile(profile or default_profile_path())
    workers = default_workers() if workers is None else workers
    sizes = {"max_batch": max_batch, "n_requests": n_requests}
    jobs = {
        "the engineer's tuning on 4 workloads": lambda: _tuning(prof, sizes),
        f"every default policy on 4 workloads, {episodes} held-out episode"
        + ("s" * (episodes > 1)): lambda: _comparison(prof, sizes, episodes),
    }
    print(f"one process against {workers} workers (the pool's start included):")
    for name, job in jobs.items():
        walls, outs = [], []
        for n in (1, workers):
            start = time.perf_counter()
            with parallel_episodes(n):
                outs.append(job())
            walls.append(time.perf_counter() - start)
        same = "same results" if outs[0] == outs[1] else "RESULTS DIFFER"
        print(
            f"  {name}: {outs[0][-1]} episodes, {walls[0]:.1f} s against {walls[1]:.1f} s, "
            f"ratio {walls[1] / walls[0]:.2f}; {same}"
        )
        if outs[0] != outs[1]:
            return 1
    return 0
