"""The MDP PPO trains on: Gymnasium wrappers over either env, the surrogate or the live one.

:class:`TrainingEnv` is what ``specrl train`` steps. It stacks, innermost first:

* :class:`WorkloadMix`: every reset draws the episode's workload from a list (Starting State).
* :class:`ProbeRule`: K=0 after a long stretch without drafting runs the probe's K (Action).
* :class:`PolicyObservation`: the three entries an exported table indexes (Observation).

and pays its own reward: the step's tokens against :class:`RateReference`, the rate training
has reached at the step's batch size, with optional catch-up shaping (Rewards).

Evaluation, the warm start and the export run on the plain envs, which measure true tokens/s.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

from specrl.envs.base import ACCEPTANCE, BATCH, OBS_NAMES, STALENESS, observation_rows
from specrl.envs.surrogate import SurrogateSpecEnv
from specrl.errors import SpecrlError
from specrl.profile.schema import Profile

POLICY_OBS_NAMES = ("log_batch", "acceptance", "stale")
"""What the network reads, from the env's observation, and nothing more: what an exported
table indexes.

* ``log_batch``: ``log(B) / log(max_batch)``. The decision between speculating and not turns
  on the batch size; in the env's ``batch / max_batch`` every size below 16 of 128 sits
  within 0.12 of zero, too close for a small network to tell 1 from 4 from 8. The log
  spreads them evenly.
* ``acceptance``: the acceptance estimate, 0 while it is stale.
* ``stale``: 1 when no step has drafted for :data:`~specrl.features.STALE_STEPS` steps (as
  at the start), else 0.

The env observes more (queue, step time, context, last K, last step's acceptance), but a
serving stack reads the policy as a table indexed by batch size and acceptance
(:mod:`specrl.table`). A network that read the rest would have to be collapsed at some fixed
value of each when exported, and the table would act differently from the policy that was
evaluated. Reading only the table's indices makes ``specrl export`` exact up to the
acceptance bins, which the fidelity check measures."""
PROBE = {"after_steps": 256, "k": 1}
"""The probe rule of the policy and of its training; the table it exports to adds a
``scope`` (``specrl export --probe-scope``: by default it probes only where the table drafts
at its operating acceptance, see :data:`specrl.train.to_table.DEFAULT_PROBE_SCOPE`). A probe
after K=0 costs more than its one step: the draft catches up on every token it skipped, for
every row, so probes are rare (docs/training.md: the interval measured). Where the table's
stale entry is K > 0 (small batches), the estimate is measured at once anyway. Before any
step has drafted (an episode's start) the interval counts as passed, so the probe fires on
the first step rather than after 256 blind steps."""


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
        np.rint(arr[..., BATCH] * max_batch),
        arr[..., ACCEPTANCE],
        arr[..., STALENESS] >= 1.0,
        max_batch,
    )


def apply_probe(k, since):
    """:data:`PROBE` applied to chosen Ks (an int or an array) with ``since`` steps since a
    step last drafted."""
    if isinstance(k, int) and isinstance(since, int):  # the training envs' hot path
        return PROBE["k"] if k == 0 and since >= PROBE["after_steps"] else k
    probe = (np.asarray(k) == 0) & (np.asarray(since) >= PROBE["after_steps"])
    return np.where(probe, PROBE["k"], k)


class TrainingEnv(gym.Wrapper):
    """The MDP PPO trains on, over a :class:`SurrogateSpecEnv` or a
    :class:`~specrl.envs.LiveSpecEnv`: the env seen as an exported table sees it, with a
    workload drawn per episode and a reward per batch size.

    ## Action Space

    ``Discrete(k_max + 1)``: K, under the table's probe rule (:class:`ProbeRule`).

    ## Observation Space

    ``Box(0, 1, (3,), float32)``: ``log_batch``, ``acceptance`` and ``stale``
    (:class:`PolicyObservation`).

    ## Rewards

    Per step, with ``B`` the rows the step decoded (at least 1)::

        reward = (committed - rho(B) * step_seconds) / B

    ``rho(B)`` is ``reference``'s rate at ``B`` (:class:`RateReference`): the tokens/s
    training has reached decoding ``B`` rows so far, never below the warm start teacher's,
    read before the step is added to it. With ``by_workload``, ``rho`` is the rate reached on
    the episode's workload and the divisor is ``max_batch``.

    The plain env's reward uses one reference rate for every step, so its undiscounted
    episode return ranks policies exactly as tokens/s does. But with discounting a step's best
    K is the argmax of ``E[committed] - rho * E[seconds]``, which is the argmax of the step's
    tokens/s only where ``rho`` is the best rate there: a low reference pays for long steps,
    a high one for short steps. A reference per batch size that follows the rate reached is
    Dinkelbach's iteration for a ratio objective, per batch size: below the best rate it
    favours K that beat the current one, and it settles where no K beats it. Dividing by ``B``
    makes a step at one row weigh as much as one at 128. The batch a step decodes is set by
    the workload, not by K (closed loop), so neither change moves the best K at any batch
    size; but returns no longer rank complete episodes exactly, and the reward drifts as
    training improves.

    With ``shaping_gamma`` (the surrogate only), plus ``shaping_gamma * Phi(s') - Phi(s)``,
    potential-based shaping: ``Phi(s) = -rho(B) / B`` times the seconds of the catch-up the
    running rows owe the draft (what the next drafting step pays, ``B`` the running rows),
    and 0 once the episode has terminated.

    ## Starting State

    Every reset draws a workload from ``workloads`` and a fresh trace of it
    (:class:`WorkloadMix`).

    ## Episode End

    As the env's: terminated when every request of the trace has finished.

    ## Arguments

    * ``env``: the env to train on.
    * ``workloads``: the presets drawn per episode.
    * ``reference``: the :class:`RateReference` (keyed by batch size ``0..max_batch``, or by
      workload with ``by_workload``); envs that share one share ``rho``.
    * ``by_workload``: key the reference by the episode's workload.
    * ``shaping_gamma``: the discount of the catch-up shaping; None: no shaping.

    ``env_seconds`` accumulates the wall time spent in ``reset`` and ``step``.
    """

    def __init__(
        self,
        env: gym.Env,
        *,
        workloads: tuple[str, ...],
        reference: RateReference,
        by_workload: bool = False,
        shaping_gamma: float | None = None,
    ):
        if shaping_gamma is not None and not isinstance(env.unwrapped, SurrogateSpecEnv):
            raise SpecrlError(
                "catch-up shaping reads the surrogate's per-row lag, which the live engine does "
                "not expose; pass shaping_gamma=None for a live env"
            )
        self._mix = WorkloadMix(env, workloads)
        super().__init__(PolicyObservation(ProbeRule(self._mix)))
        self.reference = reference
        self.by_workload = by_workload
        self.shaping_gamma = shaping_gamma
        self.max_batch = env.unwrapped.max_batch
        self._last_potential = 0.0
        self.env_seconds = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        start = time.perf_counter()
        result = self.env.reset(seed=seed, options=options)
        if self.shaping_gamma is not None:
            self._last_potential = self._potential()
        self.env_seconds += time.perf_counter() - start
        return result

    def step(self, action):
        start = time.perf_counter()
        obs, _, terminated, truncated, info = self.env.step(action)
        key, scale = self._key_scale(max(info["batch"], 1))
        reward = self.reference.charge(key, info, scale)
        if self.shaping_gamma is not None:
            potential = 0.0 if terminated else self._potential()
            reward += self.shaping_gamma * potential - self._last_potential
            self._last_potential = potential
        self.env_seconds += time.perf_counter() - start
        return obs, float(reward), terminated, truncated, info

    def _key_scale(self, rows: int) -> tuple[int, int]:
        """The reference's key and the reward's divisor for a step over ``rows`` rows."""
        if self.by_workload:
            return self._mix.workload_index, self.max_batch
        return rows, rows

    def _potential(self) -> float:
        """``Phi(s)`` of the shaping: ``-rho(B) / B`` times the catch-up seconds the running
        rows owe the draft, ``B`` the running rows."""
        surrogate = self.unwrapped
        rows = surrogate.running_rows
        if rows == 0:
            return 0.0
        seconds = surrogate.catchup_owed_s()
        if seconds == 0.0:
            return 0.0
        key, scale = self._key_scale(rows)
        return -self.reference.rate(key) * seconds / scale


class WorkloadMix(gym.Wrapper):
    """Train on several workloads: each episode serves one drawn from a list.

    ## Starting State

    Every reset draws a workload from ``workloads`` uniformly, from the env's ``np_random``,
    and sets it as the env's ``workload``; the env then draws a fresh trace of it from the same
    stream. A seed passed to ``reset`` seeds that stream first, so it fixes both draws.

    ## Arguments

    * ``env``: a :class:`SurrogateSpecEnv` or :class:`~specrl.envs.LiveSpecEnv`, possibly
      wrapped.
    * ``workloads``: preset names (:data:`specrl.workload.PRESETS`).

    ``workload_index`` is the index in ``workloads`` of the episode's workload.
    """

    def __init__(self, env: gym.Env, workloads: tuple[str, ...]):
        super().__init__(env)
        self.workloads = tuple(workloads)
        self.workload_index = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            # Seed the env's stream without resetting the env: the draw comes first.
            self.np_random, _ = seeding.np_random(seed)
        self.workload_index = int(self.np_random.integers(len(self.workloads)))
        self.unwrapped.workload = self.workloads[self.workload_index]
        return self.env.reset(options=options)


class ProbeRule(gym.ActionWrapper):
    """The exported table's probe rule (:data:`PROBE`) applied to the
    chosen K, so the policy learns in the closed loop a table is served in.

    ## Action Space

    ``Discrete(k_max + 1)``, as the env's. K=0 when no step has drafted for
    ``PROBE["after_steps"]`` steps runs ``PROBE["k"]`` instead, which measures the acceptance
    estimate again; nothing measured yet (an episode's start) counts as past the interval.
    ``info["k"]`` is the K that ran.
    """

    def action(self, action) -> int:
        return apply_probe(int(action), self.unwrapped.acceptance.since_measured)


class PolicyObservation(gym.ObservationWrapper):
    """Observe what an exported table indexes, and nothing more
    (:func:`policy_observation`).

    ## Observation Space

    ``Box(0, 1, (3,), float32)``, from the env's observation:

    | i | name       | meaning                                                       |
    |---|------------|---------------------------------------------------------------|
    | 0 | log_batch  | ``log(B) / log(max_batch)``, ``B`` the rows the next step     |
    |   |            | decodes (at least 1)                                          |
    | 1 | acceptance | the env's acceptance estimate; 0 while stale                  |
    | 2 | stale      | 1 when no step has drafted for ``STALE_STEPS`` steps (as at   |
    |   |            | an episode's start), else 0                                   |

    The env's other entries (queue, step time, context, last K, last acceptance) are left
    out: a serving stack reads the policy as a table indexed by these three.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.max_batch = env.unwrapped.max_batch
        self.observation_space = spaces.Box(
            0.0, 1.0, shape=(len(POLICY_OBS_NAMES),), dtype=np.float32
        )
        batches = np.arange(self.max_batch + 1)
        self._log_batch = features(batches, batches * 0.0, batches < 0, self.max_batch)[:, 0]

    def observation(self, observation: np.ndarray) -> np.ndarray:  # [8] -> [3]
        """:func:`~policy_observation` of one observation, entry by entry
        (it is on the hot path of training; a test checks the two are equal)."""
        mb = self.max_batch
        stale = observation[STALENESS] >= 1.0
        obs = np.empty(3, dtype=np.float32)
        obs[0] = self._log_batch[min(max(int(np.rint(observation[BATCH] * mb)), 1), mb)]
        obs[1] = 0.0 if stale else observation[ACCEPTANCE]
        obs[2] = 1.0 if stale else 0.0
        return obs


def profile_reference(profile: Profile, max_batch: int, k_max: int) -> np.ndarray:
    """The best static tokens/s at each batch size ``0..max_batch`` by the profile
    (``[max_batch + 1]``): its ``tokens_per_s`` table interpolated over batch sizes, best over
    K = 0..k_max. Batch 0 reads as 1."""
    table = np.asarray(profile.tokens_per_s, dtype=np.float64)[:, : k_max + 1]  # [grid, K]
    batch = np.maximum(np.arange(max_batch + 1), 1)
    per_k = [np.interp(batch, profile.batch_sizes, table[:, k]) for k in range(k_max + 1)]
    return np.max(per_k, axis=0)


def decode_part(info: dict) -> tuple[int, float]:
    """The committed tokens and seconds of an env step's decode: its ``info`` less the
    admissions' prefill (their first tokens and seconds), which costs the same whatever K.
    The reward's reference rates and their floor both average this part."""
    return info["committed"] - info["admitted"], info["step_time_s"] - info["prefill_s"]


class RateReference:
    """``rho(key)``: the tokens/s the training steps at a key (a batch size, or a workload)
    reach while decoding, shared by every training env of a process.

    Per key, the decode's committed tokens and seconds (a step's prefill left out,
    :meth:`charge`) are averaged apart (exponential moving averages with weight ``weight``,
    started at 0, so their ratio is a weighted tokens/s without start-up bias); a key not seen
    yet reads ``initial`` (for batch sizes, the profile's best static rate,
    :func:`profile_reference`). A floor (:meth:`set_floor`, the warm start's teacher's rates)
    keeps the rate from following an exploring policy below what a known controller reached.

    Measured rather than read from the profile: the profile's table times decode steps alone,
    at the shortest context, while training steps run at longer contexts and pay the draft's
    catch-up after K=0. Against the table every step would be paid mostly for being short.

    :param initial: the rate of each key before any step there (``[keys]``).
    :param weight: the newest step's weight in the averages.
    """

    def __init__(self, initial: np.ndarray, *, weight: float = 1e-3):
        self.initial = np.asarray(initial, dtype=np.float64)  # [keys]
        self.weight = weight
        self.tokens = np.zeros_like(self.initial)
        self.seconds = np.zeros_like(self.initial)
        self.floor = np.zeros_like(self.initial)
        """Per key, a rate the reference never reads below (:meth:`set_floor`); 0: none."""

    def rate(self, key: int) -> float:
        seconds = self.seconds[key]
        rate = self.tokens[key] / seconds if seconds > 0 else self.initial[key]
        return max(rate, self.floor[key])

    def set_floor(
        self, tokens: np.ndarray, seconds: np.ndarray, steps: np.ndarray, *, need: int = 32
    ) -> None:
        """Floor each key's rate at ``tokens / seconds``, a rate some controller reached
        there over at least ``need`` steps; keys with fewer steps keep no floor."""
        ok = (steps >= need) & (seconds > 0)
        self.floor = np.where(ok, tokens / np.where(ok, seconds, 1.0), 0.0)

    def charge(self, key: int, info: dict, scale: float) -> float:
        """A step's reward, ``(committed - rate(key) * seconds) / scale`` from an env step's
        ``info``, with the rate read before the step's decode is added to it
        (:meth:`observe`). The step's prefill (its seconds and the first tokens it commits)
        is charged but not averaged into the rate: it is the same whatever K the policy
        chose, and averaged in it lowers the rate below what decoding reaches, which pays
        for long steps."""
        committed, seconds = info["committed"], info["step_time_s"]
        reward = (committed - self.rate(key) * seconds) / scale
        self.observe(key, *decode_part(info))
        return reward

    def observe(self, key: int, committed: int, seconds: float) -> None:
        w = self.weight
        self.tokens[key] += w * (committed - self.tokens[key])
        self.seconds[key] += w * (seconds - self.seconds[key])

    def to_json(self) -> dict:
        return {
            "tokens": self.tokens.tolist(),
            "seconds": self.seconds.tolist(),
            "floor": self.floor.tolist(),
        }

    def load_json(self, state: dict, source: str) -> None:
        try:
            tokens = np.asarray(state["tokens"], dtype=np.float64)
            seconds = np.asarray(state["seconds"], dtype=np.float64)
            floor = np.asarray(state.get("floor", np.zeros_like(tokens)), dtype=np.float64)
        except (KeyError, TypeError, ValueError, AttributeError):
            tokens = seconds = floor = np.zeros(0)
        if not tokens.shape == seconds.shape == floor.shape == self.tokens.shape:
            raise SpecrlError(
                f"{source}: field 'reference' must hold 'tokens', 'seconds' and 'floor', one "
                f"number per batch size 0..{len(self.tokens) - 1}"
            )
        self.tokens, self.seconds, self.floor = tokens, seconds, floor
