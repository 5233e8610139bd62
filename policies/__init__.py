"""PPO and the baseline K controllers (installed as ``specrl.policies``).

Every controller has SB3's ``predict(obs, state=None, episode_start=None,
deterministic=False)`` (``PPOPolicy``'s defaults to True; the baselines ignore it) and a
short ``name`` for result tables. By command-line name
(:func:`make_policy`): ``off``, ``fixed:K``, ``threshold:K:B``, ``schedule:FILE``, ``hf``,
``ema``, ``goodput``, ``oracle``, ``ppo:RUN_DIR``, ``lookup:TABLE.json``.
"""

from specrl.policies.adaptive import AcceptEMA, HFHeuristic
from specrl.policies.base import KPolicy, StatefulKPolicy
from specrl.policies.fixed import BatchThreshold, FixedK
from specrl.policies.goodput import Goodput
from specrl.policies.lookup import LookupPolicy
from specrl.policies.oracle import Oracle
from specrl.policies.ppo import PPOPolicy
from specrl.policies.registry import default_policies, make_policies, make_policy
from specrl.policies.schedule import CONTEXT_INFINITY, BatchSchedule
from specrl.policy_names import VALID_FORMS, parse_policies

__all__ = [
    "CONTEXT_INFINITY",
    "VALID_FORMS",
    "AcceptEMA",
    "BatchSchedule",
    "BatchThreshold",
    "FixedK",
    "Goodput",
    "HFHeuristic",
    "KPolicy",
    "LookupPolicy",
    "Oracle",
    "PPOPolicy",
    "StatefulKPolicy",
    "default_policies",
    "make_policies",
    "make_policy",
    "parse_policies",
]
