"""The myopic oracle: the best K for the coming step from what only the simulator knows."""

from __future__ import annotations

import numpy as np

from specrl.errors import SpecrlError
from specrl.policies.base import KPolicy

LIVE_REFUSAL = (
    "the oracle reads the surrogate's true per-request acceptance; it cannot run in the live env"
)


class Oracle(KPolicy):
    """Per step, the K maximizing expected committed tokens / expected seconds of the coming
    step, from each request's *true* acceptance (``SurrogateSpecEnv.oracle_k``).

    No serving stack can run it: it reads the surrogate's per-request acceptance, which a
    live engine never observes. It is an upper reference for per-step choices, not a bound
    on a policy: it is myopic (blind to how K now changes later steps, e.g. the draft's
    catch-up after K=0 or which requests finish together), so a learned policy may beat it.

    :param env: a :class:`~specrl.envs.SurrogateSpecEnv`, possibly wrapped; the policy reads
        the env's current state, so score it on that same env, one env at a time.
    """

    def __init__(self, env):
        from specrl.envs.surrogate import SurrogateSpecEnv

        base = getattr(env, "unwrapped", None)
        if not isinstance(base, SurrogateSpecEnv):
            raise SpecrlError(
                f"{LIVE_REFUSAL} (got {type(env).__name__}); use it with SurrogateSpecEnv "
                "(`--env surrogate`)"
            )
        self.env = base
        self.name = "oracle"

    def _act(self, rows, starts):
        if len(rows) != 1:
            raise SpecrlError(
                f"the oracle reads one env's state; got {len(rows)} observations at once "
                "(evaluate it with n_envs=1)"
            )
        return np.array([self.env.oracle_k()])
