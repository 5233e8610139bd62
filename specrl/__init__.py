"""specrl: learn when speculative decoding pays, and with how many draft tokens.

Importing the package registers the Gymnasium ids ``specrl/LiveSpec-v0`` and
``specrl/SurrogateSpec-v0`` (see :mod:`specrl.envs`). The library never imports wandb or
stable-baselines3 at module level.
"""

__version__ = "0.1.0"

from specrl.errors import SpecrlError  # noqa: E402

__all__ = ["SpecrlError", "__version__"]
