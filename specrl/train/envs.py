"""The envs a run trains, evaluates and warm-starts on, built from its :class:`TrainConfig`,
with the profile they simulate and the checks made on both before anything trains."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from specrl.config import TrainConfig
from specrl.envs.live import LiveSpecEnv
from specrl.envs.surrogate import SurrogateSpecEnv, default_profile_path
from specrl.envs.training import RateReference, TrainingEnv, profile_reference
from specrl.errors import SpecrlError
from specrl.profile import Profile, load_profile
from specrl.workload import profile_workload_kwargs
from specrl.workload.trace import DEFAULT_OUTPUT_LENGTHS, DEFAULT_PROMPT_LENGTHS


def run_profile_path(config: TrainConfig) -> Path:
    """The profile file ``config`` trains on: its ``profile``, or the one shipped."""
    return Path(config.profile) if config.profile else default_profile_path()


def load_run_profile(config: TrainConfig) -> tuple[Profile, Path]:
    """The profile ``config`` trains on, and its path."""
    path = run_profile_path(config)
    return load_profile(path), path


def sha256_of(path: Path) -> str:
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


def workload_kwargs(config: TrainConfig) -> dict:
    """What the envs pass to the workload presets: peak concurrency and requests per trace."""
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
        workload_kwargs=workload_kwargs(config),
        k_max=config.k_max,
        max_batch=config.max_batch,
        max_len=config.max_len,
        acceptance_estimate=config.acceptance_estimate,
    )


def new_reference(config: TrainConfig, profile: Profile) -> RateReference:
    """The reward's reference before any training step: the profile's best static rate per
    batch size, or (``reward_reference="workload"``) its mean, once per workload."""
    initial = profile_reference(profile, config.max_batch, config.k_max)
    if config.reward_reference == "workload":
        initial = np.full(len(config.workloads), initial[1:].mean())
    return RateReference(initial)


def make_training_env(
    config: TrainConfig, profile: Profile, reference: RateReference | None = None
) -> TrainingEnv:
    """A surrogate training env; envs that share ``reference`` (default: a new one) share
    ``rho``."""
    return TrainingEnv(
        surrogate_env(config, profile, config.workloads[0]),
        workloads=config.workloads,
        reference=reference or new_reference(config, profile),
        by_workload=config.reward_reference == "workload",
        shaping_gamma=config.gamma if config.shape_catchup else None,
    )


def make_live_training_env(
    config: TrainConfig, profile: Profile, reference: RateReference
) -> TrainingEnv:
    """The live training env of ``config`` (one engine, the default pair ``config.preset``),
    its reference keyed as ``config.reward_reference`` says, without catch-up shaping; the
    profile's freshness is checked first (refused when stale unless ``config.force_profile``)."""
    live = LiveSpecEnv(
        preset=config.preset,
        workload=config.workloads[0],
        workload_kwargs=workload_kwargs(config),
        k_max=config.k_max,
        max_batch=config.max_batch,
        max_len=config.max_len,
        profile=profile,
        force_profile=config.force_profile,
        acceptance_estimate=config.acceptance_estimate,
    )
    return TrainingEnv(
        live,
        workloads=config.workloads,
        reference=reference,
        by_workload=config.reward_reference == "workload",
    )


def make_vec_env(config: TrainConfig, profile: Profile, reference: RateReference):
    """The run's training envs, each in SB3's ``Monitor``, in a ``DummyVecEnv`` (under a
    ``VecNormalize`` of the reward with ``config.normalize_reward``); one env live."""
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
