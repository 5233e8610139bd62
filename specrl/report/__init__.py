"""Reporting comparisons and training runs: wandb dashboards and PNG plots.

* :func:`log_comparison` (:mod:`specrl.report.dashboard`): a comparison as wandb runs, one
  per policy, plus a summary run with the table and the plots; :func:`log_run`: one run
  with a summary and tables (a sweep's trial, its summary).
* :mod:`specrl.report.plots`: tokens/s per batch bucket, a K table heatmap, K and batch over
  an episode, and a PPO training curve, each as a PNG.

wandb and matplotlib are imported inside the functions that use them.
"""

from specrl.report.dashboard import (
    LoggedGroup,
    comparison_table,
    log_comparison,
    log_run,
    policy_metrics,
)
from specrl.report.plots import (
    load_evaluations,
    plot_buckets,
    plot_k_over_time,
    plot_table,
    plot_training,
)

__all__ = [
    "LoggedGroup",
    "comparison_table",
    "load_evaluations",
    "log_comparison",
    "log_run",
    "plot_buckets",
    "plot_k_over_time",
    "plot_table",
    "plot_training",
    "policy_metrics",
]
