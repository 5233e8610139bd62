"""A run's checkpoints: ``RUN_DIR/checkpoints/step-N``, written whole or not at all, found and
validated, and a model resumed from one with its training envs where it left them."""

from __future__ import annotations

import io
import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrl.config import (
    BEST_MODEL_FILE,
    CHECKPOINT_DIR,
    ENVS_FILE,
    MODEL_FILE,
    TrainConfig,
)
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.files import check_header, read_json, write_atomic
from specrl.train.state import SurrogateEpisodes, set_env_streams

CHECKPOINT_FORMAT = "specrl-train-checkpoint"
CHECKPOINT_VERSION = 2
"""Version 2 keeps the training envs' episodes (surrogate) or random streams (live); a version 1
checkpoint resumes on fresh episodes."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def model_bytes(model) -> bytes:
    buffer = io.BytesIO()
    model.save(buffer)  # parameters and the optimizer's state
    return buffer.getvalue()


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
    write_atomic(partial / MODEL_FILE, model_bytes(model))
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
        pass  # written before the training envs were checkpointed: see resume_model
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


def resume_model(checkpoint: Checkpoint, vec_env, episodes: SurrogateEpisodes | None):
    """The checkpoint's model, training on ``vec_env`` with its envs where the checkpoint left
    them: a surrogate run's mid-episode, as saved (and the model's last observation of them);
    a live run's at fresh episodes drawn from their saved random streams (the engine's caches
    and requests in flight are not saved). A version 1 checkpoint, or one whose envs an older
    specrl pickled (:data:`~specrl.train.state.OLD_TRAINING_ENV`), goes on from fresh episodes
    seeded from ``(seed, timesteps)``, with a warning."""
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
        older = "without its training envs' episodes"
    elif episodes is None:
        set_env_streams(vec_env, checkpoint.state["env_streams"], where, remedy)
        older = None
    else:
        saved = (checkpoint.path / ENVS_FILE).read_bytes()
        restored = episodes.restore(saved, f"{where}: {ENVS_FILE}", remedy)
        older = None if restored else "whose training envs this one cannot restore"
    if older is not None:
        warnings.warn(
            f"{where} was written by an older specrl, {older}: the run goes on from fresh "
            "episodes, not as it would have had it never stopped",
            category=SpecrlWarning,
            stacklevel=4,  # the caller of train()
        )
        seed = np.random.SeedSequence([checkpoint.config.seed, checkpoint.num_timesteps])
        vec_env.seed(int(seed.generate_state(1)[0]))
    model.set_env(vec_env, force_reset=older is not None or episodes is None)
    return model
