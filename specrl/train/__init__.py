"""PPO training on the surrogate (``specrl train``, ``experiments/train_ppo.py``).

* :class:`TrainConfig`: one run, validated when made; :func:`load_config` reads a run's.
* :func:`train`: train, checkpoint, evaluate on held-out seeds, log to tensorboard and wandb.
* :func:`latest_checkpoint`: the newest checkpoint of a run directory, validated.

The training MDP itself is :class:`specrl.envs.training.TrainingEnv`. Importing this package
is light: the training modules (gymnasium, the envs) load on first use of their names, and
stable-baselines3 and wandb only when training starts.
"""

import importlib

from specrl.config import TrainConfig, load_config

_WHERE = {
    "Checkpoint": "specrl.train.checkpoint",
    "latest_checkpoint": "specrl.train.checkpoint",
    "EvalResult": "specrl.train.evaluate",
    "TrainResult": "specrl.train.run",
    "train": "specrl.train.run",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'specrl.train' has no attribute {name!r}")


__all__ = ["TrainConfig", "load_config", *_WHERE]
