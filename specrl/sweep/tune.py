"""A sweep on Ray Tune: :func:`run_sweep`.

Each trial of the spec's grid (:mod:`specrl.sweep.spec`) is one Tune trial of a grid search,
run by :func:`specrl.sweep.trial.run_trial` with ``cpus_per_trial`` CPUs (and as many torch
threads); Tune schedules them on this machine (Ray started embedded, dashboard off) or on the
cluster at ``address``. The sweep's folder::

    spec.json        the spec as validated: a resume must give the same one
    options.json     --max-concurrent and --cpus-per-trial: a resume keeps them
    profiles/        the profiles the spec's ``fleet`` measured (specrl.sweep.fleet)
    ray/sweep/       Tune's experiment (its state, what each trial reported)
    trials/<trial>/  each trial's run, tables, comparisons and metrics (specrl.sweep.trial)
    summary.csv, summary.json, best/   the summary (specrl.sweep.summary)

A spec with ``fleet`` jobs has them measured first, in the same Ray session, each on a node
of its accelerator (:func:`~specrl.sweep.fleet.profile_fleet`); the trials on those profiles
start once all are written.

Nothing is lost on a crash: ``resume=True`` restores Tune's experiment (finished trials stay
finished, the others run again) and a trial started again goes on from its own files: a
finished trial is not retrained, a run stopped mid-way continues from its last PPO
checkpoint; a fleet profile already written is not measured again. Ray's own temporary
files stay in the system's temp folder (Ray's default).

On a cluster of several machines, ``out`` and the profiles must be on a filesystem every
node sees (NFS): each trial writes its folder where it runs, and Tune asks the same of its
storage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from specrl.errors import SpecrlError
from specrl.files import read_json, write_json
from specrl.profile import load_profile
from specrl.sweep.cluster import check_address, import_ray, last_line, start_ray
from specrl.sweep.fleet import profile_fleet
from specrl.sweep.spec import PROFILES_DIR, SweepSpec, Trial
from specrl.sweep.summary import RANKED_BY, Summary, log_summary, summarize, write_summary
from specrl.sweep.trial import run_trial

RAY_DIR = "ray"
EXPERIMENT = "sweep"
SPEC_FILE = "spec.json"
OPTIONS_FILE = "options.json"


@dataclass
class SweepResult:
    out: Path
    summary: Summary
    seconds: dict[str, float] = field(default_factory=dict)
    """``ray_start`` (Ray imported, up and connected), ``trials`` (Tune's run), ``total``."""

    @property
    def failed(self) -> dict[str, str]:
        """Trial name -> its error."""
        return self.summary.failed

    @property
    def exit_code(self) -> int:
        """1 if a trial failed, else 0."""
        return 1 if self.failed else 0


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    cpus_per_trial: int | None = None,
    resume: bool = False,
) -> SweepResult:
    """Run every trial of ``spec`` on Ray Tune, then write and print the summary (see the
    module).

    :param out: the sweep's folder.
    :param address: a Ray cluster's head (``HOST:PORT``, ``ray://HOST:PORT`` or ``auto``);
        None: Ray on this machine, started here (or the session this process already has).
    :param max_concurrent: trials running at once at most (None: as many as the CPUs allow;
        on ``resume``, what the sweep was started with).
    :param cpus_per_trial: CPUs Tune reserves for each trial, and its torch threads (None: 1;
        on ``resume``, what the sweep was started with).
    :param resume: finish the sweep already in ``out`` (the same spec and options).
    """
    start = time.perf_counter()
    _check_counts(max_concurrent, cpus_per_trial)
    out = Path(out).resolve()
    trials = spec.trials(out)
    _check_out(out, spec, resume)
    options = _options(out, max_concurrent, cpus_per_trial, resume)
    if address is not None:
        check_address(address)
    clock = time.perf_counter()
    ray = import_ray()
    started = start_ray(ray, address)
    seconds = {"ray_start": round(time.perf_counter() - clock, 1)}
    clock = time.perf_counter()
    try:
        write_json(out / SPEC_FILE, spec.to_json())
        write_json(out / OPTIONS_FILE, options)
        _measure_fleet(spec, out)
        tuner = _tuner(trials, out, options["max_concurrent"], options["cpus_per_trial"], resume)
        grid = tuner.fit()
    finally:
        if started:
            ray.shutdown()
    seconds["trials"] = round(time.perf_counter() - clock, 1)
    ray_errors = {
        r.config["trial"]["name"]: last_line(r.error) for r in grid if r.error is not None
    }
    summary = summarize(trials, out, ray_errors)
    write_summary(summary, trials, out)
    if spec.wandb != "disabled":
        log_summary(summary, group=spec.name, out=out, mode=spec.wandb)
    seconds["total"] = round(time.perf_counter() - start, 1)
    print(
        f"\nsweep {spec.name}: {len(trials)} trials, {len(summary.failed)} failed; Ray up in "
        f"{seconds['ray_start']:.1f} s, the trials took {seconds['trials']:.1f} s"
    )
    print(summary.format())
    print(f"wrote {out}/summary.csv, summary.json, best/, trials/")
    return SweepResult(out, summary, seconds)


def _check_counts(max_concurrent: int | None, cpus_per_trial: int) -> None:
    for name, value in (("--max-concurrent", max_concurrent), ("--cpus-per-trial", cpus_per_trial)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise SpecrlError(f"{name} must be an integer >= 1, got {value!r}")


def _check_out(out: Path, spec: SweepSpec, resume: bool) -> None:
    """``out`` holds no sweep, or (``resume``) a sweep of this very spec."""
    saved = out / SPEC_FILE
    if not saved.is_file():
        if out.exists() and not out.is_dir():
            raise SpecrlError(f"--out {out} is a file; a sweep needs a folder, give another")
        return
    if not resume:
        raise SpecrlError(
            f"{out} holds a sweep already ({SPEC_FILE}); finish it with --resume, or give "
            "another --out"
        )
    if read_json(saved, "sweep spec", f"delete {out} to start again") != spec.to_json():
        raise SpecrlError(
            f"{out} holds a sweep of another spec (its {SPEC_FILE}); resume with the spec it "
            "was started with, or give another --out"
        )


def _options(out: Path, max_concurrent, cpus_per_trial, resume: bool) -> dict:
    """The sweep's ``max_concurrent`` and ``cpus_per_trial``: as given, else (``resume``) as
    the sweep in ``out`` was started with. A resume may not change them: Tune restores its
    own limit on concurrent trials, and a trial's torch threads are part of its run."""
    given = {"max_concurrent": max_concurrent, "cpus_per_trial": cpus_per_trial}
    saved_file = out / OPTIONS_FILE
    if not (resume and saved_file.is_file()):
        return {**given, "cpus_per_trial": cpus_per_trial or 1}
    saved = read_json(saved_file, "sweep options", f"delete {out} to start again")
    for key, value in given.items():
        if value is not None and value != saved.get(key):
            flag = "--" + key.replace("_", "-")
            was = "not given" if saved.get(key) is None else saved[key]
            raise SpecrlError(
                f"{flag} {value}: the sweep in {out} was started with {flag} {was}, and a "
                f"resumed sweep keeps it (Tune restores its trials as they were started); "
                f"drop {flag}, or start a new sweep in another --out"
            )
    return saved


def _measure_fleet(spec: SweepSpec, out: Path) -> None:
    """Measure the spec's ``fleet`` profiles that ``out`` does not hold yet (one written by
    a sweep stopped earlier is kept), on the Ray session this process has."""
    missing = []
    for job, path in zip(spec.fleet_jobs(), spec.fleet_profiles(out), strict=True):
        if Path(path).is_file():
            try:
                load_profile(path)
                print(f"fleet: {job.label}: measured already, {path}")
                continue
            except SpecrlError:
                pass  # cut short: measure it again
        missing.append(job)
    if not missing:
        return
    print(f"fleet: measuring {len(missing)} profile(s) before the trials", flush=True)
    try:
        for got in profile_fleet(missing, out / PROFILES_DIR):
            print(f"fleet: {got.pair} on {got.accelerator}: {got.path} (by {got.hostname})")
    except SpecrlError as err:
        raise SpecrlError(
            f"{err}. No trial ran; fix the job and finish with --resume (profiles written are kept)"
        ) from None


def _tuner(trials: list[Trial], out: Path, max_concurrent, cpus_per_trial: int, resume: bool):
    """Tune's grid over ``trials``, or the experiment in ``out`` restored (``resume``)."""
    from ray import tune

    trainable = tune.with_resources(_trainable(str(out), cpus_per_trial), {"cpu": cpus_per_trial})
    path = out / RAY_DIR / EXPERIMENT
    if resume and tune.Tuner.can_restore(str(path)):
        return tune.Tuner.restore(str(path), trainable, resume_errored=True)
    return tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search([t.to_json() for t in trials])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=max_concurrent,
            trial_name_creator=_trial_name,
            trial_dirname_creator=_trial_name,
        ),
        run_config=tune.RunConfig(
            storage_path=str(out / RAY_DIR),
            name=EXPERIMENT,
            failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            verbose=0,
            callbacks=[_progress(len(trials))],
        ),
    )


def _trainable(out: str, threads: int):
    """The function Tune runs per trial: :func:`run_trial`, its metrics reported."""

    def specrl_trial(config: dict) -> None:
        import torch
        from ray import tune

        torch.set_num_threads(threads)
        record = run_trial(Trial.from_json(config["trial"]), out, threads=threads)
        tune.report(record["metrics"])

    return specrl_trial


def _trial_name(tune_trial) -> str:
    return tune_trial.config["trial"]["name"]


def _progress(total: int):
    """A Tune callback printing a line as each trial ends."""
    from ray import tune

    class Progress(tune.Callback):
        def __init__(self):
            self.ended = 0

        def _say(self, trial, text: str) -> None:
            self.ended += 1
            print(f"[{self.ended}/{total}] {_trial_name(trial)}: {text}", flush=True)

        def on_trial_complete(self, iteration, trials, trial, **info):
            ratio = (trial.last_result or {}).get(RANKED_BY)
            self._say(trial, "finished" + (f", {ratio:.3f}x the engineer" if ratio else ""))

        def on_trial_error(self, iteration, trials, trial, **info):
            self._say(trial, "FAILED (see the summary)")

    return Progress()
