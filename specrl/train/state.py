"""What a checkpoint saves besides the model, and puts back on resume: the global RNGs, the
reward-normalisation statistics and the training envs (a surrogate run's mid-episode, a live
run's random streams)."""

from __future__ import annotations

import base64
import hashlib
import io
import pickle
import random

import gymnasium as gym
import numpy as np

from specrl.envs.training import RateReference
from specrl.errors import SpecrlError


def rng_state() -> dict:
    """The global RNGs SB3 draws from (python, numpy's legacy one, torch's CPU one), as
    JSON."""
    import torch

    version, mt, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    return {
        "python": [version, list(mt), gauss],
        "numpy": {
            "key": numpy_state["state"]["key"].tolist(),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }


def set_rng_state(state: dict) -> None:
    import torch

    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": np.array(np_state["key"], dtype=np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    raw = bytearray(base64.b64decode(state["torch"]))
    torch.set_rng_state(torch.frombuffer(raw, dtype=torch.uint8).clone())


def vec_normalize_state(vec_env) -> dict | None:
    from stable_baselines3.common.vec_env import VecNormalize

    if not isinstance(vec_env, VecNormalize):
        return None
    rms = vec_env.ret_rms
    return {
        "mean": float(rms.mean),
        "var": float(rms.var),
        "count": float(rms.count),
        "returns": vec_env.returns.tolist(),
    }


def set_vec_normalize_state(vec_env, state: dict) -> None:
    rms = vec_env.ret_rms
    rms.mean, rms.var, rms.count = (np.float64(state[k]) for k in ("mean", "var", "count"))
    vec_env.returns = np.array(state["returns"], dtype=np.float64)


def _layers(env) -> list:
    """``env`` and the envs it wraps, outermost first (Monitor, then the training env)."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _digest(value) -> str:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest()


OLD_TRAINING_ENV = ("specrl.train.run", "TrainingEnv")
"""Where the surrogate's training env was defined before :mod:`specrl.envs.training`: envs
pickled then cannot be rebuilt as its wrappers, and their run goes on from fresh episodes."""


class _OldTrainingEnv(Exception):
    """Raised while unpickling envs that name :data:`OLD_TRAINING_ENV`."""


class SurrogateEpisodes:
    """The surrogate training envs as they stand mid-episode, pickled into a checkpoint
    (:data:`~specrl.config.ENVS_FILE`) and restored on resume, so that a resumed run
    steps on exactly as the run would have had it never stopped.

    The envs are pickled whole, wrappers and all, but for two kinds of object, written as
    references: the reward's reference (shared by the envs and checkpointed on its own; the
    restored envs share the resuming run's), and the large values an env was built with and
    still holds unchanged (the profile's cost tables, megabytes per env), which the restore
    takes from the envs the resuming run built from the same config, each checked against
    its digest.
    """

    LARGE = 64 * 1024
    """Bytes pickled from which a value the envs were built with is referenced, not copied."""

    def __init__(self, vec_env, reference: RateReference):
        self.venv = vec_env.unwrapped  # the DummyVecEnv, under any VecNormalize
        self.reference = reference
        self.built: dict[int, tuple[int, int, str, str]] = {}
        """``id`` of a large value an env was built with -> (env, layer, attribute, digest)."""
        for i, env in enumerate(self.venv.envs):
            for j, layer in enumerate(_layers(env)):
                for name, value in vars(layer).items():
                    if isinstance(value, (gym.Env, RateReference)):
                        continue
                    blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
                    if len(blob) >= self.LARGE:
                        self.built[id(value)] = (i, j, name, hashlib.sha256(blob).hexdigest())

    def dumps(self) -> bytes:
        built, reference, unchanged = self.built, self.reference, {}

        class Pickler(pickle.Pickler):
            def persistent_id(self, obj):
                if obj is reference:
                    return ("reference",)
                where = built.get(id(obj))
                if where is None:
                    return None
                if id(obj) not in unchanged:
                    unchanged[id(obj)] = _digest(obj) == where[3]
                return ("built", *where) if unchanged[id(obj)] else None

        buffer = io.BytesIO()
        Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(list(self.venv.envs))
        return buffer.getvalue()

    def restore(self, data: bytes, source: str, remedy: str) -> bool:
        """Put the envs pickled by :meth:`dumps` (in ``source``) in place of the ones built.
        Returns False, restoring nothing, where ``data`` holds the training envs of a specrl
        from before :mod:`specrl.envs.training` (:data:`OLD_TRAINING_ENV`)."""
        fresh = [_layers(env) for env in self.venv.envs]
        digests = {where[:3]: where[3] for where in self.built.values()}
        reference = self.reference

        class Unpickler(pickle.Unpickler):
            def persistent_load(self, pid):
                if pid == ("reference",):
                    return reference
                _, i, j, name, digest = pid
                if digests.get((i, j, name)) != digest:
                    raise SpecrlError(
                        f"{source}: the training envs this specrl builds from the run's "
                        f"config differ from the ones it saved (their {name!r}); resume with "
                        "the specrl that wrote it, or start a new run"
                    )
                return vars(fresh[i][j])[name]

            def find_class(self, module, name):
                if (module, name) == OLD_TRAINING_ENV:
                    raise _OldTrainingEnv
                return super().find_class(module, name)

        try:
            envs = Unpickler(io.BytesIO(data)).load()
        except _OldTrainingEnv:
            return False
        except SpecrlError:
            raise
        except Exception as err:  # pickle raises whatever the objects it rebuilds raise
            raise SpecrlError(f"{source}: not readable ({err!r}); {remedy}") from None
        kinds = [[type(layer) for layer in layers] for layers in fresh]
        if not isinstance(envs, list) or [[type(x) for x in _layers(e)] for e in envs] != kinds:
            raise SpecrlError(
                f"{source}: does not hold this run's {len(fresh)} training envs; {remedy}"
            )
        for env in envs:
            env.set_wrapper_attr("env_seconds", 0.0)  # timing counts this session's seconds
        self.venv.envs[:] = envs
        return True


def env_streams(vec_env) -> list[dict]:
    """Each live training env's random stream (its ``np_random``: workloads, traces and the
    engine's per-request sampling seeds), as JSON."""
    return [env.unwrapped.np_random.bit_generator.state for env in vec_env.unwrapped.envs]


def set_env_streams(vec_env, streams, source: str, remedy: str) -> None:
    envs = vec_env.unwrapped.envs
    if not isinstance(streams, list) or len(streams) != len(envs):
        raise SpecrlError(
            f"{source}: field 'env_streams' must hold one random state per training env "
            f"({len(envs)}); {remedy}"
        )
    for env, state in zip(envs, streams):
        generator = np.random.Generator(np.random.PCG64())
        try:
            generator.bit_generator.state = state
        except (TypeError, ValueError, KeyError) as err:
            raise SpecrlError(f"{source}: field 'env_streams': {err}; {remedy}") from None
        env.unwrapped.np_random = generator
