"""Gymnasium environments around the speculative decoding loop (installed as ``specrl.envs``).

* ``specrl/LiveSpec-v0``: :class:`LiveSpecEnv`, the real engine serving a workload.
* ``specrl/SurrogateSpec-v0``: :class:`SurrogateSpecEnv`, driven by a measured hardware
  profile; the fast place to train.

Both are registered on ``import specrl``. Creating a live env loads models; importing does not.
The names below load their modules (and gymnasium) when first used, so the ``specrl``
command line runs ``specrl profile`` and ``specrl bench engine``
where gymnasium is not installed (a GPU machine that has only torch and transformers).

:class:`TrainingEnv` (:mod:`specrl.envs.training`) is the MDP PPO trains on: a wrapper over
either env that observes what an exported table indexes, applies its probe rule and pays a
reward per batch size.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_WHERE = {
    "OBS_NAMES": "specrl.envs.base",
    "LiveSpecEnv": "specrl.envs.live",
    "EpisodeResult": "specrl.envs.rollout",
    "run_episode": "specrl.envs.rollout",
    "run_interleaved": "specrl.envs.rollout",
    "SurrogateSpecEnv": "specrl.envs.surrogate",
    "default_profile_path": "specrl.envs.surrogate",
    "RateReference": "specrl.envs.training",
    "TrainingEnv": "specrl.envs.training",
}

__all__ = [
    "OBS_NAMES",
    "EpisodeResult",
    "LiveSpecEnv",
    "RateReference",
    "SurrogateSpecEnv",
    "TrainingEnv",
    "default_profile_path",
    "run_episode",
    "run_interleaved",
]

if TYPE_CHECKING:
    from specrl.envs.base import OBS_NAMES
    from specrl.envs.live import LiveSpecEnv
    from specrl.envs.rollout import EpisodeResult, run_episode, run_interleaved
    from specrl.envs.surrogate import SurrogateSpecEnv, default_profile_path
    from specrl.envs.training import RateReference, TrainingEnv


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})  # a name once used is in both
