"""specrl: learn when speculative decoding pays, and with how many draft tokens.

Importing the package registers the Gymnasium ids ``specrl/LiveSpec-v0`` and
``specrl/SurrogateSpec-v0`` (see :mod:`specrl.envs`) without importing gymnasium itself: if
gymnasium is loaded already they are registered at once, otherwise the moment it is
imported. So a serving stack that imports ``specrl.controller`` loads neither gymnasium nor
numpy. The library never imports wandb or stable-baselines3 at module level.
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


class _RegisterOnImport:
    """A ``sys.meta_path`` finder for ``gymnasium`` alone: it lets the other finders find the
    module and registers specrl's envs once the module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "gymnasium":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegisterOnImport)]
            _register_envs()

        spec.loader.exec_module = exec_and_register
        return spec


import sys  # noqa: E402

if sys.modules.get("gymnasium") is not None:  # None: imports of it are blocked
    _register_envs()
elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterOnImport())

__all__ = ["SpecrlError", "__version__"]
