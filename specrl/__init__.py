"""specrl: learn when speculative decoding pays, and with how many draft tokens.

Importing the package registers the Gymnasium ids ``specrl/LiveSpec-v0`` and
``specrl/SurrogateSpec-v0`` (see :mod:`specrl.envs`). The library never imports wandb or
stable-baselines3 at module level.
"""

__version__ = "0.1.0"

from specrl.errors import SpecrlError  # noqa: E402


def _register_envs() -> None:
    import gymnasium

    for env_id, entry_point, nondeterministic in (
        # Live step times are measured, so a seed cannot fix them.
        ("specrl/LiveSpec-v0", "specrl.envs.live:LiveSpecEnv", True),
        ("specrl/SurrogateSpec-v0", "specrl.envs.surrogate:SurrogateSpecEnv", False),
    ):
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=entry_point, nondeterministic=nondeterministic)


_register_envs()

__all__ = ["SpecrlError", "__version__"]
