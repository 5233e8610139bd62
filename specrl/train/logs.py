"""Where a run's curves go: SB3's logger writing tensorboard events, and wandb syncing them
(and the evaluations, directly). wandb is imported only where a run uses it."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

from specrl.config import TrainConfig
from specrl.errors import SpecrlWarning
from specrl.report.dashboard import init_wandb
from specrl.train.evaluate import EvalResult


def tensorboard_dir(run_dir: Path) -> Path | None:
    """``RUN_DIR/tb`` (a resumed run adds to it), or None with a warning where tensorboard is
    not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        warnings.warn(
            "tensorboard is not installed: no tensorboard logs, and wandb gets no training "
            "curves (pip install tensorboard)",
            category=SpecrlWarning,
            stacklevel=3,
        )
        return None
    return run_dir / "tb"


def make_logger(tensorboard_dir: Path | None):
    """SB3's logger, writing tensorboard events to ``tensorboard_dir`` (None: nothing). Made
    after wandb.init, whose tensorboard patch must see the event writer created."""
    from stable_baselines3.common.logger import Logger, configure

    if tensorboard_dir is None:
        return Logger(folder=None, output_formats=[])
    return configure(str(tensorboard_dir), ["tensorboard"])


def start_wandb(config: TrainConfig, run_dir: Path, wandb_id: str | None, tensorboard_dir):
    """A wandb run syncing SB3's tensorboard logs, or None with ``wandb="disabled"``."""
    if config.wandb == "disabled":
        return None
    import wandb

    if tensorboard_dir is not None:
        # Naming the root before wandb.init keeps the keys as SB3 records them
        # ("eval/ratio_oracle") and spares wandb a 10 s wait to guess it.
        wandb.tensorboard.patch(root_logdir=str(tensorboard_dir))
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


def close_logs(logger, wandb_run, tensorboard_dir: Path | None) -> None:
    """Close what :func:`make_logger` and :func:`start_wandb` opened (either may be None)."""
    if logger is not None:
        logger.close()  # the last tensorboard events are on disk before wandb finishes
    if wandb_run is not None:
        wandb_run.finish()
        if tensorboard_dir is not None:  # patched by start_wandb: the next run patches
            import wandb

            wandb.tensorboard.unpatch()


def log_to_wandb(result: EvalResult) -> None:
    """The evaluation straight into the active wandb run (if any), under ``evaluation/``,
    against ``evaluation/timesteps``: SB3's own records reach wandb through tensorboard, which
    wandb reads on its own schedule (every few seconds), so a short run can end before the
    last evaluation is read."""
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
