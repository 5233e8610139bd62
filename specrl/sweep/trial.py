"""One trial of a sweep, start to end, with no Ray in it: :func:`run_trial`.

A trial's directory, ``OUT/trials/<trial>/``::

    run/                   the PPO run (specrl train's run directory, checkpoints included)
    table.json             the native K table, checked against the policy
    table-vllm.json        each stack's schedule (searched, or the table collapsed), where
    table-trtllm.json      its format can hold one (else the reason is in metrics.json)
    table-sglang.json
    compare-<workload>.json  every policy on the held-out seeds of each compare workload
    metrics.json           written last: the trial finished (see :func:`run_trial`)
    error.json             the error of the last attempt that raised
    wandb/                 the trial's wandb run (when the spec's wandb is not disabled)

Started again (a sweep resumed), a trial picks up where it stopped: a finished trial (its
``metrics.json``) is returned as it is, a finished run is exported again without training,
and a run stopped mid-way goes on from its last checkpoint.
"""

from __future__ import annotations

import statistics
import time
import traceback
from pathlib import Path

from specrl.compare import compare_surrogate
from specrl.config import CONFIG_FILE, load_config
from specrl.errors import SpecrlError
from specrl.files import read_json, write_json
from specrl.policies import default_policies
from specrl.profile import load_profile
from specrl.report import log_run
from specrl.seeds import HELD_OUT_SEED
from specrl.sweep.spec import Trial
from specrl.train.exports import NATIVE_FILE, write_exports
from specrl.train.reuse import train_or_resume
from specrl.train.search import STACK_FORMATS
from specrl.train.trained import TrainedRun

TRIALS_DIR = "trials"
METRICS_FILE = "metrics.json"
ERROR_FILE = "error.json"
RATIOS = ("engineer", "best_static", "off")
"""The table's tokens/s is divided by each: the engineer (the better of ``threshold:tuned``
and ``sweep``), the best static K, and speculation off."""


def trial_dir(out: str | Path, trial: Trial) -> Path:
    return Path(out) / TRIALS_DIR / trial.name


def run_trial(trial: Trial, out: str | Path, *, threads: int = 1) -> dict:
    """Train, export every format and compare ``trial`` under ``OUT/trials/<trial>/`` (see
    the module), with ``threads`` torch threads; returns what ``metrics.json`` holds:
    ``trial``, ``training`` (trained, resumed, reused), ``metrics`` (:func:`table_metrics`),
    ``exports`` (per format its file, or why it could not be written) and ``seconds``. A
    trial that raises leaves its error in ``error.json`` and raises it again."""
    where = trial_dir(out, trial)
    done = where / METRICS_FILE
    if done.is_file():
        record = read_json(done, "trial metrics", f"delete {where} to run the trial again")
        if record.get("trial") != trial.to_json():
            raise SpecrlError(
                f"{where} holds a trial of another spec; give the sweep another --out"
            )
        _check_trained_as_now(trial, where)
        return record
    (where / ERROR_FILE).unlink(missing_ok=True)
    try:
        return _run(trial, where, threads)
    except BaseException as err:
        write_json(
            where / ERROR_FILE,
            {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()},
        )
        raise


def _check_trained_as_now(trial: Trial, where: Path) -> None:
    """Refuse a finished trial whose run this specrl would train otherwise (a default changed
    since, such as the acceptance estimate): its figures would sit beside the new trials'
    in one mean. The torch threads and what a resume may change do not count; a trial whose
    run directory is gone keeps its record."""
    if not (where / "run" / CONFIG_FILE).is_file():
        return
    saved = load_config(where / "run")
    now = trial.config(saved.out, threads=saved.torch_threads)
    changed = now.unresumable_changes_from(saved)
    if changed:
        detail = ", ".join(
            f"{n}: {getattr(saved, n)!r} then, {getattr(now, n)!r} now" for n in changed
        )
        raise SpecrlError(
            f"{where} finished with training settings this specrl no longer uses ({detail}): "
            "specrl's defaults changed since; give the sweep another --out, or delete "
            f"{where} to run the trial again"
        )


def _run(trial: Trial, where: Path, threads: int) -> dict:
    config = trial.config(str(where / "run"), threads=threads)
    stamps = [time.perf_counter()]
    training = train_or_resume(
        config,
        hint="the spec, --cpus-per-trial or specrl's defaults changed since it started; "
        "resume with the ones it was started with, or give the sweep another --out",
    )
    stamps.append(time.perf_counter())
    exports, specs = export_all(config.out, where, search=trial.search)
    stamps.append(time.perf_counter())
    reports = compare_surrogate(
        load_profile(trial.profile),
        trial.compare_workloads,
        [*default_policies(config.k_max), *specs],
        episodes=trial.compare_episodes,
        seed=HELD_OUT_SEED,
        k_max=config.k_max,
        max_batch=config.max_batch,
        max_len=config.max_len,
        n_requests=config.n_requests,
        progress=False,
    )
    stamps.append(time.perf_counter())
    for report in reports:
        write_json(where / f"compare-{report.workload}.json", report.to_json())
    stacks = [fmt for fmt in STACK_FORMATS if "file" in exports[fmt]]
    record = {
        "trial": trial.to_json(),
        "training": training,
        "metrics": table_metrics(reports, len(specs), stacks),
        "exports": exports,
        "seconds": {
            step: round(end - start, 1)
            for step, start, end in zip(("train", "export", "compare"), stamps, stamps[1:])
        },
    }
    if trial.wandb != "disabled":
        wandb_run = log_run(
            group=trial.group,
            name=trial.name,
            job_type="trial",
            out_dir=where,
            mode=trial.wandb,
            config={**trial.to_json(), "training": training},
            summary=record["metrics"],
        )
        record["wandb_run"] = str(wandb_run)
    write_json(where / METRICS_FILE, record)  # last: the trial has finished
    return record


def export_all(run_dir: str | Path, where: Path, *, search: bool) -> tuple[dict, list[str]]:
    """The run's tables in ``where`` (:func:`specrl.train.exports.write_exports`): per format
    ``{"file": name}`` or ``{"error": why it was not written}``, and the policies
    (``lookup:``, ``schedule:``) that play what was written."""
    written = write_exports(TrainedRun.load(run_dir), where, search=search, progress=False)
    exports = {"native": {"file": NATIVE_FILE, "fidelity_passed": written.fidelity.passed}}
    specs = [f"lookup:{written.native}"]
    for stack in written.stacks:
        if stack.error is not None:
            exports[stack.fmt] = {"error": str(stack.error)}
            continue
        exports[stack.fmt] = {"file": stack.path.name}
        specs.append(f"schedule:{stack.path}")
    return exports, specs


def table_metrics(reports, n_exported: int, stacks: list[str]) -> dict[str, float]:
    """From one comparison per workload whose last ``n_exported`` policies are the native
    table and then the ``stacks`` schedules: over the workloads, the mean of each of the
    table's ratios (``ratio_<reference>``, :data:`RATIOS`) and of each stack schedule's ratio
    to the engineer (``<fmt>/ratio_engineer``); then per workload the table's
    ``<w>/tokens_per_s`` and ``<w>/ratio_<reference>``."""
    per_workload: dict[str, float] = {}
    ratios: dict[str, list[float]] = {f"ratio_{name}": [] for name in RATIOS}
    ratios |= {f"{fmt}/ratio_engineer": [] for fmt in stacks}
    for report in reports:
        exported = report.results[-n_exported:]
        table, schedules = exported[0], exported[1:]
        references = {
            "engineer": report.engineer,
            "best_static": report.best_static,
            "off": report.result("off"),
        }
        per_workload[f"{report.workload}/tokens_per_s"] = table.tokens_per_s
        for name in RATIOS:
            ratio = table.tokens_per_s / references[name].tokens_per_s
            per_workload[f"{report.workload}/ratio_{name}"] = ratio
            ratios[f"ratio_{name}"].append(ratio)
        for fmt, result in zip(stacks, schedules):
            ratio = result.tokens_per_s / references["engineer"].tokens_per_s
            ratios[f"{fmt}/ratio_engineer"].append(ratio)
    return {key: statistics.fmean(values) for key, values in ratios.items()} | per_workload
