"""PPO on the surrogate: the training env, checkpoints, held-out evaluation and :func:`train`,
which ``specrl train`` and ``experiments/train_ppo.py`` share.

stable-baselines3, torch and wandb are imported inside functions only.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pickle
import random
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from specrl.compare import best_static, summarize
from specrl.envs.rollout import run_episode
from specrl.envs.surrogate import SurrogateSpecEnv, default_profile_path
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.features import STALE_STEPS
from specrl.files import check_header, read_json, write_atomic, write_json
from specrl.policies import make_policies, make_policy
from specrl.policies.ppo import (
    POLICY_OBS_NAMES,
    PPOPolicy,
    apply_probe,
    features,
    policy_observation,
)
from specrl.profile import Profile, load_profile
from specrl.train.config import (
    BEST_MODEL_FILE,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    ENVS_FILE,
    LAST_MODEL_FILE,
    MODEL_FILE,
    RESUMABLE_CHANGES,
    SUMMARY_FILE,
    TrainConfig,
)

CHECKPOINT_FORMAT = "specrl-train-checkpoint"
CHECKPOINT_VERSION = 2
"""Version 2 keeps the training envs' episodes (surrogate) or random streams (live); a version 1
checkpoint resumes on fresh episodes."""
SUMMARY_FORMAT = "specrl-train-summary"
SUMMARY_VERSION = 1


# ----------------------------------------------------------------------------- the training env


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
    """``rho(B)``: the tokens/s the training steps at ``B`` rows achieve while decoding,
    shared by every training env (one process). Per batch size, the decode's committed tokens
    and seconds (a step's prefill left out, :meth:`charge`) are averaged apart (exponential
    moving averages with weight ``weight``, started at 0, so their ratio is a weighted tokens/s
    without start-up bias); a batch size not seen yet reads the profile's best static rate
    (:func:`profile_reference`). A floor (:meth:`set_floor`, the warm start's teacher's rates)
    keeps the rate from following an exploring policy below what a known controller reached.

    Why measured rather than taken from the profile: the profile's table times decode steps
    alone, at the shortest context. Training steps run at longer contexts and pay the draft's
    catch-up after K=0 (and, before the prefill was left out of the rates, their admissions:
    on ramp with K=0 steps then reached 92% of the table at one row and 47% at 65-128 rows).
    Against the table every step was paid mostly for being short, and PPO learned K=0
    everywhere (0.96x the best static K).
    """

    def __init__(self, initial: np.ndarray, *, weight: float = 1e-3):
        self.initial = np.asarray(initial, dtype=np.float64)  # [max_batch + 1]
        self.weight = weight
        self.tokens = np.zeros_like(self.initial)
        self.seconds = np.zeros_like(self.initial)
        self.floor = np.zeros_like(self.initial)
        """Per key, a rate the reference never reads below (:meth:`set_floor`); 0: none."""

    def rate(self, rows: int) -> float:
        seconds = self.seconds[rows]
        rate = self.tokens[rows] / seconds if seconds > 0 else self.initial[rows]
        return max(rate, self.floor[rows])

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

    def observe(self, rows: int, committed: int, seconds: float) -> None:
        w = self.weight
        self.tokens[rows] += w * (committed - self.tokens[rows])
        self.seconds[rows] += w * (seconds - self.seconds[rows])

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


class TrainingEnv(SurrogateSpecEnv):
    """The surrogate as PPO trains on it. Differences from :class:`SurrogateSpecEnv`:

    ## Starting State

    Every reset draws a workload from ``workloads`` (uniformly, from ``np_random``), then a
    fresh trace of it from the same stream.

    ## Observation Space

    ``Box(0, 1, (3,), float32)``: ``log_batch``, ``acceptance`` and ``stale``
    (:func:`specrl.policies.ppo.policy_observation`), what an exported table indexes.

    ## Action Space

    K in ``0..k_max``, with the table's probe rule (:data:`specrl.policies.ppo.PROBE`): K=0
    after ``after_steps`` steps without drafting runs ``k`` instead.

    ## Rewards

    ``(committed - rho(B) * step_seconds) / B``, with ``B`` the rows the step decoded and
    ``rho(B)`` the tokens/s training has reached decoding ``B`` rows so far, never below
    the warm start teacher's (``reference``, a :class:`RateReference`, read before the step
    is added to it); with ``shaping_gamma``,
    plus ``gamma * Phi(s') - Phi(s)`` (:meth:`_potential`, the catch-up the rows owe the
    draft). With ``by_workload``, ``rho`` is the rate reached on the episode's workload and
    the divisor ``max_batch``.

    The env's own reward uses one reference rate for every step, so its undiscounted episode
    return ranks policies exactly as tokens/s does. But with gamma < 1 a step's best K is the
    argmax of ``E[committed] - rho * E[seconds]``, which is the argmax of the step's tokens/s
    only when ``rho`` is the best rate there: a low reference pays for long steps (a probe at
    rho = 139 learned K=3 at 64 rows), a high one for short steps (rho = 5000 learned off at
    4 rows). A reference per batch size that follows the rate reached is Dinkelbach's
    iteration for a ratio objective, per batch size: below the best rate it favours K that
    beat the current one, and it settles where no K beats it. Dividing by ``B`` makes a step
    at one row weigh as much as one at 128. The batch a step decodes is set by the workload,
    not by K (closed loop), so neither change moves the best K at any batch size; but returns
    no longer rank complete episodes exactly, and the reward drifts as training improves.
    Evaluation always measures true tokens/s.

    ``env_seconds`` accumulates the wall time spent in ``reset`` and ``step``.
    """

    def __init__(
        self,
        *,
        workloads: tuple[str, ...],
        profile: Profile,
        workload_kwargs: dict,
        k_max: int,
        max_batch: int,
        max_len: int,
        reference: RateReference,
        by_workload: bool = False,
        shaping_gamma: float | None = None,
    ):
        super().__init__(
            profile=profile,
            workload=workloads[0],
            workload_kwargs=workload_kwargs,
            k_max=k_max,
            max_batch=max_batch,
            max_len=max_len,
        )
        self.workloads = tuple(workloads)
        self.observation_space = spaces.Box(
            0.0, 1.0, shape=(len(POLICY_OBS_NAMES),), dtype=np.float32
        )
        self.reference = reference
        self.by_workload = by_workload
        self.gamma = shaping_gamma
        self._last_potential = 0.0
        self._workload_index = 0
        self.env_seconds = 0.0
        batches = np.arange(max_batch + 1)
        self._log_batch = features(batches, batches * 0.0, batches < 0, max_batch)[:, 0]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        start = time.perf_counter()
        if seed is not None:
            gym.Env.reset(self, seed=seed)
        self._workload_index = int(self.np_random.integers(len(self.workloads)))
        self.workload = self.workloads[self._workload_index]
        result = super().reset(options=options)
        if self.gamma is not None:
            self._last_potential = self._potential()
        self.env_seconds += time.perf_counter() - start
        return result

    def step(self, action):
        start = time.perf_counter()
        action = int(apply_probe(int(action), self._tracker.since_measured))
        obs, _, terminated, truncated, info = super().step(action)
        rows = max(info["batch"], 1)
        if self.by_workload:
            key, scale = self._workload_index, self.max_batch
        else:
            key, scale = rows, rows
        reward = self.reference.charge(key, info, scale)
        if self.gamma is not None:
            potential = 0.0 if terminated else self._potential()
            reward += self.gamma * potential - self._last_potential
            self._last_potential = potential
        self.env_seconds += time.perf_counter() - start
        return obs, float(reward), terminated, truncated, info

    def _get_obs(self) -> np.ndarray:
        """``policy_observation`` of the env's observation, computed straight from the state
        (on the hot path of training; a test checks the two are equal)."""
        tracker = self._tracker
        stale = tracker.since_measured >= STALE_STEPS
        obs = np.empty(3, dtype=np.float32)
        obs[0] = self._log_batch[min(max(self._batch_ahead(), 1), self.max_batch)]
        obs[1] = 0.0 if stale else tracker.estimate
        obs[2] = 1.0 if stale else 0.0
        return obs

    def _potential(self) -> float:
        """``-rho(B) / B`` times the seconds of the catch-up the running rows owe the draft
        (what the next drafting step would pay), ``B`` the running rows."""
        n = self._n
        if n == 0:
            return 0.0
        lag = self._lag[:n]
        behind = lag > 2
        if not behind.any():
            return 0.0
        tokens = int(behind.sum()) * (int(lag[behind].max()) - 1)
        seconds = self._catchup_s[min(tokens, len(self._catchup_s) - 1)]
        key = self._workload_index if self.by_workload else n
        scale = self.max_batch if self.by_workload else n
        return -self.reference.rate(key) * seconds / scale


class LiveTrainingEnv(gym.Wrapper):
    """:class:`~specrl.envs.LiveSpecEnv` as PPO trains on it: the same observation (the three
    entries a table indexes), probe rule, workload draw per reset and per-batch-size reward as
    :class:`TrainingEnv`, with the engine's measured step times. No catch-up shaping: the
    engine's per-row lag is not exposed as the surrogate's is.

    ``env_seconds`` accumulates the wall time spent in ``reset`` and ``step``.
    """

    def __init__(self, env, *, workloads: tuple[str, ...], reference: RateReference):
        super().__init__(env)
        self.workloads = tuple(workloads)
        self.reference = reference
        self.observation_space = spaces.Box(
            0.0, 1.0, shape=(len(POLICY_OBS_NAMES),), dtype=np.float32
        )
        self.env_seconds = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        start = time.perf_counter()
        base = self.env.unwrapped
        if seed is not None:
            gym.Env.reset(base, seed=seed)
        base.workload = self.workloads[int(base.np_random.integers(len(self.workloads)))]
        obs, info = self.env.reset(options=options)
        self.env_seconds += time.perf_counter() - start
        return policy_observation(obs, base.max_batch), info

    def step(self, action):
        start = time.perf_counter()
        base = self.env.unwrapped
        action = int(apply_probe(int(action), base.acceptance.since_measured))
        obs, _, terminated, truncated, info = self.env.step(action)
        rows = max(info["batch"], 1)
        reward = self.reference.charge(rows, info, rows)
        self.env_seconds += time.perf_counter() - start
        return policy_observation(obs, base.max_batch), float(reward), terminated, truncated, info


def make_live_training_env(config: TrainConfig, profile: Profile, reference: RateReference):
    """The live training env of ``config`` (one engine, the default pair ``config.preset``);
    the profile's freshness is checked first (refused when stale unless
    ``config.force_profile``)."""
    from specrl.envs import LiveSpecEnv

    live = LiveSpecEnv(
        preset=config.preset,
        workload=config.workloads[0],
        workload_kwargs=_workload_kwargs(config),
        k_max=config.k_max,
        max_batch=config.max_batch,
        max_len=config.max_len,
        profile=profile,
        force_profile=config.force_profile,
    )
    return LiveTrainingEnv(live, workloads=config.workloads, reference=reference)


def _profile_path(config: TrainConfig) -> Path:
    return Path(config.profile) if config.profile else default_profile_path()


def _load_run_profile(config: TrainConfig) -> tuple[Profile, Path]:
    path = _profile_path(config)
    return load_profile(path), path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def floors_reference(config: TrainConfig) -> bool:
    """Whether the reward's reference keeps a floor at the warm start teacher's rates: with
    ``reference_floor``, a reference per batch size, and training on the surrogate. Live, the
    floor is not used: the teacher's rates are the surrogate's, from a profile that may be off
    this machine's speed by tens of percent, and a floor above every K's live rate would pay
    for short steps."""
    return (
        config.reference_floor and config.reward_reference == "batch" and config.env == "surrogate"
    )


def check_request_lengths(config: TrainConfig, profile: Profile) -> None:
    """Refuse, before anything is trained, a run whose workloads can draw a request longer
    than ``config.max_len``: with a profile of a prompts file, the file's lengths
    (:func:`~specrl.workload.profile_workload_kwargs`), else the presets'."""
    from specrl.workload import profile_workload_kwargs
    from specrl.workload.trace import DEFAULT_OUTPUT_LENGTHS, DEFAULT_PROMPT_LENGTHS

    kwargs = profile_workload_kwargs(profile.meta)
    prompt = kwargs.get("prompt_lengths", DEFAULT_PROMPT_LENGTHS).hi
    output = kwargs.get("output_lengths", DEFAULT_OUTPUT_LENGTHS).hi
    if prompt + output > config.max_len:
        mine = "prompt_lengths" in kwargs or "output_lengths" in kwargs
        source = "the profile's prompts file" if mine else "the preset workloads"
        raise SpecrlError(
            f"{source} can draw a request of {prompt} prompt + {output} output tokens = "
            f"{prompt + output}, more than max_len {config.max_len}; train with --max-len "
            f"{prompt + output} (or shorten the prompts / their max_new_tokens)"
        )


def _workload_kwargs(config: TrainConfig) -> dict:
    kwargs = {"peak": config.max_batch}
    if config.n_requests is not None:
        kwargs["n_requests"] = config.n_requests
    return kwargs


def surrogate_env(config: TrainConfig, profile: Profile, workload: str) -> SurrogateSpecEnv:
    """A plain surrogate env of ``config``'s sizes serving ``workload`` (evaluation, the warm
    start, the export's fidelity check)."""
    return SurrogateSpecEnv(
        profile=profile,
        workload=workload,
        workload_kwargs=_workload_kwargs(config),
        k_max=config.k_max,
        max_batch=config.max_batch,
        max_len=config.max_len,
    )


def new_reference(config: TrainConfig, profile: Profile) -> RateReference:
    initial = profile_reference(profile, config.max_batch, config.k_max)
    if config.reward_reference == "workload":
        initial = np.full(len(config.workloads), initial[1:].mean())
    return RateReference(initial)


def make_training_env(
    config: TrainConfig, profile: Profile, reference: RateReference | None = None
) -> TrainingEnv:
    """A training env; envs that share ``reference`` (default: a new one) share ``rho``."""
    return TrainingEnv(
        workloads=config.workloads,
        profile=profile,
        workload_kwargs=_workload_kwargs(config),
        k_max=config.k_max,
        max_batch=config.max_batch,
        max_len=config.max_len,
        reference=reference or new_reference(config, profile),
        by_workload=config.reward_reference == "workload",
        shaping_gamma=config.gamma if config.shape_catchup else None,
    )


# ----------------------------------------------------------------------------- warm start

WARM_START_SEED = 30_000
"""Warm-start episode ``j`` of training workload ``i`` is reset with ``WARM_START_SEED + i + j
* len(workloads)``: neither training nor evaluation uses these seeds."""


def warm_start(
    model,
    config: TrainConfig,
    profile: Profile,
    *,
    progress: bool = True,
    reference: RateReference | None = None,
) -> dict:
    """Behaviour cloning: fit the policy network's action distribution to
    ``config.warm_start``'s choices on the states it visits (cross-entropy, Adam, minibatches
    of 256, ``config.warm_start_epochs`` passes). The value network is left to PPO. Returns
    the number of states and the share where the network's most probable K is the
    teacher's. With ``reference`` (per batch size), the tokens/s the teacher reached at each
    batch size becomes its floor (:meth:`RateReference.set_floor`)."""
    import torch
    from tqdm.auto import tqdm

    states, actions = [], []
    size = config.max_batch + 1
    tokens, seconds, steps = np.zeros(size), np.zeros(size), np.zeros(size, dtype=np.int64)
    n = len(config.workloads)
    episodes = [
        (i, name, j)
        for j in range(config.warm_start_episodes)
        for i, name in enumerate(config.workloads)
    ]
    for i, name, j in tqdm(episodes, desc="warm start: states", disable=not progress):
        env = surrogate_env(config, profile, name)
        teacher = make_policy(config.warm_start, env=env)
        obs, _ = env.reset(seed=WARM_START_SEED + i + j * n)
        start, done = True, False
        while not done:
            k, _ = teacher.predict(obs, episode_start=np.array([start]))
            start = False
            states.append(obs)
            actions.append(int(k))
            obs, _, terminated, truncated, info = env.step(k)
            done = terminated or truncated
            rows = max(info["batch"], 1)
            decoded, decode_s = decode_part(info)
            tokens[rows] += decoded
            seconds[rows] += decode_s
            steps[rows] += 1
    if reference is not None:
        reference.set_floor(tokens, seconds, steps)
    x = torch.as_tensor(policy_observation(np.asarray(states), config.max_batch))
    y = torch.as_tensor(np.asarray(actions, dtype=np.int64))
    policy = model.policy
    params = [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters()]
    if policy.share_features_extractor:
        params += list(policy.features_extractor.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3)
    generator = torch.Generator().manual_seed(config.seed)
    for _ in tqdm(
        range(config.warm_start_epochs), desc="warm start: cloning", disable=not progress
    ):
        for batch in torch.randperm(len(y), generator=generator).split(256):
            loss = -policy.get_distribution(x[batch]).log_prob(y[batch]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        chosen = policy.get_distribution(x).distribution.probs.argmax(dim=1)
    return {
        "teacher": config.warm_start,
        "states": len(y),
        "accuracy": float((chosen == y).float().mean()),
    }


# ----------------------------------------------------------------------------- evaluation


@dataclass
class EvalResult:
    """The deterministic policy against the best static K and the oracle on held-out seeds."""

    timesteps: int
    tokens_per_s: float
    """The policy's tokens/s over every evaluation episode (sum of tokens / sum of seconds)."""
    ratio_best_static: float
    """Mean over workloads of the policy's tokens/s over the best static K's (the best of off
    and each fixed K on that workload's episodes)."""
    ratio_oracle: float
    """Mean over workloads of the policy's tokens/s over the oracle's."""
    by_workload: dict[str, dict] = field(default_factory=dict)
    """Per workload: tokens_per_s, best_static (name), best_static_tokens_per_s,
    oracle_tokens_per_s, ratio_best_static, ratio_oracle, k_share."""
    k_share: dict[str, float] = field(default_factory=dict)
    """Share of evaluation steps at each K."""
    step_k: list[int] = field(default_factory=list, repr=False)
    """K of every evaluation step (the histogram)."""

    def to_json(self) -> dict:
        return {
            "timesteps": self.timesteps,
            "tokens_per_s": self.tokens_per_s,
            "ratio_best_static": self.ratio_best_static,
            "ratio_oracle": self.ratio_oracle,
            "k_share": self.k_share,
            "by_workload": self.by_workload,
        }


class Evaluation:
    """Held-out evaluation: each of ``config.eval_workloads`` for ``eval_episodes`` episodes
    reset with ``eval_seed + i``. Every static K and the oracle serve the same traces; their
    results are computed once (the env is seeded and they do not learn)."""

    def __init__(self, config: TrainConfig, profile: Profile):
        self.k_max = config.k_max
        self.seeds = [config.eval_seed + i for i in range(config.eval_episodes)]
        self.envs = {name: surrogate_env(config, profile, name) for name in config.eval_workloads}
        self._specs = ["off", *(f"fixed:{k}" for k in range(1, config.k_max + 1)), "oracle"]
        self._baselines: dict[str, list] | None = None

    def _baseline_results(self) -> dict[str, list]:
        if self._baselines is None:
            self._baselines = {}
            for name, env in self.envs.items():
                policies = make_policies(self._specs, env=env)
                self._baselines[name] = [
                    summarize(p.name, [run_episode(env, p, seed=s) for s in self.seeds], self.k_max)
                    for p in policies
                ]
        return self._baselines

    def run(self, policy, timesteps: int) -> EvalResult:
        """Evaluate ``policy`` (anything with ``predict``) at ``timesteps`` of training."""
        baselines = self._baseline_results()
        by_workload, all_episodes = {}, []
        for name, env in self.envs.items():
            episodes = [run_episode(env, policy, seed=s) for s in self.seeds]
            all_episodes += episodes
            mine = summarize(policy.name, episodes, self.k_max)
            best = best_static(baselines[name])
            oracle = next(r for r in baselines[name] if r.policy == "oracle")
            by_workload[name] = {
                "tokens_per_s": mine.tokens_per_s,
                "best_static": best.policy,
                "best_static_tokens_per_s": best.tokens_per_s,
                "oracle_tokens_per_s": oracle.tokens_per_s,
                "ratio_best_static": mine.tokens_per_s / best.tokens_per_s,
                "ratio_oracle": mine.tokens_per_s / oracle.tokens_per_s,
                "k_share": mine.k_share,
            }
        overall = summarize(policy.name, all_episodes, self.k_max)
        n = len(by_workload)
        return EvalResult(
            timesteps=timesteps,
            tokens_per_s=overall.tokens_per_s,
            ratio_best_static=sum(w["ratio_best_static"] for w in by_workload.values()) / n,
            ratio_oracle=sum(w["ratio_oracle"] for w in by_workload.values()) / n,
            by_workload=by_workload,
            k_share=overall.k_share,
            step_k=[k for e in all_episodes for k in e.step_k],
        )


# ----------------------------------------------------------------------------- checkpoints


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _model_bytes(model) -> bytes:
    buffer = io.BytesIO()
    model.save(buffer)  # parameters and the optimizer's state
    return buffer.getvalue()


def _rng_state() -> dict:
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


def _set_rng_state(state: dict) -> None:
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


def _vec_normalize_state(vec_env) -> dict | None:
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


def _set_vec_normalize_state(vec_env, state: dict) -> None:
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


class SurrogateEpisodes:
    """The surrogate training envs as they stand mid-episode, pickled into a checkpoint
    (:data:`~specrl.train.config.ENVS_FILE`) and restored on resume, so that a resumed run
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

    def restore(self, data: bytes, source: str, remedy: str) -> None:
        """Put the envs pickled by :meth:`dumps` (in ``source``) in place of the ones built."""
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

        try:
            envs = Unpickler(io.BytesIO(data)).load()
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
            env.unwrapped.env_seconds = 0.0  # timing counts this session's seconds
        self.venv.envs[:] = envs


def _env_streams(vec_env) -> list[dict]:
    """Each live training env's random stream (its ``np_random``: workloads, traces and the
    engine's per-request sampling seeds), as JSON."""
    return [env.unwrapped.np_random.bit_generator.state for env in vec_env.unwrapped.envs]


def _set_env_streams(vec_env, streams, source: str, remedy: str) -> None:
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


@dataclass
class Checkpoint:
    path: Path
    """The checkpoint directory (``RUN_DIR/checkpoints/step-N``)."""
    num_timesteps: int
    config: TrainConfig
    state: dict
    """state.json as read: rng, vec_normalize, reference, wandb_id, eval_history."""

    @property
    def model_path(self) -> Path:
        return self.path / MODEL_FILE


def checkpoint_name(num_timesteps: int) -> str:
    return f"step-{num_timesteps:012d}"


def save_checkpoint(model, run_dir: Path, state: dict, envs: bytes | None = None) -> Path:
    """Save ``model`` (with its optimizer), ``state``, the best evaluated model so far and
    ``envs`` (:meth:`SurrogateEpisodes.dumps`, if given) as ``checkpoints/step-N``.

    The files are written into a hidden directory that is then renamed into place: a kill at
    any moment leaves either the complete checkpoint or none (the previous ones untouched).
    """
    root = run_dir / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(model.num_timesteps)
    if final.exists():
        return final
    partial = root / f".partial-{final.name}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    write_atomic(partial / MODEL_FILE, _model_bytes(model))
    best = run_dir / BEST_MODEL_FILE
    if state.get("best") is not None and best.is_file():
        # The best model so far travels with the checkpoint: a resume from here restores it,
        # not whatever a later, discarded stretch of training left in the run directory.
        write_atomic(partial / BEST_MODEL_FILE, best.read_bytes())
    if envs is not None:
        write_atomic(partial / ENVS_FILE, envs)
    body = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "num_timesteps": model.num_timesteps,
        **state,
    }
    write_atomic(partial / "state.json", (json.dumps(body) + "\n").encode())
    _fsync_dir(partial)
    os.replace(partial, final)
    _fsync_dir(root)
    return final


def latest_checkpoint(run_dir: str | Path) -> Checkpoint:
    """The newest complete checkpoint of the run in ``run_dir``, validated; a missing run
    directory, no checkpoint, or a checkpoint that fails to read raises a SpecrlError naming
    it. Reads only."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SpecrlError(f"cannot resume {run_dir}: no such directory")
    root = run_dir / CHECKPOINT_DIR
    found = sorted(root.glob("step-*")) if root.is_dir() else []
    if not found:
        raise SpecrlError(
            f"cannot resume {run_dir}: no checkpoint in {root}; a run saves its first one "
            "after checkpoint_every steps, and one stopped before that has nothing to resume "
            f"(delete {run_dir} and start again)"
        )
    path = found[-1]
    remedy = _corrupt_remedy(path)
    obj = read_json(path / "state.json", "checkpoint state", remedy)
    check_header(
        obj,
        str(path / "state.json"),
        fmt=CHECKPOINT_FORMAT,
        version=(1, CHECKPOINT_VERSION),
        what="checkpoint state",
        remake=remedy,
    )
    where = f"checkpoint {path}"
    steps = obj.get("num_timesteps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise SpecrlError(f"{where}: num_timesteps must be an integer >= 0; {remedy}")
    if path.name != checkpoint_name(steps):
        raise SpecrlError(f"{where}: its state says {steps} steps; {remedy}")
    for key, kind in (("rng", dict), ("eval_history", list), ("reference", dict)):
        if not isinstance(obj.get(key), kind):
            raise SpecrlError(f"{where}: field {key!r} missing or not a {kind.__name__}; {remedy}")
    best = obj.get("best")
    if best is not None and not (
        isinstance(best, dict) and isinstance(best.get("ratio_best_static"), (int, float))
    ):
        raise SpecrlError(f"{where}: field 'best' must be null or an evaluation; {remedy}")
    config = TrainConfig.from_json(obj.get("config"), source=f"{where}: config")
    if not (path / MODEL_FILE).is_file():
        raise SpecrlError(f"{where}: {MODEL_FILE} missing; {remedy}")
    if obj["version"] == 1:
        pass  # written before the training envs were checkpointed: see _resume_model
    elif config.env == "surrogate" and not (path / ENVS_FILE).is_file():
        raise SpecrlError(f"{where}: {ENVS_FILE} missing; {remedy}")
    elif config.env == "live" and not isinstance(obj.get("env_streams"), list):
        raise SpecrlError(f"{where}: field 'env_streams' missing or not a list; {remedy}")
    return Checkpoint(path=path, num_timesteps=steps, config=config, state=obj)


def _corrupt_remedy(path: Path) -> str:
    """The fix for an unreadable newest checkpoint ``path``: fall back to the one before it,
    or, where it is the run's only one, start again."""
    if len(list(path.parent.glob("step-*"))) > 1:
        return f"delete {path} to resume from the checkpoint before it"
    return f"it is the run's only checkpoint: delete {path.parent.parent} and start again"


def _resume_model(checkpoint: Checkpoint, vec_env, episodes: SurrogateEpisodes | None):
    """The checkpoint's model, training on ``vec_env`` with its envs where the checkpoint left
    them: a surrogate run's mid-episode, as saved (and the model's last observation of them);
    a live run's at fresh episodes drawn from their saved random streams (the engine's caches
    and requests in flight are not saved); a version 1 checkpoint's at fresh episodes seeded
    from ``(seed, timesteps)``."""
    from stable_baselines3 import PPO

    remedy = _corrupt_remedy(checkpoint.path)
    try:
        # Loaded without the env: given one, SB3 queues the run's first seeds for its next
        # reset, which would restart the envs' streams.
        model = PPO.load(checkpoint.model_path, device="cpu", force_reset=False)
    except Exception as err:  # SB3 raises whatever zipfile, torch or pickle raise
        raise SpecrlError(
            f"checkpoint {checkpoint.path}: {MODEL_FILE} is not a readable SB3 model ({err}); "
            f"{remedy}"
        ) from None
    where = f"checkpoint {checkpoint.path}"
    if checkpoint.state["version"] == 1:
        warnings.warn(
            f"{where} was written by an older specrl, without its training envs' episodes: "
            "the run goes on from fresh episodes, not as it would have had it never stopped",
            category=SpecrlWarning,
            stacklevel=3,
        )
        seed = np.random.SeedSequence([checkpoint.config.seed, checkpoint.num_timesteps])
        vec_env.seed(int(seed.generate_state(1)[0]))
    elif episodes is not None:
        episodes.restore(
            (checkpoint.path / ENVS_FILE).read_bytes(), f"{where}: {ENVS_FILE}", remedy
        )
    else:
        _set_env_streams(vec_env, checkpoint.state["env_streams"], where, remedy)
    model.set_env(vec_env, force_reset=checkpoint.state["version"] == 1 or episodes is None)
    return model


# ----------------------------------------------------------------------------- callbacks


@dataclass
class _RunState:
    """What the callbacks share and the summary reports."""

    run_dir: Path
    config: TrainConfig
    profile_sha256: str
    """Of the profile file the run trains on, checkpointed: a resume on a changed one is
    refused."""
    evaluation: Evaluation
    reference: RateReference
    episodes: SurrogateEpisodes | None
    """The surrogate's training envs to checkpoint; None live."""
    wandb_id: str | None
    eval_history: list[dict]
    next_eval: int
    next_checkpoint: int
    eval_s: float = 0.0
    checkpoint_s: float = 0.0
    update_s: float = 0.0
    """Seconds in PPO updates (rollout end to the next rollout start)."""
    rollout_end: float | None = None
    last_eval: EvalResult | None = None
    warm_start: dict | None = None
    """What :func:`warm_start` returned, with its seconds; None without one."""
    best: dict | None = None
    """The best evaluation so far (:meth:`EvalResult.to_json`); its model is
    ``BEST_MODEL_FILE``."""

    def save_checkpoint(self, model, vec_env) -> Path:
        state = {
            "config": self.config.to_json(),
            "profile_sha256": self.profile_sha256,
            "rng": _rng_state(),
            "vec_normalize": _vec_normalize_state(vec_env),
            "reference": self.reference.to_json(),
            "wandb_id": self.wandb_id,
            "eval_history": self.eval_history,
            "warm_start": self.warm_start,
            "best": self.best,
        }
        if self.episodes is None:
            state["env_streams"] = _env_streams(vec_env)
            return save_checkpoint(model, self.run_dir, state)
        return save_checkpoint(model, self.run_dir, state, self.episodes.dumps())

    def evaluate(self, model, logger) -> EvalResult:
        start = time.perf_counter()
        policy = PPOPolicy(model, max_batch=self.config.max_batch)
        result = self.evaluation.run(policy, model.num_timesteps)
        self.eval_s += time.perf_counter() - start
        self.last_eval = result
        self.eval_history.append(result.to_json())
        if self.best is None or result.ratio_best_static > self.best["ratio_best_static"]:
            write_atomic(self.run_dir / BEST_MODEL_FILE, _model_bytes(model))
            self.best = result.to_json()
        logger.record("eval/tokens_per_s", result.tokens_per_s)
        logger.record("eval/ratio_best_static", result.ratio_best_static)
        logger.record("eval/ratio_oracle", result.ratio_oracle)
        for name, figures in result.by_workload.items():
            logger.record(f"eval/{name}/ratio_best_static", figures["ratio_best_static"])
            logger.record(f"eval/{name}/ratio_oracle", figures["ratio_oracle"])
        for k, share in result.k_share.items():
            logger.record(f"eval/k_share_{k}", share)
        logger.record("eval/k", np.asarray(result.step_k), exclude=("stdout", "log", "json", "csv"))
        logger.dump(model.num_timesteps)
        _log_to_wandb(result)
        return result


def _log_to_wandb(result: EvalResult) -> None:
    """The evaluation straight into the active wandb run (if any), under ``evaluation/``,
    against ``evaluation/timesteps``: SB3's own records reach wandb through tensorboard, which
    wandb reads on its own schedule (every few seconds), so a short run can end before the
    last evaluation is read."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is None or wandb.run is None:
        return
    wandb.run.define_metric("evaluation/*", step_metric="evaluation/timesteps")
    row = {
        "evaluation/timesteps": result.timesteps,
        "evaluation/tokens_per_s": result.tokens_per_s,
        "evaluation/ratio_best_static": result.ratio_best_static,
        "evaluation/ratio_oracle": result.ratio_oracle,
        "evaluation/k": wandb.Histogram(result.step_k),
    }
    for name, figures in result.by_workload.items():
        row[f"evaluation/{name}/ratio_best_static"] = figures["ratio_best_static"]
        row[f"evaluation/{name}/ratio_oracle"] = figures["ratio_oracle"]
    wandb.run.log(row)


def _callbacks(run: _RunState, *, progress: bool) -> list:
    """SB3 callbacks: evaluation and checkpoints at rollout starts (the policy has just been
    updated and ``num_timesteps`` counts exactly the steps it learned from), and a progress
    bar."""
    from stable_baselines3.common.callbacks import BaseCallback

    class EvalAndCheckpoint(BaseCallback):
        def _on_rollout_end(self) -> None:
            run.rollout_end = time.perf_counter()

        def _on_rollout_start(self) -> None:
            if run.rollout_end is not None:
                run.update_s += time.perf_counter() - run.rollout_end
                run.rollout_end = None
            steps = self.model.num_timesteps
            if run.config.eval_every and steps >= run.next_eval:
                run.evaluate(self.model, self.logger)
                run.next_eval = _next_multiple(steps, run.config.eval_every)
            if steps >= run.next_checkpoint:
                start = time.perf_counter()
                run.save_checkpoint(self.model, self.training_env)
                run.checkpoint_s += time.perf_counter() - start
                run.next_checkpoint = _next_multiple(steps, run.config.checkpoint_every)

        def _on_step(self) -> bool:
            return True

    class ProgressBar(BaseCallback):
        def _on_training_start(self) -> None:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=run.config.total_timesteps,
                initial=self.model.num_timesteps,
                unit="step",
                desc="train",
                disable=not progress,
            )
            self.shown_eval = None

        def _on_step(self) -> bool:
            self.bar.update(self.training_env.num_envs)
            if run.last_eval is not None and run.last_eval is not self.shown_eval:
                self.shown_eval = run.last_eval
                self.bar.set_postfix_str(
                    f"eval {run.last_eval.ratio_best_static:.3f}x best static, "
                    f"{run.last_eval.ratio_oracle:.3f}x oracle"
                )
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    return [EvalAndCheckpoint(), ProgressBar()]


def _next_multiple(steps: int, every: int) -> int:
    return (steps // every + 1) * every


# ----------------------------------------------------------------------------- train


@dataclass
class TrainResult:
    run_dir: Path
    num_timesteps: int
    final_eval: EvalResult
    summary: dict
    """What summary.json holds."""
    model: object = field(repr=False, default=None)
    """The trained ``stable_baselines3.PPO``."""


def check_start(config: TrainConfig, *, resume: bool) -> Checkpoint | None:
    """Refuse a run :func:`train` could not start: a resume without a usable checkpoint or
    with a change it may not make, a fresh run where one already is or whose directory cannot
    be made. Writes nothing but a fresh run's parent directory. Returns the checkpoint a
    resume goes on from."""
    if not resume:
        _check_fresh(Path(config.out))
        return None
    checkpoint = latest_checkpoint(config.out)
    _check_resumable(config, checkpoint)
    return checkpoint


def _check_fresh(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise SpecrlError(f"--out {run_dir} is a file; a run needs a directory, give another")
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpecrlError(f"--out {run_dir}: cannot write there ({err.strerror or err})") from None
    taken = [p for p in (CONFIG_FILE, MODEL_FILE, CHECKPOINT_DIR) if (run_dir / p).exists()]
    if taken:
        raise SpecrlError(
            f"{run_dir} already holds a run ({', '.join(taken)}); continue it with "
            f"`specrl train --resume {run_dir}` or choose another --out"
        )


def _check_resumable(config: TrainConfig, checkpoint: Checkpoint) -> None:
    changed = [
        name for name in config.changes_from(checkpoint.config) if name not in RESUMABLE_CHANGES
    ]
    if changed:
        raise SpecrlError(
            f"cannot resume {checkpoint.path.parent.parent} with a different {', '.join(changed)}"
            f" (a resumed run may change only {', '.join(RESUMABLE_CHANGES)}); start a new "
            "run instead"
        )
    run_dir = checkpoint.path.parent.parent
    profile, trained_on = _profile_path(config), checkpoint.state.get("profile_sha256")
    if trained_on is not None and profile.is_file() and _sha256(profile) != trained_on:
        raise SpecrlError(
            f"cannot resume {run_dir}: its profile {profile} has changed since the checkpoint "
            f"at step {checkpoint.num_timesteps:,}, and the run goes on as it trained, on the "
            "profile as it was; put that file back, or start a new run"
        )
    if checkpoint.num_timesteps < config.total_timesteps:
        return
    if not (run_dir / SUMMARY_FILE).is_file():
        raise SpecrlError(
            f"{run_dir} was stopped after its final checkpoint ({checkpoint.num_timesteps} "
            f"steps) and before its {SUMMARY_FILE}; delete {checkpoint.path} and resume again "
            "to finish from the checkpoint before it, or pass a total above it (--timesteps)"
        )
    raise SpecrlError(
        f"{run_dir} is trained to {checkpoint.num_timesteps} steps already; pass a total "
        "above it (--timesteps) to train on"
    )


def _make_vec_env(config: TrainConfig, profile: Profile, reference: RateReference):
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    if config.env == "live":
        vec_env = DummyVecEnv([lambda: Monitor(make_live_training_env(config, profile, reference))])
    else:
        vec_env = DummyVecEnv(
            [lambda: Monitor(make_training_env(config, profile, reference))] * config.n_envs
        )
    if config.normalize_reward:
        vec_env = VecNormalize(vec_env, norm_obs=False, norm_reward=True, gamma=config.gamma)
    return vec_env


def _new_model(config: TrainConfig, vec_env):
    from stable_baselines3 import PPO

    return PPO(
        "MlpPolicy",
        vec_env,
        n_steps=config.n_steps,
        batch_size=config.batch_size,
        n_epochs=config.n_epochs,
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
        ent_coef=config.ent_coef,
        learning_rate=config.learning_rate,
        policy_kwargs={"net_arch": list(config.net_arch)},
        seed=config.seed,
        device="cpu",
        verbose=0,
    )


def _init_model(config: TrainConfig, vec_env):
    """The model of the finished run ``config.init``, to train on with this run's env and
    hyperparameters (its weights and optimizer state come along)."""
    from stable_baselines3 import PPO

    from specrl.train.config import load_config

    source = Path(config.init)
    if source.resolve() == Path(config.out).resolve():
        raise SpecrlError(f"--init {source} is this run's own --out; give a finished run")
    theirs = load_config(source)
    for name in ("k_max", "max_batch"):
        if getattr(theirs, name) != getattr(config, name):
            raise SpecrlError(
                f"--init {source} was trained with {name}={getattr(theirs, name)}, this run "
                f"has {name}={getattr(config, name)}; they must match"
            )
    path = source / MODEL_FILE
    if not path.is_file():
        raise SpecrlError(f"--init {source}: {MODEL_FILE} missing; finish that run first")
    try:
        model = PPO.load(
            path,
            env=vec_env,
            device="cpu",
            custom_objects={
                "n_steps": config.n_steps,
                "batch_size": config.batch_size,
                "n_epochs": config.n_epochs,
                "gamma": config.gamma,
                "gae_lambda": config.gae_lambda,
                "ent_coef": config.ent_coef,
                "learning_rate": config.learning_rate,
            },
        )
    except Exception as err:  # SB3 raises whatever zipfile, torch or pickle raise
        raise SpecrlError(
            f"--init {source}: {path} is not a readable SB3 model ({err}); train that run "
            "again, or give another finished run"
        ) from None
    model.num_timesteps = 0
    return model


def _tensorboard_dir(run_dir: Path) -> Path | None:
    """``RUN_DIR/tb`` (a resumed run adds to it), or None with a warning where tensorboard is
    not installed."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        warnings.warn(
            "tensorboard is not installed: no tensorboard logs, and wandb gets no training "
            "curves (pip install tensorboard)",
            category=SpecrlWarning,
            stacklevel=3,
        )
        return None
    return run_dir / "tb"


def _make_logger(tensorboard_dir: Path | None):
    """SB3's logger, writing tensorboard events to ``tensorboard_dir`` (None: nothing). Made
    after wandb.init, whose tensorboard patch must see the event writer created."""
    from stable_baselines3.common.logger import Logger, configure

    if tensorboard_dir is None:
        return Logger(folder=None, output_formats=[])
    return configure(str(tensorboard_dir), ["tensorboard"])


def _start_wandb(config: TrainConfig, run_dir: Path, wandb_id: str | None, tensorboard_dir):
    """A wandb run syncing SB3's tensorboard logs, or None with ``wandb="disabled"``."""
    if config.wandb == "disabled":
        return None
    import wandb

    if tensorboard_dir is not None:
        # Naming the root before wandb.init keeps the keys as SB3 records them
        # ("eval/ratio_oracle") and spares wandb a 10 s wait to guess it.
        wandb.tensorboard.patch(root_logdir=str(tensorboard_dir))
    from specrl.report.dashboard import init_wandb

    try:
        return init_wandb(
            project="specrl",
            # The run directory and its parent: experiments name runs seed-0/run, micro/run.
            name="/".join(run_dir.resolve().parts[-2:]),
            id=wandb_id,
            resume="allow" if wandb_id else None,
            mode=config.wandb,
            dir=str(run_dir),
            config=config.to_json(),
            sync_tensorboard=tensorboard_dir is not None,
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
    except Exception:
        wandb.tensorboard.unpatch()
        raise


def _timing(run: _RunState, vec_env, *, steps: int, wall_s: float) -> dict:
    """Where this session's training time went: env steps and resets, PPO updates, held-out
    evaluation, checkpoints, and the rest (mostly the policy's forward passes in rollouts)."""
    env_s = float(sum(vec_env.get_attr("env_seconds")))
    return {
        "steps": steps,
        "wall_s": wall_s,
        "steps_per_s": steps / wall_s if wall_s > 0 else 0.0,
        "env_s": env_s,
        "env_share": env_s / wall_s if wall_s > 0 else 0.0,
        "update_s": run.update_s,
        "eval_s": run.eval_s,
        "checkpoint_s": run.checkpoint_s,
        "rest_s": wall_s - env_s - run.update_s - run.eval_s - run.checkpoint_s,
    }


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True, callbacks=()):
    """Train PPO on the surrogate as ``config`` says; returns a :class:`TrainResult`.

    :param config: the run; ``config.out`` is the run directory.
    :param resume: continue the run in ``config.out`` from its newest checkpoint, up to
        ``config.total_timesteps``: model, optimizer, reward-normalisation statistics,
        reward reference, timestep count and global RNG state come back, and so do the
        surrogate's training envs, mid-episode: a resumed surrogate run trains exactly as the
        run would have had it never stopped. Live, the envs start fresh episodes from their
        saved random streams (see :func:`_resume_model`). Only
        :data:`~specrl.train.config.RESUMABLE_CHANGES` may differ from the checkpoint's
        config. Nothing is written before the checkpoint has been read and the model loaded.
    :param progress: show a progress bar.
    :param callbacks: more SB3 callbacks to run.
    """
    import torch

    run_dir = Path(config.out)
    checkpoint = check_start(config, resume=resume)
    torch.set_num_threads(config.torch_threads)
    profile, profile_path = _load_run_profile(config)
    check_request_lengths(config, profile)
    rollout = config.n_envs * config.n_steps
    steps = -(-config.total_timesteps // rollout) * rollout
    if steps > 1.1 * config.total_timesteps:
        # SB3 ends PPO only between whole rollouts; say so where that trains much more than
        # asked (the defaults' 200,000 train 200,704, which needs no word).
        warnings.warn(
            f"PPO collects whole rollouts of n_envs x n_steps = {rollout:,} steps, so "
            f"total_timesteps {config.total_timesteps:,} trains {steps:,}",
            category=SpecrlWarning,
            stacklevel=2,
        )
    reference = new_reference(config, profile)
    vec_env = _make_vec_env(config, profile, reference)
    episodes = SurrogateEpisodes(vec_env, reference) if config.env == "surrogate" else None
    if checkpoint is not None:
        model = _resume_model(checkpoint, vec_env, episodes)
        _set_rng_state(checkpoint.state["rng"])
        reference.load_json(checkpoint.state["reference"], f"checkpoint {checkpoint.path}")
        if checkpoint.state.get("vec_normalize"):
            _set_vec_normalize_state(vec_env, checkpoint.state["vec_normalize"])
        wandb_id = checkpoint.state.get("wandb_id")
        history = list(checkpoint.state["eval_history"])
        cloned = checkpoint.state.get("warm_start")
        best = checkpoint.state.get("best")
        saved_best = checkpoint.path / BEST_MODEL_FILE
        if best is not None and saved_best.is_file():
            write_atomic(run_dir / BEST_MODEL_FILE, saved_best.read_bytes())
        elif best is not None and not (run_dir / BEST_MODEL_FILE).is_file():
            best = None  # its model is gone: the remaining evaluations choose again
        # What the run now trains to (--timesteps may have raised it): a later plain
        # --resume, seeds.py and the demo read this.
        config.save(run_dir / CONFIG_FILE)
    else:
        if config.init:
            model = _init_model(config, vec_env)
            # Training goes on: so does the reward's reference, from the rates reached so far.
            source = latest_checkpoint(config.init)
            reference.load_json(source.state["reference"], f"checkpoint {source.path}")
            if not floors_reference(config):
                reference.floor[:] = 0.0
        else:
            model = _new_model(config, vec_env)
        wandb_id, history = None, []
        run_dir.mkdir(parents=True, exist_ok=True)
        config.save(run_dir / CONFIG_FILE)
        cloned = best = None
        if config.warm_start != "none" and not config.init:
            began = time.perf_counter()
            floor = reference if floors_reference(config) else None
            cloned = warm_start(model, config, profile, progress=progress, reference=floor)
            cloned["seconds"] = round(time.perf_counter() - began, 1)
    start_steps = model.num_timesteps
    run = _RunState(
        run_dir=run_dir,
        config=config,
        profile_sha256=_sha256(profile_path),
        evaluation=Evaluation(config, profile),
        reference=reference,
        episodes=episodes,
        wandb_id=wandb_id,
        eval_history=history,
        next_eval=_next_multiple(start_steps, config.eval_every) if config.eval_every else 0,
        next_checkpoint=_next_multiple(start_steps, config.checkpoint_every),
        warm_start=cloned,
        best=best,
    )
    tensorboard_dir = _tensorboard_dir(run_dir)
    wandb_run = logger = None
    try:
        wandb_run = _start_wandb(config, run_dir, wandb_id, tensorboard_dir)
        if wandb_run is not None:
            run.wandb_id = wandb_run.id  # a resumed run logs to the same wandb run
        logger = _make_logger(tensorboard_dir)
        model.set_logger(logger)
        all_callbacks = _callbacks(run, progress=progress) + list(callbacks)
        if wandb_run is not None:
            from wandb.integration.sb3 import WandbCallback

            all_callbacks.append(WandbCallback(verbose=0))
        wall = time.perf_counter()
        model.learn(
            total_timesteps=config.total_timesteps - start_steps,
            callback=all_callbacks,
            reset_num_timesteps=checkpoint is None,
        )
        end = time.perf_counter()
        wall_s = end - wall
        if run.rollout_end is not None:  # the last update ends the run
            run.update_s += end - run.rollout_end
        timing = _timing(run, vec_env, steps=model.num_timesteps - start_steps, wall_s=wall_s)
        final = run.evaluate(model, logger)
        write_atomic(run_dir / LAST_MODEL_FILE, _model_bytes(model))
        write_atomic(run_dir / MODEL_FILE, (run_dir / BEST_MODEL_FILE).read_bytes())
        summary = {
            "format": SUMMARY_FORMAT,
            "version": SUMMARY_VERSION,
            "num_timesteps": model.num_timesteps,
            "profile": str(profile_path),
            "profile_sha256": run.profile_sha256,
            "wandb_id": run.wandb_id,
            "final_eval": final.to_json(),
            "model_eval": run.best,
            "eval_history": run.eval_history,
            "timing": timing,
            "warm_start": run.warm_start,
            "config": config.to_json(),
        }
        write_json(run_dir / SUMMARY_FILE, summary)
        # After the summary, which marks the run finished: a checkpoint at the total with no
        # summary beside it would be a run that neither --resume nor export could finish.
        # Stopped here, the run is finished; a longer one goes on from the checkpoint before.
        run.save_checkpoint(model, vec_env)
    finally:
        vec_env.close()
        if logger is not None:
            logger.close()  # the last tensorboard events are on disk before wandb finishes
        if wandb_run is not None:
            wandb_run.finish()
            if tensorboard_dir is not None:  # patched by _start_wandb: the next run patches
                import wandb

                wandb.tensorboard.unpatch()
    return TrainResult(
        run_dir=run_dir,
        num_timesteps=model.num_timesteps,
        final_eval=final,
        summary=summary,
        model=model,
    )
