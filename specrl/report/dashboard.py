"""wandb comparison dashboards: one run per policy, one summary run per comparison.

Layout (one :class:`~specrl.compare.ComparisonReport` is one experiment):

* **group**: one per report. With one report the group is ``group``; with several (the
  surrogate and the live env, or several workloads) each report gets
  ``<group>-<env>-<workload>``, so the same keys never mix across experiments and a bar chart
  of ``tokens_per_s`` grouped by run group compares the policies inside each experiment.
* **policy runs** (``job_type="policy"``, run name = policy name): every run of every group
  carries the keys of :func:`policy_metrics` in its summary; a figure that was not measured
  (a bucket no step of that policy reached, a reference policy that did not run, TPOT without
  a finished request) is NaN, which wandb stores as null and leaves out of charts. Their
  history holds one row per batch bucket reached (``by_bucket/batch``, the bucket's largest
  batch size, and ``by_bucket/tokens_per_s``): the data of a line plot of tokens/s per bucket.
  They leave out wandb's machine and git metadata, which the summary run records.
* **summary run** (``job_type="summary"``, run name ``summary``): a ``wandb.Table``
  ``comparison`` (one row per policy, a column per :func:`policy_metrics` key) and the PNG
  plots as ``plots/<name>`` images, the tokens/s per bucket plot of the report among them.

Every run's config holds the report's ``env``, ``workload``, ``seed`` and ``episodes``
and the ``config`` passed in; policy runs add ``policy``, the summary run ``policies``.

:func:`log_run` logs one run of its own, a summary and tables (a sweep's trial, and the
sweep's summary table).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from specrl.compare import ComparisonReport
from specrl.errors import SpecrlError
from specrl.features import bucket_bounds
from specrl.options import WANDB_MODES
from specrl.report.plots import plot_buckets
from specrl.results import PolicyResult

_NO_SYSTEM = {"x_disable_meta": True, "x_disable_machine_info": True, "disable_git": True}
"""wandb settings that leave a run's machine and git metadata out."""
REFERENCES = ("off", "best_static", "oracle")
"""The policies each run's tokens/s is divided by: ``ratio/<reference>``."""


def policy_metrics(report: ComparisonReport, result: PolicyResult) -> dict[str, float]:
    """The summary keys of ``result``'s run, in column order: ``tokens_per_s``,
    ``bucket/<label>/tokens_per_s`` for every label of :data:`~specrl.features.BUCKET_LABELS`
    (and past 128 rows, of every bucket a policy of ``report`` reached),
    ``k_share/<K>`` for K = 0..k_max, ``ratio/off``, ``ratio/best_static``, ``ratio/oracle``
    (tokens/s over the reference's), ``tpot_p50_s`` and ``tpot_p99_s``. Not measured: NaN."""
    references = {
        "off": report.result("off"),
        "best_static": report.best_static,
        "oracle": report.result("oracle"),
    }
    metrics = {"tokens_per_s": result.tokens_per_s}
    for label in report.bucket_labels():
        metrics[f"bucket/{label}/tokens_per_s"] = result.bucket_tokens_per_s.get(label, math.nan)
    for k, share in sorted(result.k_share.items(), key=lambda item: int(item[0])):
        metrics[f"k_share/{k}"] = share
    for name in REFERENCES:
        reference = references[name]
        rated = reference is not None and reference.tokens_per_s > 0
        metrics[f"ratio/{name}"] = (
            result.tokens_per_s / reference.tokens_per_s if rated else math.nan
        )
    metrics["tpot_p50_s"] = result.tpot_p50_s
    metrics["tpot_p99_s"] = result.tpot_p99_s
    return metrics


def comparison_table(report: ComparisonReport) -> tuple[list[str], list[list]]:
    """The columns (``policy``, then the :func:`policy_metrics` keys) and one row per policy
    of the summary run's ``comparison`` table."""
    rows = [[r.policy, *policy_metrics(report, r).values()] for r in report.results]
    columns = ["policy", *policy_metrics(report, report.results[0])] if report.results else []
    return columns, rows


@dataclass
class LoggedGroup:
    """Where one report's runs went. Run directories are what ``wandb sync`` takes
    (``OUT_DIR/wandb/offline-run-*`` offline); None with ``mode="disabled"``."""

    group: str
    policy_runs: dict[str, Path | None]
    """Policy name -> its run directory, in the report's order."""
    summary_run: Path | None


def log_comparison(
    reports: ComparisonReport | Sequence[ComparisonReport],
    *,
    group: str,
    out_dir: str | Path,
    project: str = "specrl",
    mode: str = "offline",
    plots: Mapping[str, str | Path] | None = None,
    config: Mapping | None = None,
) -> list[LoggedGroup]:
    """Log comparisons to wandb as the module docstring lays out; returns one
    :class:`LoggedGroup` per report, in order.

    :param reports: one report or several (one group each).
    :param group: the experiment's name: the run group (several reports: its prefix).
    :param out_dir: wandb writes under ``out_dir/wandb/``; the tokens/s per bucket plots go
        to ``out_dir/plots/``.
    :param project: the wandb project.
    :param mode: ``"offline"`` (sync later with ``wandb sync``), ``"online"`` or
        ``"disabled"`` (no files written).
    :param plots: more PNG plots for the summary run(s), name -> path, logged as
        ``plots/<name>`` to the summary run of every report.
    :param config: added to every run's config (training settings, the profile, ...).
    """
    if mode not in WANDB_MODES:
        raise SpecrlError(f"wandb mode {mode!r} is not one of {', '.join(WANDB_MODES)}")
    reports = [reports] if isinstance(reports, ComparisonReport) else list(reports)
    if not reports or any(not report.results for report in reports):
        raise SpecrlError("nothing to log: pass reports from compare_policies with >= 1 policy")
    plots = {name: Path(path) for name, path in (plots or {}).items()}
    missing = [str(path) for path in plots.values() if not path.is_file()]
    if missing:
        raise SpecrlError(f"plot file(s) not found: {', '.join(missing)}; write them first")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        _log_report(report, name, out_dir, project, mode, plots, dict(config or {}))
        for report, name in zip(reports, _group_names(group, reports))
    ]


def _group_names(group: str, reports: list[ComparisonReport]) -> list[str]:
    if len(reports) == 1:
        return [group]
    names = [
        "-".join(part for part in (group, r.env, _workload_name(r.workload)) if part)
        for r in reports
    ]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise SpecrlError(
            f"several reports would share the group(s) {', '.join(repeated)} (same env and "
            "workload); log them in separate calls with different group names"
        )
    return names


def _workload_name(workload: str) -> str:
    """A preset's name, or a trace file's stem."""
    return Path(workload).stem if workload.endswith(".json") else workload


def _log_report(
    report: ComparisonReport,
    group: str,
    out_dir: Path,
    project: str,
    mode: str,
    plots: dict[str, Path],
    config: dict,
) -> LoggedGroup:
    import wandb

    common = config | {
        "env": report.env,
        "workload": report.workload,
        "seed": report.seed,
        "episodes": report.episodes,
    }
    policy_runs = {}
    for result in report.results:
        run_config = common | {"policy": result.policy}
        with _init(
            project, group, result.policy, "policy", out_dir, mode, run_config, system=False
        ) as run:
            run.define_metric("by_bucket/batch", summary="none")
            run.define_metric("by_bucket/tokens_per_s", step_metric="by_bucket/batch")
            for label in report.bucket_labels():
                if label in result.bucket_tokens_per_s:
                    run.log(
                        {
                            "by_bucket/batch": bucket_bounds(label)[1],
                            "by_bucket/tokens_per_s": result.bucket_tokens_per_s[label],
                        }
                    )
            run.summary.update(policy_metrics(report, result))
            policy_runs[result.policy] = _run_dir(run, mode)
    if mode != "disabled":
        bucket_plot = out_dir / "plots" / f"{_file_name(group)}-buckets.png"
        plots = {"buckets": plot_buckets(report, bucket_plot)} | plots
    columns, rows = comparison_table(report)
    run_config = common | {"policies": [r.policy for r in report.results]}
    with _init(project, group, "summary", "summary", out_dir, mode, run_config) as run:
        run.log(
            {
                "comparison": wandb.Table(columns=columns, data=rows),
                **{f"plots/{name}": wandb.Image(str(path)) for name, path in plots.items()},
            }
        )
        summary_run = _run_dir(run, mode)
    return LoggedGroup(group=group, policy_runs=policy_runs, summary_run=summary_run)


def log_run(
    *,
    group: str,
    name: str,
    job_type: str,
    out_dir: str | Path,
    mode: str = "offline",
    project: str = "specrl",
    config: Mapping | None = None,
    summary: Mapping | None = None,
    tables: Mapping[str, tuple[list[str], list[list]]] | None = None,
) -> Path | None:
    """One wandb run in ``group``: ``summary`` in its summary and each of ``tables`` (name ->
    (columns, rows)) logged as a ``wandb.Table`` (a sweep's trial, or the sweep's summary).
    Writes under ``out_dir/wandb/``; returns the run directory (None with ``mode="disabled"``).
    """
    if mode not in WANDB_MODES:
        raise SpecrlError(f"wandb mode {mode!r} is not one of {', '.join(WANDB_MODES)}")
    import wandb

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _init(project, group, name, job_type, out_dir, mode, dict(config or {})) as run:
        if tables:
            run.log({key: wandb.Table(columns=c, data=r) for key, (c, r) in tables.items()})
        run.summary.update(dict(summary or {}))
        return _run_dir(run, mode)


def _init(project, group, name, job_type, out_dir: Path, mode: str, config: dict, system=True):
    """A new wandb run; ``reinit="create_new"`` leaves any run the caller has open alone.
    ``system=False``: without wandb's machine and git metadata, which a comparison records
    once, in its summary run; it halves the time a run takes to start."""
    import wandb

    return init_wandb(
        project=project,
        group=group,
        name=name,
        job_type=job_type,
        mode=mode,
        dir=os.fspath(out_dir),
        config=config,
        reinit="create_new",
        settings=wandb.Settings(
            console="off", x_disable_stats=True, silent=True, **({} if system else _NO_SYSTEM)
        ),
    )


def init_wandb(**kwargs):
    """``wandb.init(**kwargs)``; online mode without credentials is a SpecrlError saying how
    to log in or to stay offline, not wandb's UsageError."""
    import wandb

    try:
        return wandb.init(**kwargs)
    except wandb.errors.UsageError as err:
        raise SpecrlError(
            f"wandb {kwargs.get('mode', '')} run could not start ({err}); run `wandb login` (or "
            "set WANDB_API_KEY), or log offline (the default) and `wandb sync` later"
        ) from None


def _run_dir(run, mode: str) -> Path | None:
    return None if mode == "disabled" else Path(run.settings.sync_dir)


def _file_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
