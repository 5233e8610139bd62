"""PPO training on the surrogate (``specrl train``, ``experiments/train_ppo.py``).

* :class:`TrainConfig`: one run, validated when made; :func:`load_config` reads a run's.
* :func:`train`: train, checkpoint, evaluate on held-out seeds, log to tensorboard and wandb.
* :func:`latest_checkpoint`: the newest checkpoint of a run directory, validated.

Importing this package is light: the training module (gymnasium, the envs) loads on first
use of its names, and stable-baselines3 and wandb only when training starts.
"""

from specrl.train.config import TrainConfig, load_config

_RUN_NAMES = ("Checkpoint", "EvalResult", "TrainResult", "latest_checkpoint", "train")


def __getattr__(name: str):
    if name in _RUN_NAMES:
        from specrl.train import run

        return getattr(run, name)
    raise AttributeError(f"module 'specrl.train' has no attribute {name!r}")


__all__ = ["TrainConfig", "load_config", *_RUN_NAMES]
