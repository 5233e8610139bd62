"""A sweep's results: mean ± std over seeds per configuration, the failed trials, and the best
table per (profile, workload mix).

Written to the sweep's folder::

    summary.csv      one row per configuration (profile x mix x train settings): how many
                     seeds finished, then <metric>/mean and <metric>/std of every trial metric
    summary.json     the same, the failed trials with their errors, and the best tables
    best/<profile>-<mix>/   the trial with the highest mean ratio to the engineer over the
                     compare workloads: its table in every format written, and its metrics.json

A std over one seed is left empty (null in JSON): one run has no spread to show.
"""

from __future__ import annotations

import csv
import io
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from specrl.files import read_json, write_atomic, write_json
from specrl.report import log_run
from specrl.sweep.spec import Trial
from specrl.sweep.trial import ERROR_FILE, METRICS_FILE, RATIOS, trial_dir

SUMMARY_CSV = "summary.csv"
SUMMARY_JSON = "summary.json"
BEST_DIR = "best"
RANKED_BY = "ratio_engineer"
"""The best table of a (profile, mix) has the highest mean ratio to the engineer."""


@dataclass
class Configuration:
    """The trials of one profile, mix and train settings, one per seed."""

    profile: str
    mix: str
    settings: dict
    seeds: list[int]
    finished: list[int] = field(default_factory=list)
    """The seeds whose trial finished."""
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float | None] = field(default_factory=dict)

    @property
    def settings_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings.items())

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "mix": self.mix,
            "settings": self.settings,
            "seeds": self.seeds,
            "finished": self.finished,
            "mean": self.mean,
            "std": self.std,
        }


@dataclass
class Summary:
    configurations: list[Configuration]
    failed: dict[str, str]
    """Trial name -> its error."""
    best: dict[str, dict]
    """``<profile>-<mix>`` -> the best trial: ``trial``, ``ratio_engineer``, ``dir``."""
    metrics: list[str]
    """The metric names, in column order."""

    def to_json(self) -> dict:
        return {
            "configurations": [c.to_json() for c in self.configurations],
            "failed": [{"trial": t, "error": e} for t, e in self.failed.items()],
            "best": self.best,
            "ranked_by": RANKED_BY,
        }

    def columns(self) -> list[str]:
        stats = [f"{m}/{s}" for m in self.metrics for s in ("mean", "std")]
        return ["profile", "mix", "settings", "seeds", "finished", *stats]

    def rows(self) -> list[list]:
        """The CSV's rows (None where not measured: an empty CSV cell)."""
        rows = []
        for c in self.configurations:
            row = [c.profile, c.mix, c.settings_text, len(c.seeds), len(c.finished)]
            for m in self.metrics:
                row += [c.mean.get(m), c.std.get(m)]
            rows.append(row)
        return rows

    def format(self) -> str:
        """A Markdown table of the table's mean ratios ± std over seeds, then the failed
        trials and the best table of each (profile, mix)."""
        ratios = [f"/ {r.replace('_', ' ')}" for r in RATIOS]
        head = ["profile", "mix", "settings", "seeds", *ratios]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in self.configurations:
            cells = [c.profile, c.mix, c.settings_text or "-", f"{len(c.finished)}/{len(c.seeds)}"]
            for ratio in RATIOS:
                key = f"ratio_{ratio}"
                if key not in c.mean:
                    cells.append("-")
                    continue
                std = c.std[key]
                cells.append(f"{c.mean[key]:.3f} ± " + ("-" if std is None else f"{std:.3f}"))
            lines.append("| " + " | ".join(cells) + " |")
        for name, error in self.failed.items():
            lines.append(f"FAILED {name}: {error}")
        for where, best in self.best.items():
            lines.append(
                f"best for {where}: {best['trial']} ({best[RANKED_BY]:.3f}x the engineer), "
                f"every format in {best['dir']}"
            )
        return "\n".join(lines)


def summarize(trials: list[Trial], out: str | Path, errors: dict[str, str] | None = None):
    """The :class:`Summary` of ``trials`` as their directories under ``out`` hold them: a
    trial with ``metrics.json`` finished; any other failed, with its ``error.json``'s error,
    else ``errors[name]`` (what Ray reported), else "did not finish"."""
    out = Path(out)
    records, failed = {}, {}
    for trial in trials:
        where = trial_dir(out, trial)
        if (where / METRICS_FILE).is_file():
            records[trial.name] = read_json(where / METRICS_FILE, "trial metrics", "run again")
        elif (where / ERROR_FILE).is_file():
            error = read_json(where / ERROR_FILE, "trial error", "run again")["error"]
            failed[trial.name] = error
        else:
            failed[trial.name] = (errors or {}).get(trial.name, "did not finish")
    metrics = list(dict.fromkeys(k for r in records.values() for k in r["metrics"]))
    groups: dict[str, list[Trial]] = {}
    for trial in trials:
        groups.setdefault(trial.configuration, []).append(trial)
    configurations = [_configuration(group, records, metrics) for group in groups.values()]
    best = {}
    for trial in trials:
        record = records.get(trial.name)
        key = f"{trial.profile_name}-{trial.mix_name}"
        if record and (key not in best or record["metrics"][RANKED_BY] > best[key][RANKED_BY]):
            best[key] = {
                "trial": trial.name,
                RANKED_BY: record["metrics"][RANKED_BY],
                "dir": str(out / BEST_DIR / key),
            }
    return Summary(configurations, failed, best, metrics)


def _configuration(group: list[Trial], records: dict, metrics: list[str]) -> Configuration:
    first = group[0]
    config = Configuration(
        first.profile_name, first.mix_name, first.settings, [t.seed for t in group]
    )
    done = [t for t in group if t.name in records]
    config.finished = [t.seed for t in done]
    for m in metrics:
        values = [records[t.name]["metrics"][m] for t in done if m in records[t.name]["metrics"]]
        if values:
            config.mean[m] = statistics.fmean(values)
            config.std[m] = statistics.stdev(values) if len(values) > 1 else None
    return config


def write_summary(summary: Summary, trials: list[Trial], out: str | Path) -> None:
    """``summary.csv``, ``summary.json`` and each best trial's files in ``best/``."""
    out = Path(out)
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(summary.columns())
    writer.writerows(summary.rows())
    write_atomic(out / SUMMARY_CSV, text.getvalue())
    write_json(out / SUMMARY_JSON, summary.to_json())
    by_name = {t.name: t for t in trials}
    for key, best in summary.best.items():
        source = trial_dir(out, by_name[best["trial"]])
        target = out / BEST_DIR / key
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        record = read_json(source / METRICS_FILE, "trial metrics", "run again")
        files = [e["file"] for e in record["exports"].values() if "file" in e]
        for name in [*files, METRICS_FILE]:
            shutil.copy2(source / name, target / name)


def log_summary(summary: Summary, *, group: str, out: str | Path, mode: str) -> Path | None:
    """The summary as a ``wandb.Table`` (``summary``) in a run of the sweep's group, beside
    the trials' runs; its run directory (None with ``mode="disabled"``)."""
    return log_run(
        group=group,
        name="summary",
        job_type="summary",
        out_dir=out,
        mode=mode,
        config={"failed": list(summary.failed)},
        summary={"trials_failed": len(summary.failed)},
        tables={"summary": (summary.columns(), summary.rows())},
    )
