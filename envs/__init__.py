"""Gymnasium environments around the speculative decoding loop (installed as ``specrl.envs``).

* ``specrl/LiveSpec-v0``: :class:`LiveSpecEnv`, the real engine serving a workload.
* ``specrl/SurrogateSpec-v0``: :class:`SurrogateSpecEnv`, driven by a measured hardware
  profile; the fast place to train.

Both are registered on ``import specrl``. Creating a live env loads models; importing does not.
"""

from specrl.envs.base import OBS_NAMES
from specrl.envs.live import LiveSpecEnv
from specrl.envs.rollout import EpisodeResult, run_episode
from specrl.envs.surrogate import SurrogateSpecEnv, default_profile_path

__all__ = [
    "OBS_NAMES",
    "EpisodeResult",
    "LiveSpecEnv",
    "SurrogateSpecEnv",
    "default_profile_path",
    "run_episode",
]
