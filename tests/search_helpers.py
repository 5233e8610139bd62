"""A :class:`~specrl.policies.engineer.Scorer` on small surrogate episodes, shared by the tests
of the stacks' schedule search and the native table's."""

from __future__ import annotations

from specrl.envs import SurrogateSpecEnv
from specrl.policies.engineer import Scorer
from specrl.profile.synthetic import linear_profile


def small_scorer(workloads=("ramp", "bursts"), max_batch=16, k_max=3, seeds=(50_000, 50_001)):
    """Episodes of 24 requests on the linear profile, batch up to ``max_batch``."""
    envs = [
        SurrogateSpecEnv(
            profile=linear_profile(),
            workload=w,
            workload_kwargs={"n_requests": 24, "peak": max_batch},
            max_batch=max_batch,
            k_max=k_max,
        )
        for w in workloads
    ]
    return Scorer(envs, list(seeds))
