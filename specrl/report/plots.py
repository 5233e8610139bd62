"""PNG plots of comparisons, K tables, episodes and training runs.

Each plot has two functions: ``*_figure`` builds a ``matplotlib.figure.Figure`` (for notebooks,
or to change before saving) and ``plot_*`` writes it as a PNG and returns the path. Figures
are made without pyplot, so no backend or global figure state is involved (matplotlib is
imported inside the functions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from specrl.compare import ComparisonReport
from specrl.config import CHECKPOINT_DIR, SUMMARY_FILE
from specrl.errors import SpecrlError
from specrl.files import read_json
from specrl.table import KTable

_DPI = 100


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=_DPI)
    return path


# ----------------------------------------------------------------------------- buckets


def buckets_figure(report: ComparisonReport):
    """Tokens/s per batch bucket, one line per policy; the buckets any policy reached, in
    order (a policy that never reached a bucket has no point there)."""
    from matplotlib.figure import Figure

    labels = report.reached_buckets()
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    for r in report.results:
        rates = [r.bucket_tokens_per_s.get(label, math.nan) for label in labels]
        ax.plot(range(len(labels)), rates, marker="o", label=r.policy)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("rows decoded per step (batch bucket)")
    ax.set_ylabel("tokens/s")
    ax.set_title(" ".join(p for p in (report.env, report.workload) if p) or "comparison")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def plot_buckets(report: ComparisonReport, path: str | Path) -> Path:
    """Write :func:`buckets_figure` to ``path`` (PNG); returns the path."""
    return _save(buckets_figure(report), path)


# ----------------------------------------------------------------------------- K table


def table_matrix(table: KTable, context: int = 0) -> list[list[int]]:
    """K by batch bucket (rows) in context bin ``context``: the stale K first, then K per
    acceptance bin; what :func:`table_figure` draws."""
    return [
        [table.stale(b, context), *table.cell(b, context)] for b in range(len(table.batch_buckets))
    ]


MAX_LABELLED_CELLS = 600
"""A table with more cells than this per panel is drawn without K written in each cell (an
exported table has 128 batch sizes by 100 acceptance bins); the colour bar reads K."""
MAX_TICKS = (12, 32)
"""At most this many acceptance (x) and batch (y) tick labels per panel."""


def _thin(n: int, most: int) -> list[int]:
    """Indices of at most ``most`` evenly spaced ticks out of ``n``, the first always in."""
    step = max(1, -(-n // most))
    return list(range(0, n, step))


def table_figure(table: KTable):
    """A heatmap of K by batch bucket (up) and acceptance bin (right); the first column is
    the K used while the acceptance estimate is stale. One panel per context bin. K is
    written in each cell when a panel has at most :data:`MAX_LABELLED_CELLS` cells; larger
    tables keep a readable size, with thinned tick labels (:data:`MAX_TICKS`)."""
    import matplotlib
    from matplotlib.figure import Figure

    rows = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in table.batch_buckets]
    edges = table.acceptance_edges
    columns = ["stale"] + [f"{lo:g}-{hi:g}" for lo, hi in zip(edges, edges[1:])]
    cmap = matplotlib.colormaps["viridis"].resampled(table.k_max + 1)
    labelled = len(columns) * len(rows) <= MAX_LABELLED_CELLS
    fig = Figure(
        figsize=(
            1.5 + min(0.7 * len(columns), 12.0) * table.n_context + 1,
            1.5 + min(0.35 * len(rows), 9.0),
        ),
        layout="constrained",
    )
    axes = fig.subplots(1, table.n_context, squeeze=False)[0]
    for context, ax in enumerate(axes):
        matrix = table_matrix(table, context)
        image = ax.imshow(
            matrix,
            origin="lower",
            aspect="auto",
            cmap=cmap,
            vmin=-0.5,
            vmax=table.k_max + 0.5,
        )
        if labelled:
            for b, row in enumerate(matrix):
                for j, k in enumerate(row):
                    color = "black" if k > table.k_max / 2 else "white"
                    ax.text(j, b, str(k), ha="center", va="center", color=color, fontsize="small")
        ax.axvline(0.5, color="white", linewidth=3)
        bins = _thin(len(columns) - 1, MAX_TICKS[0] - 1)
        if len(bins) < len(columns) - 1:  # thinned: the first bin's label would hit "stale"
            bins = bins[1:]
        xs = [0, *(1 + j for j in bins)]
        ax.set_xticks(xs, [columns[j] for j in xs], rotation=45, ha="right")
        ys = _thin(len(rows), MAX_TICKS[1])
        ax.set_yticks(ys, [rows[b] for b in ys])
        ax.set_xlabel("acceptance estimate")
        if context == 0:
            ax.set_ylabel("batch size")
        if table.context_bins is not None:
            lo, hi = table.context_bins[context]
            ax.set_title(f"context {lo}-{hi}" if hi is not None else f"context {lo}+")
    fig.colorbar(image, ax=list(axes), ticks=range(table.k_max + 1), label="K")
    fig.suptitle(f"K table (k_max={table.k_max})")
    return fig


def plot_table(table: KTable, path: str | Path) -> Path:
    """Write :func:`table_figure` to ``path`` (PNG); returns the path."""
    return _save(table_figure(table), path)


# ----------------------------------------------------------------------------- K over time


def k_over_time_figure(episode, *, title: str = ""):
    """K per step (left axis) and the rows it decoded (right axis) against the serving
    clock: step ``i`` spans from the sum of the step times before it to that sum plus its
    own. ``episode`` is a :class:`~specrl.envs.EpisodeResult` (or anything with
    ``step_seconds``, ``step_k`` and ``step_batch`` lists)."""
    import numpy as np
    from matplotlib.figure import Figure

    seconds, ks, batch = episode.step_seconds, episode.step_k, episode.step_batch
    if not len(seconds) == len(ks) == len(batch):
        raise SpecrlError(
            f"per-step lists differ in length (step_seconds {len(seconds)}, step_k {len(ks)}, "
            f"step_batch {len(batch)}); pass an episode from specrl.envs.rollout.run_episode"
        )
    edges = np.concatenate([[0.0], np.cumsum(seconds)])
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    ax = fig.add_subplot()
    ax.stairs(ks, edges, color="tab:blue", linewidth=1.5, label="K")
    ax.set_ylim(-0.2, max(ks, default=0) + 0.5)
    ax.set_ylabel("K (draft tokens)", color="tab:blue")
    ax.set_xlabel("serving time (s)")
    rows = ax.twinx()
    rows.stairs(batch, edges, color="tab:orange", alpha=0.7, label="batch")
    rows.set_ylim(0, max(batch, default=0) * 1.1 + 1)
    rows.set_ylabel("batch (rows decoded)", color="tab:orange")
    ax.set_title(title or "K and batch over time")
    return fig


def plot_k_over_time(episode, path: str | Path, *, title: str = "") -> Path:
    """Write :func:`k_over_time_figure` to ``path`` (PNG); returns the path."""
    return _save(k_over_time_figure(episode, title=title), path)


# ----------------------------------------------------------------------------- training


def load_evaluations(run_dir: str | Path) -> list[dict]:
    """The evaluation history of a ``specrl train`` run directory: ``summary.json``'s when
    the run finished, otherwise its newest checkpoint's (a run in progress)."""
    run_dir = Path(run_dir)
    checkpoints = sorted((run_dir / CHECKPOINT_DIR).glob("step-*"))
    if (run_dir / SUMMARY_FILE).is_file():
        path = run_dir / SUMMARY_FILE
    elif checkpoints:
        path = checkpoints[-1] / "state.json"
    else:
        raise SpecrlError(
            f"no evaluations in {run_dir}: neither {SUMMARY_FILE} nor a checkpoint; pass the "
            "directory of a `specrl train` run"
        )
    obj = read_json(path, "training run", "pass the directory of a `specrl train` run")
    history = obj.get("eval_history") if isinstance(obj, dict) else None
    if not isinstance(history, list):
        raise SpecrlError(f"{path}: field 'eval_history' missing or not a list")
    return history


def _evaluation_dicts(evaluations) -> list[dict]:
    if isinstance(evaluations, (str, Path)):
        evaluations = load_evaluations(evaluations)
    dicts = [e if isinstance(e, dict) else e.to_json() for e in evaluations]
    for i, e in enumerate(dicts):
        if not isinstance(e.get("timesteps"), int) or not isinstance(e.get("by_workload"), dict):
            raise SpecrlError(
                f"evaluation {i} lacks 'timesteps' or 'by_workload'; pass EvalResult objects, "
                "their to_json(), or a `specrl train` run directory"
            )
    if not dicts:
        raise SpecrlError("no evaluations to plot: the run has not evaluated yet (eval_every)")
    return dicts


def training_figure(evaluations: Sequence | str | Path):
    """PPO's held-out tokens/s against timesteps, one panel per evaluation workload, with
    the best static K's and the oracle's tokens/s on the same traces.

    :param evaluations: :class:`~specrl.train.EvalResult` objects, their ``to_json()``
        (``summary.json``'s ``eval_history``), or a ``specrl train`` run directory.
    """
    from matplotlib.figure import Figure

    history = _evaluation_dicts(evaluations)
    workloads = list(history[-1]["by_workload"])
    fig = Figure(figsize=(4.5 * len(workloads), 3.8), layout="constrained")
    axes = fig.subplots(1, len(workloads), squeeze=False)[0]
    for ax, name in zip(axes, workloads):
        points = [(e["timesteps"], e["by_workload"].get(name)) for e in history]
        points = [(t, w) for t, w in points if w is not None]
        steps = [t for t, _ in points]
        best_name = points[-1][1]["best_static"]
        ax.plot(steps, [w["tokens_per_s"] for _, w in points], marker="o", label="PPO")
        ax.plot(
            steps,
            [w["best_static_tokens_per_s"] for _, w in points],
            linestyle="--",
            label=f"best static ({best_name})",
        )
        ax.plot(steps, [w["oracle_tokens_per_s"] for _, w in points], linestyle=":", label="oracle")
        ax.set_title(name)
        ax.set_xlabel("timesteps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel("held-out tokens/s")
    return fig


def plot_training(evaluations: Sequence | str | Path, path: str | Path) -> Path:
    """Write :func:`training_figure` to ``path`` (PNG); returns the path."""
    return _save(training_figure(evaluations), path)
