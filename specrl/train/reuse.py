"""Train a run, go on with it, or reuse it: :func:`train_or_resume`, for the jobs that own a
run directory and are started again after a stop (``specrl demo``'s cache, a sweep's trial).

``specrl train --resume`` asks the user what to do; these jobs decide from what the directory
holds, so that starting them again loses nothing and repeats nothing."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from specrl.config import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    MODEL_FILE,
    SUMMARY_FILE,
    TrainConfig,
    load_config,
)
from specrl.errors import SpecrlError

ON_CHANGE = ("refuse", "restart")
"""What :func:`train_or_resume` does with a run made with other settings."""


def train_or_resume(
    config: TrainConfig,
    *,
    on_change: str = "refuse",
    hint: str = "give the run another out",
    say: Callable[[str], None] = lambda text: None,
    progress: bool = False,
) -> str:
    """Make the run ``config`` describes in ``config.out``, doing only what is left.

    Returns ``"reused"`` where that run finished (its summary and model are there),
    ``"resumed"`` where it stopped after a checkpoint (it goes on from the last one, or from
    the one before where it stopped after its final checkpoint but before its summary), and
    ``"trained"`` where there was nothing to go on from (no directory, or stopped before its
    first checkpoint: started again).

    A run there made with settings that cannot be resumed (:data:`RESUMABLE_CHANGES` aside),
    or whose files do not load: ``on_change="refuse"`` raises a SpecrlError ending in
    ``hint``; ``"restart"`` (a cache the caller owns) deletes it and trains afresh. ``say``
    is told each decision in a line."""
    if on_change not in ON_CHANGE:
        raise ValueError(f"on_change must be one of {ON_CHANGE}, got {on_change!r}")
    run_dir = Path(config.out)
    if not (run_dir / CONFIG_FILE).is_file():
        if run_dir.exists():  # stopped before it wrote its config: nothing to keep
            shutil.rmtree(run_dir)
        return _train(config, progress)
    try:
        saved = load_config(run_dir)
    except SpecrlError as err:
        if on_change == "refuse":
            raise SpecrlError(f"{err}; {hint}") from None
        say(f"  {err}")
        return _restart(config, say, progress)
    changed = config.unresumable_changes_from(saved)
    if changed:
        if on_change == "refuse":
            raise SpecrlError(f"{run_dir} holds a run with another {', '.join(changed)}; {hint}")
        say(f"  {run_dir} was trained with other settings ({', '.join(changed)})")
        return _restart(config, say, progress)
    if (run_dir / SUMMARY_FILE).is_file() and (run_dir / MODEL_FILE).is_file():
        say(f"  reusing {run_dir} (trained to {config.total_timesteps:,} steps)")
        return "reused"
    from specrl.train.checkpoint import latest_checkpoint

    if any((run_dir / CHECKPOINT_DIR).glob("step-*")):
        final = latest_checkpoint(run_dir)
        if final.num_timesteps >= config.total_timesteps:
            # Stopped after its final checkpoint, before its summary: train refuses to go on
            # from a checkpoint at the total, so go on from the one before.
            shutil.rmtree(final.path)
    if not any((run_dir / CHECKPOINT_DIR).glob("step-*")):
        return _restart(config, say, progress)  # stopped before its first checkpoint
    say(f"  resuming {run_dir} from its last checkpoint")
    from specrl.train.run import train

    train(config, resume=True, progress=progress)
    return "resumed"


def _restart(config: TrainConfig, say, progress: bool) -> str:
    say(f"  starting {config.out} again")
    shutil.rmtree(config.out)
    return _train(config, progress)


def _train(config: TrainConfig, progress: bool) -> str:
    from specrl.train.run import train

    train(config, progress=progress)
    return "trained"
