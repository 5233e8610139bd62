"""``train()``: PPO on the surrogate (or the live engine) as a :class:`TrainConfig` says, and
the checks made before it starts. ``specrl train`` and ``experiments/train_ppo.py`` share it.

A run goes: check the start (:func:`check_start`), build the envs (:mod:`specrl.train.envs`),
start a model or resume one (:mod:`specrl.train.checkpoint`, :mod:`specrl.train.warm_start`),
learn with the callbacks that evaluate and checkpoint (:mod:`specrl.train.callbacks`), then
evaluate once more and write the models and the summary.

stable-baselines3, torch and wandb are imported inside functions only.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from specrl.config import (
    BEST_MODEL_FILE,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    LAST_MODEL_FILE,
    MODEL_FILE,
    RESUMABLE_CHANGES,
    SUMMARY_FILE,
    TrainConfig,
    load_config,
)
from specrl.envs.training import RateReference
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.files import write_atomic, write_json
from specrl.profile import Profile
from specrl.train.callbacks import RunState, make_callbacks, next_multiple
from specrl.train.checkpoint import Checkpoint, latest_checkpoint, model_bytes, resume_model
from specrl.train.envs import (
    check_request_lengths,
    floors_reference,
    load_run_profile,
    make_vec_env,
    new_reference,
    run_profile_path,
    sha256_of,
)
from specrl.train.evaluate import EvalResult, Evaluation
from specrl.train.logs import close_logs, make_logger, start_wandb, tensorboard_dir
from specrl.train.state import SurrogateEpisodes, set_rng_state, set_vec_normalize_state
from specrl.train.warm_start import check_teacher, warm_start

SUMMARY_FORMAT = "specrl-train-summary"
SUMMARY_VERSION = 1


@dataclass
class TrainResult:
    run_dir: Path
    num_timesteps: int
    final_eval: EvalResult
    summary: dict
    """What summary.json holds."""
    model: object = field(repr=False, default=None)
    """The trained ``stable_baselines3.PPO``."""


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True, callbacks=()):
    """Train PPO on the surrogate as ``config`` says; returns a :class:`TrainResult`.

    :param config: the run; ``config.out`` is the run directory.
    :param resume: continue the run in ``config.out`` from its newest checkpoint, up to
        ``config.total_timesteps``: model, optimizer, reward-normalisation statistics,
        reward reference, timestep count and global RNG state come back, and so do the
        surrogate's training envs, mid-episode: a resumed surrogate run trains exactly as the
        run would have had it never stopped. Live, the envs start fresh episodes from their
        saved random streams (see :func:`~specrl.train.checkpoint.resume_model`). Only
        :data:`~specrl.config.RESUMABLE_CHANGES` may differ from the checkpoint's
        config. Nothing is written before the checkpoint has been read and the model loaded.
    :param progress: show a progress bar.
    :param callbacks: more SB3 callbacks to run.
    """
    import torch

    run_dir = Path(config.out)
    checkpoint = check_start(config, resume=resume)
    torch.set_num_threads(config.torch_threads)
    profile, profile_path = load_run_profile(config)
    check_request_lengths(config, profile)
    _warn_whole_rollouts(config)
    reference = new_reference(config, profile)
    vec_env = make_vec_env(config, profile, reference)
    episodes = SurrogateEpisodes(vec_env, reference) if config.env == "surrogate" else None
    if checkpoint is not None:
        model, carried = _resume(checkpoint, config, vec_env, reference, episodes)
    else:
        model, carried = _start(config, profile, vec_env, reference, progress=progress)
    start_steps = model.num_timesteps
    run = RunState(
        run_dir=run_dir,
        config=config,
        profile_sha256=sha256_of(profile_path),
        evaluation=Evaluation(config, profile),
        reference=reference,
        episodes=episodes,
        next_eval=next_multiple(start_steps, config.eval_every) if config.eval_every else 0,
        next_checkpoint=next_multiple(start_steps, config.checkpoint_every),
        **carried,
    )
    final, summary = _learn(
        run,
        model,
        vec_env,
        tensorboard_dir(run_dir),
        callbacks,
        profile_path=profile_path,
        progress=progress,
        resumed=checkpoint is not None,
    )
    return TrainResult(
        run_dir=run_dir,
        num_timesteps=model.num_timesteps,
        final_eval=final,
        summary=summary,
        model=model,
    )


def _warn_whole_rollouts(config: TrainConfig) -> None:
    """SB3 ends PPO only between whole rollouts; say so where that trains much more than
    asked (the defaults' 200,000 train 200,704, which needs no word)."""
    rollout = config.n_envs * config.n_steps
    steps = -(-config.total_timesteps // rollout) * rollout
    if steps > 1.1 * config.total_timesteps:
        warnings.warn(
            f"PPO collects whole rollouts of n_envs x n_steps = {rollout:,} steps, so "
            f"total_timesteps {config.total_timesteps:,} trains {steps:,}",
            category=SpecrlWarning,
            stacklevel=3,  # the caller of train()
        )


def _start(
    config: TrainConfig,
    profile: Profile,
    vec_env,
    reference: RateReference,
    *,
    progress: bool,
) -> tuple[object, dict]:
    """A fresh run's model (new, or ``config.init``'s with its reference) after the warm
    start, with the run directory and its config written; and the :class:`RunState` fields
    a fresh run starts from."""
    run_dir = Path(config.out)
    if config.init:
        model = _init_model(config, vec_env)
        # Training goes on: so does the reward's reference, from the rates reached so far.
        source = latest_checkpoint(config.init)
        reference.load_json(source.state["reference"], f"checkpoint {source.path}")
        if not floors_reference(config):
            reference.floor[:] = 0.0
    else:
        model = _new_model(config, vec_env)
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(run_dir / CONFIG_FILE)
    cloned = None
    if config.warm_start != "none" and not config.init:
        began = time.perf_counter()
        floor = reference if floors_reference(config) else None
        cloned = warm_start(model, config, profile, progress=progress, reference=floor)
        cloned["seconds"] = round(time.perf_counter() - began, 1)
    return model, {"wandb_id": None, "eval_history": [], "warm_start": cloned, "best": None}


def _resume(
    checkpoint: Checkpoint,
    config: TrainConfig,
    vec_env,
    reference: RateReference,
    episodes: SurrogateEpisodes | None,
) -> tuple[object, dict]:
    """The checkpoint's model with the global RNGs, the reward's reference and normalisation
    and the best model so far put back, and the config saved; and the :class:`RunState`
    fields the run goes on from."""
    run_dir = Path(config.out)
    state = checkpoint.state
    model = resume_model(checkpoint, vec_env, episodes)
    set_rng_state(state["rng"])
    reference.load_json(state["reference"], f"checkpoint {checkpoint.path}")
    if state.get("vec_normalize"):
        set_vec_normalize_state(vec_env, state["vec_normalize"])
    best = state.get("best")
    saved_best = checkpoint.path / BEST_MODEL_FILE
    if best is not None and saved_best.is_file():
        write_atomic(run_dir / BEST_MODEL_FILE, saved_best.read_bytes())
    elif best is not None and not (run_dir / BEST_MODEL_FILE).is_file():
        best = None  # its model is gone: the remaining evaluations choose again
    # What the run now trains to (--timesteps may have raised it): a later plain --resume,
    # seeds.py and the demo read this.
    config.save(run_dir / CONFIG_FILE)
    carried = {
        "wandb_id": state.get("wandb_id"),
        "eval_history": list(state["eval_history"]),
        "warm_start": state.get("warm_start"),
        "best": best,
    }
    return model, carried


def _learn(
    run: RunState,
    model,
    vec_env,
    tensorboard: Path | None,
    callbacks,
    *,
    profile_path: Path,
    progress: bool,
    resumed: bool,
) -> tuple[EvalResult, dict]:
    """Train ``model`` up to ``config.total_timesteps`` logging to tensorboard and wandb,
    then finish the run (:func:`_finish`); the envs and the logs are closed either way."""
    config = run.config
    wandb_run = logger = None
    try:
        wandb_run = start_wandb(config, run.run_dir, run.wandb_id, tensorboard)
        if wandb_run is not None:
            run.wandb_id = wandb_run.id  # a resumed run logs to the same wandb run
        logger = make_logger(tensorboard)
        model.set_logger(logger)
        all_callbacks = make_callbacks(run, progress=progress) + list(callbacks)
        if wandb_run is not None:
            from wandb.integration.sb3 import WandbCallback

            all_callbacks.append(WandbCallback(verbose=0))
        start_steps = model.num_timesteps
        wall = time.perf_counter()
        model.learn(
            total_timesteps=config.total_timesteps - start_steps,
            callback=all_callbacks,
            reset_num_timesteps=not resumed,
        )
        end = time.perf_counter()
        if run.rollout_end is not None:  # the last update ends the run
            run.update_s += end - run.rollout_end
        timing = run.timing(vec_env, steps=model.num_timesteps - start_steps, wall_s=end - wall)
        return _finish(run, model, vec_env, logger, timing, profile_path=profile_path)
    finally:
        vec_env.close()
        close_logs(logger, wandb_run, tensorboard)


def _finish(
    run: RunState, model, vec_env, logger, timing: dict, *, profile_path: Path
) -> tuple[EvalResult, dict]:
    """The final evaluation, the last and the chosen models, summary.json and the final
    checkpoint."""
    run_dir = run.run_dir
    final = run.evaluate(model, logger)
    write_atomic(run_dir / LAST_MODEL_FILE, model_bytes(model))
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
        "config": run.config.to_json(),
    }
    write_json(run_dir / SUMMARY_FILE, summary)
    # After the summary, which marks the run finished: a checkpoint at the total with no
    # summary beside it would be a run that neither --resume nor export could finish.
    # Stopped here, the run is finished; a longer one goes on from the checkpoint before.
    run.save_checkpoint(model, vec_env)
    return final, summary


# ----------------------------------------------------------------------------- start checks


def check_start(config: TrainConfig, *, resume: bool) -> Checkpoint | None:
    """Refuse a run :func:`train` could not start: a resume without a usable checkpoint or
    with a change it may not make, a fresh run where one already is or whose directory cannot
    be made. Writes nothing but a fresh run's parent directory. Returns the checkpoint a
    resume goes on from."""
    if not resume:
        _check_fresh(Path(config.out))
        check_teacher(config)
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
    changed = config.unresumable_changes_from(checkpoint.config)
    if changed:
        raise SpecrlError(
            f"cannot resume {checkpoint.path.parent.parent} with a different {', '.join(changed)}"
            f" (a resumed run may change only {', '.join(RESUMABLE_CHANGES)}); start a new "
            "run instead"
        )
    run_dir = checkpoint.path.parent.parent
    profile, trained_on = run_profile_path(config), checkpoint.state.get("profile_sha256")
    if trained_on is not None and profile.is_file() and sha256_of(profile) != trained_on:
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


# ----------------------------------------------------------------------------- models


def _new_model(config: TrainConfig, vec_env):
    """A new PPO model of ``config``'s network and hyperparameters, seeded with its seed."""
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

    source = Path(config.init)
    if source.resolve() == Path(config.out).resolve():
        raise SpecrlError(f"--init {source} is this run's own --out; give a finished run")
    theirs = load_config(source)
    for name in ("k_max", "max_batch", "acceptance_estimate"):
        if getattr(theirs, name) != getattr(config, name):
            option = "--" + name.replace("_", "-")
            raise SpecrlError(
                f"--init {source} was trained with {name}={getattr(theirs, name)}, this run "
                f"has {name}={getattr(config, name)}; they must match (pass {option} "
                f"{getattr(theirs, name)})"
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
