"""A PPO model trained by ``specrl train``, as a K controller with SB3's ``predict``.

The network reads what an exported table can index, and nothing more
(:func:`policy_observation`):

* ``log_batch``: ``log(B) / log(max_batch)``. The decision between speculating and not turns
  on the batch size (on the shipped profile K > 0 pays at 16 rows or fewer, off at 32 or
  more); in the env's ``batch / max_batch`` every size below 16 of 128 sits within 0.12 of
  zero, too close for a small network to tell 1 from 4 from 8. The log spreads them evenly.
* ``acceptance``: the acceptance estimate, 0 while it is stale.
* ``stale``: 1 when no step has drafted for :data:`~specrl.features.STALE_STEPS` steps (as
  at the start), else 0.

The env observes more (queue, step time, context, last K, last step's acceptance), but a
serving stack reads the policy as a table indexed by batch size and acceptance
(:mod:`specrl.table`). A network that read the rest would have to be collapsed at some fixed
value of each when exported, and the table would act differently from the policy that was
evaluated. Reading only the table's indices makes ``specrl export`` exact up to the
acceptance bins, which the fidelity check measures.

The policy follows the table's probe rule (:data:`PROBE`): when it chooses K=0 and no step
has drafted for ``after_steps`` steps, it drafts ``k`` for one step, so the acceptance
estimate is measured again. Training applies the same rule, so the policy learns in the
closed loop it is served in. ``predict`` counts the steps past ``STALE_STEPS`` itself, one
count per env, restarted where ``episode_start`` is True.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrl.envs.base import OBS_NAMES
from specrl.errors import SpecrlError
from specrl.features import NEVER_MEASURED
from specrl.policies.base import KPolicy, _episode_starts, observation_rows, since_measured

POLICY_OBS_NAMES = ("log_batch", "acceptance", "stale")
"""What the network reads, from the env's observation (see the module)."""
PROBE = {"after_steps": 256, "k": 1}
"""The probe rule of the policy and of its training; the table it exports to adds a
``scope`` (``specrl export --probe-scope``: by default it probes only where the table drafts
at its operating acceptance, see :data:`specrl.train.to_table.DEFAULT_PROBE_SCOPE`). A probe
after K=0 costs more than its one step: the draft catches up on every token it skipped, for
every row, so probes are rare (docs/training.md: the interval measured). Where the table's
stale entry is K > 0 (small batches), the estimate is measured at once anyway. Before any
step has drafted (an episode's start) the interval counts as passed, so the probe fires on
the first step rather than after 256 blind steps."""
_BATCH = OBS_NAMES.index("batch")
_ACCEPTANCE = OBS_NAMES.index("acceptance")
_STALENESS = OBS_NAMES.index("staleness")


def features(batch, acceptance, stale, max_batch: int) -> np.ndarray:
    """The network's input for batch sizes, acceptance estimates and stale flags (arrays of
    one shape ``S``) -> ``[*S, 3]`` float32. The acceptance of a stale row reads 0."""
    batch = np.clip(np.asarray(batch, dtype=np.float64), 1, max_batch)
    stale = np.asarray(stale, dtype=bool)
    log_batch = np.log(batch) / np.log(max_batch) if max_batch > 1 else batch * 0.0
    acceptance = np.where(stale, 0.0, np.asarray(acceptance, dtype=np.float64))
    return np.stack([log_batch, acceptance, stale.astype(np.float64)], axis=-1).astype(np.float32)


def policy_observation(obs, max_batch: int) -> np.ndarray:
    """The network's input (``[3]`` or ``[n_envs, 3]`` float32) from the env's observation
    (``[8]`` or ``[n_envs, 8]``). On the training env's hot path: kept to a few array ops."""
    arr = np.asarray(obs, dtype=np.float32)
    if arr.ndim not in (1, 2) or arr.shape[-1] != len(OBS_NAMES):
        observation_rows(arr)  # raises, naming the expected shape
    return features(
        np.rint(arr[..., _BATCH] * max_batch),
        arr[..., _ACCEPTANCE],
        arr[..., _STALENESS] >= 1.0,
        max_batch,
    )


def apply_probe(k, since):
    """:data:`PROBE` applied to chosen Ks (an int or an array) with ``since`` steps since a
    step last drafted."""
    if isinstance(k, int) and isinstance(since, int):  # the training envs' hot path
        return PROBE["k"] if k == 0 and since >= PROBE["after_steps"] else k
    probe = (np.asarray(k) == 0) & (np.asarray(since) >= PROBE["after_steps"])
    return np.where(probe, PROBE["k"], k)


class PPOPolicy(KPolicy):
    """An SB3 PPO model over :func:`policy_observation`, as every other K controller.

    :param model: a ``stable_baselines3.PPO`` whose observation space has
        ``len(POLICY_OBS_NAMES)`` entries and whose actions are ``0..k_max``.
    :param max_batch: the env's ``max_batch`` the model was trained with.
    """

    def __init__(self, model, *, max_batch: int):
        n_obs = len(POLICY_OBS_NAMES)
        if model.observation_space.shape != (n_obs,):
            raise SpecrlError(
                f"the PPO model reads observations of shape {model.observation_space.shape}, "
                f"not ({n_obs},) ({', '.join(POLICY_OBS_NAMES)}); was it trained by "
                "`specrl train`?"
            )
        self.model = model
        self.max_batch = max_batch
        self.k_max = int(model.action_space.n) - 1
        self.name = "ppo"
        self._since: list[int] = []  # per env: steps since one drafted (the probe rule)

    @classmethod
    def load(
        cls, run_dir: str | Path, *, max_batch: int | None = None, k_max: int | None = None
    ) -> PPOPolicy:
        """The policy of a ``specrl train`` run (``RUN_DIR/model.zip``: its best-evaluated
        model), on the CPU.

        :param max_batch: the env's ``max_batch``, if known: a run trained with another is
            refused (the observation scales the batch size by it).
        :param k_max: the env's ``k_max``, if known: a run trained with another is refused.
        """
        from specrl.train.config import MODEL_FILE, load_config

        config = load_config(run_dir)
        for name, wanted in (("max_batch", max_batch), ("k_max", k_max)):
            if wanted is not None and getattr(config, name) != wanted:
                raise SpecrlError(
                    f"the run in {run_dir} was trained with {name}={getattr(config, name)}, "
                    f"the env has {name}={wanted}; train a run for this env"
                )
        path = Path(run_dir) / MODEL_FILE
        if not path.is_file():
            raise SpecrlError(
                f"{path} not found: the run in {run_dir} has not finished; continue it with "
                f"`specrl train --resume {run_dir}`"
            )
        from stable_baselines3 import PPO

        try:
            model = PPO.load(path, device="cpu")
        except Exception as err:  # SB3 raises whatever zipfile, torch or pickle raise
            raise SpecrlError(f"{path} is not a readable SB3 model ({err})") from None
        policy = cls(model, max_batch=config.max_batch)
        if policy.k_max != config.k_max:
            raise SpecrlError(
                f"{path} chooses K in 0..{policy.k_max} but {run_dir}/config.json says "
                f"k_max={config.k_max}; the run directory is inconsistent"
            )
        return policy

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        """K for each observation (``[8]`` -> ``np.int64``, ``[n_envs, 8]`` -> ``[n_envs]``);
        the most probable K unless ``deterministic`` is False."""
        rows, single = observation_rows(obs)
        actions, _ = self.model.predict(
            policy_observation(rows, self.max_batch), deterministic=deterministic
        )
        starts = _episode_starts(episode_start, len(rows))
        if len(self._since) != len(rows):
            self._since = [NEVER_MEASURED] * len(rows)
            starts = np.ones(len(rows), dtype=bool)
        self._since = [
            since_measured(prev, float(row[_STALENESS]), bool(start))
            for prev, row, start in zip(self._since, rows, starts)
        ]
        actions = apply_probe(np.asarray(actions, dtype=np.int64).reshape(-1), self._since)
        actions = actions.astype(np.int64)
        return (np.int64(actions[0]) if single else actions), state

    def decide(self, batch, acceptance, stale) -> np.ndarray:
        """The network's deterministic K (before the probe rule) at batch sizes, acceptance
        estimates and stale flags (arrays of one shape): what :mod:`specrl.train.to_table`
        tabulates."""
        x = features(batch, acceptance, stale, self.max_batch)
        actions, _ = self.model.predict(x.reshape(-1, x.shape[-1]), deterministic=True)
        return np.asarray(actions, dtype=np.int64).reshape(x.shape[:-1])
