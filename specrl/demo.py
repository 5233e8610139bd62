"""``specrl demo``: the whole job on this machine, from the pair to a K table compared live.

1. Reuse (or build) the default pair.
2. Reuse the shipped profile where its fingerprint matches this machine and its grid reaches
   ``--max-batch``, else a profile cached by an earlier demo, else measure one
   (``--profile-reps`` rounds, every batch size of the grid up to ``--max-batch``). Then
   time a few cells now (``specrl profile --check``; not for a profile measured in this
   run): a profile whose cells are off by more than their measured noise is reported with
   the command that re-measures it; ``--measure`` re-measures at once. A new measurement
   takes acceptance from the shipped profile where the weights are the same, and times only
   the step costs.
3. Train PPO with a short budget, cached by profile and budget (a second demo reuses it; an
   interrupted one resumes from its last checkpoint).
4. Export the table (native, checked against the policy, then searched from it; each serving
   stack's best schedule: vLLM, TensorRT-LLM, SGLang).
5. Compare every policy in the surrogate on held-out seeds of four workloads, then off,
   the engineer and the table live, on two held-out traces, played side by side (each on
   an engine of its own, stepping in turn, so a drift in the machine's speed meets them
   alike).
6. Print the comparison and write every artifact under ``runs/demo-<time>/``: tables, JSON,
   CSV, PNG plots and the wandb (offline) run directories.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from specrl.compare import compare_policies, compare_surrogate
from specrl.errors import SpecrlError
from specrl.files import write_json
from specrl.report import (
    log_comparison,
    plot_buckets,
    plot_k_over_time,
    plot_table,
    plot_training,
)
from specrl.results import best_static
from specrl.seeds import HELD_OUT_SEED
from specrl.train.trained import TrainedRun

SURROGATE_WORKLOADS = ("ramp", "day", "bursts", "mixed")
DEMO_CONTEXTS = (16, 128, 256)
"""The prompt lengths a demo's own profile times: ``specrl profile``'s. The prefill costs are
read by padded tokens from the cells' admissions, and without the middle length the
mid-sized admissions of a steady batch of 64 are charged at the longest rows' cost
(docs/profile.md)."""
DEMO_WARM_START_EPISODES = 4
"""Episodes of each training workload the demo's warm start clones the oracle on: the demo's
budget (``specrl train`` clones on 16)."""
DEMO_EVAL_EPISODES = 1
"""Episodes of each evaluation workload the demo's training picks its model on: the demo's
budget (``specrl train`` evaluates on 4)."""
DEMO_NATIVE_EPISODES = 2
"""Tuning (and confirmation) episodes per workload of the demo's native table search: the
demo's budget (``specrl export`` searches on
:data:`~specrl.train.search.NATIVE_EPISODES`)."""


@dataclass
class DemoOptions:
    out: str = "runs"
    """Each demo writes ``OUT/demo-<UTC time>/``; the cache is ``OUT/demo-cache/``."""
    preset: str = "small"
    timesteps: int = 25_000
    surrogate_episodes: int = 4
    live_requests: int = 32
    """Requests in the live held-out trace (the mixed preset)."""
    live_episodes: int = 2
    """Live held-out traces (seeds from :data:`specrl.seeds.HELD_OUT_SEED`), the policies
    side by side on each (:func:`specrl.envs.rollout.run_interleaved`)."""
    max_batch: int = 32
    """Largest batch: of the profile's grid (when measured), training, the comparisons and
    the live trace's peak concurrency."""
    n_requests: int | None = None
    """Requests per surrogate trace (training and comparisons); None: each preset's own."""
    measure: bool = False
    """Measure a profile even if a matching one exists."""
    profile_reps: int = 2
    """Rounds of a profile the demo measures (``specrl profile --reps``, 5 by default)."""
    wandb: str = "offline"
    threads: int | None = None
    """torch threads; None: the profile's (step times hold at the count they were measured
    with)."""
    device: str = "cpu"
    progress: bool = True


@dataclass
class DemoResult:
    run_dir: Path
    profile_path: Path
    profile_fresh: bool | None
    """None: the profile was measured in this run, and not checked."""
    train_dir: Path
    artifacts: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _say(text: str) -> None:
    print(text, flush=True)


def _step(n: int, text: str) -> None:
    _say(f"\n[{n}/6] {text}")


def demo_batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes a demo's own profile times: ``specrl profile``'s grid below
    ``max_batch``, then ``max_batch`` itself, so that the grid reaches every batch served."""
    from specrl.profile.measure import BATCH_SIZES

    return [b for b in BATCH_SIZES if b < max_batch] + [max_batch]


def cached_profile_path(fingerprint: dict, cache: Path) -> Path:
    """Where a demo keeps the profile it measured for the device and pair of ``fingerprint``
    (:func:`~specrl.profile.fingerprint.pair_fingerprint`) in its cache folder."""
    hard = {k: fingerprint.get(k) for k in ("device", "target_sha256", "draft_sha256")}
    return cache / f"profile-{hashlib.sha256(json.dumps(hard).encode()).hexdigest()[:12]}.json"


def _choose_profile(pair, options: DemoOptions, cache: Path):
    """(profile, path, how): the shipped profile if its fingerprint matches, else a cached
    one that does, else a new measurement."""
    from specrl.envs import default_profile_path
    from specrl.profile import load_profile
    from specrl.profile.fingerprint import check_compatible, pair_fingerprint, profile_threads

    fp = pair_fingerprint(pair, k_max=4, device=options.device)
    cached = cached_profile_path(fp, cache)
    candidates = [] if options.measure else [default_profile_path(), cached]
    for path in candidates:
        if not Path(path).is_file():
            continue
        try:
            profile = load_profile(path)  # an unreadable cached one is measured again
            _check_grid(profile, options.max_batch)
            # The demo runs at the profile's thread count unless --threads says otherwise
            # (`use_profile_threads` below), so compare at that count, not torch's default.
            here = {**fp, "threads": profile_threads(profile, options.threads)}
            check_compatible(profile, here, source=str(path))
        except SpecrlError as err:
            _say(f"  {path}: {err}")
            continue
        return profile, Path(path), "reused"
    import torch

    from specrl.profile.measure import measure_profile

    torch.set_num_threads(options.threads or 1)
    source = _acceptance_source(fp)
    _say(
        f"  measuring a profile of this machine (the grid up to batch {options.max_batch}, "
        f"{options.profile_reps} rounds, one torch thread; `specrl profile --out P.json` "
        "takes 5 rounds)"
        + (f"; acceptance from {default_profile_path()}, the same weights" if source else "")
    )
    profile = measure_profile(
        pair,
        k_max=4,
        batch_sizes=demo_batch_sizes(options.max_batch),
        contexts=list(DEMO_CONTEXTS),
        reps=options.profile_reps,
        device=options.device,
        preset=options.preset,
        acceptance_from=source,
        acceptance_source=str(default_profile_path()),
        progress=options.progress,
    )
    cache.mkdir(parents=True, exist_ok=True)
    profile.save(cached)
    return profile, cached, "measured"


def _check_grid(profile, max_batch: int) -> None:
    """Refuse a profile whose batch sizes stop below ``max_batch``: the surrogate would serve
    the larger batches at the grid's edge."""
    largest = max(profile.batch_sizes)
    if largest < max_batch:
        raise SpecrlError(
            f"its grid stops at batch {largest}, below the demo's --max-batch {max_batch}"
        )


def _check_profile(
    profile, path: Path, pair, options: DemoOptions, *, measured_now: bool
) -> bool | None:
    """Whether ``profile`` holds here now (:func:`~specrl.profile.freshness.check_freshness`),
    said as it is found; None for a profile measured in this run, which is not checked: the
    check asks whether the machine changed since the profile was measured."""
    from specrl.profile.freshness import check_freshness, remeasure_command

    if measured_now:
        _say("  measured in this run: not checked (the check asks what changed since)")
        return None
    report = check_freshness(profile, pair, device=options.device)
    _say(f"  timed now in {report.seconds:.1f} s:\n" + _indent(report.format()))
    if report.fresh:
        _say("  fresh: every cell within its tolerance")
    else:
        _say(
            "  WARNING: "
            + report.message(str(path), remeasure_command(pair))
            + " (or run `specrl demo --measure`). The surrogate figures below are this "
            "profile's; the live ones are this machine's now."
        )
    return report.fresh


def _acceptance_source(fingerprint: dict):
    """The shipped profile where its acceptance stands for this pair's (the same weights,
    measured as the demo would: :func:`~specrl.profile.measure.check_acceptance_source`),
    else None: a new machine then measures only step times, what differs between machines."""
    from specrl.envs import default_profile_path
    from specrl.profile import load_profile
    from specrl.profile.acceptance import ACCEPTANCE_ROWS
    from specrl.profile.measure import check_acceptance_source

    try:
        shipped = load_profile(default_profile_path())
        check_acceptance_source(
            shipped,
            fingerprint,
            k_max=4,
            prompts=None,
            acceptance_rows=ACCEPTANCE_ROWS,
            acceptance_tokens=None,
        )
    except SpecrlError:
        return None
    return shipped


def _train(profile_path: Path, options: DemoOptions, cache: Path):
    from specrl.train import TrainConfig
    from specrl.train.reuse import train_or_resume

    digest = hashlib.sha256(profile_path.read_bytes()).hexdigest()[:12]
    run_dir = cache / f"ppo-{digest}-{options.timesteps}-b{options.max_batch}"
    config = TrainConfig(
        out=str(run_dir),
        total_timesteps=options.timesteps,
        profile=str(profile_path.resolve()),
        max_batch=options.max_batch,
        n_requests=options.n_requests,
        wandb=options.wandb,
        # Five checkpoints over the budget: a demo stopped in training goes on from the last.
        checkpoint_every=max(1, options.timesteps // 5),
        warm_start_episodes=DEMO_WARM_START_EPISODES,
        eval_episodes=DEMO_EVAL_EPISODES,
    )
    # The demo owns its cache: a run there from another version's defaults is trained again.
    how = train_or_resume(config, on_change="restart", say=_say, progress=options.progress)
    return run_dir, how


def run_demo(options: DemoOptions) -> DemoResult:
    """The pipeline of the module docstring; returns where everything went."""
    from specrl.models import load_default_pair
    from specrl.models.build import build_pair
    from specrl.policies.engineer import shared_episodes
    from specrl.policies.episode_pool import parallel_episodes
    from specrl.profile import use_profile_threads

    run_dir = _new_run_dir(Path(options.out))
    cache = Path(options.out) / "demo-cache"
    laps = _Laps()
    artifacts: dict[str, str] = {}

    _step(1, "the default pair")
    paths = build_pair(options.preset, progress=options.progress)
    pair = load_default_pair(options.preset, device=options.device)
    _say(f"  target {paths.target_path}\n  draft  {paths.draft_path}")
    laps.lap("pair")

    _step(2, "the hardware profile")
    profile, profile_path, how = _choose_profile(pair, options, cache)
    _say(f"  {how} {profile_path} (measured {profile.meta.get('created', '?')})")
    # Step times hold at the thread count they were measured with (the profile's).
    _say(f"  torch threads: {use_profile_threads(profile, options.threads)}")
    fresh = _check_profile(profile, profile_path, pair, options, measured_now=how == "measured")
    laps.lap("profile")

    _step(3, f"PPO, {options.timesteps:,} steps on the surrogate")
    train_dir, trained = _train(profile_path, options, cache)
    artifacts["training run"] = str(train_dir)
    laps.lap("train")

    # The export's search and the comparison both tune the engineer on the same seeds, and
    # play their surrogate episodes on every core.
    with shared_episodes(), parallel_episodes():
        _step(4, "export the K table, and each serving stack's best schedule")
        exported = _export(train_dir, run_dir, options, artifacts)
        laps.lap("export")

        _step(5, "compare: every policy in the surrogate; off, the engineer and the table live")
        reports = _compare(pair, profile, exported, options)
        laps.lap("compare")

    _step(6, "report")
    groups = _report(reports, exported, run_dir, train_dir, profile_path, options, artifacts)
    laps.lap("report")
    result = DemoResult(run_dir, profile_path, fresh, train_dir, artifacts, laps.seconds)
    summary = {
        "options": asdict(options),
        "profile": str(profile_path),
        "profile_how": how,
        "profile_fresh": fresh,
        "training": trained,
        "fidelity": exported.fidelity.to_json(),
        "seconds": laps.seconds,
        "artifacts": artifacts,
        "wandb_groups": [g.group for g in groups],
    }
    write_json(run_dir / "demo.json", summary, default=str)
    _print_summary(reports, run_dir, artifacts, laps.seconds, options)
    return result


def _new_run_dir(root: Path) -> Path:
    """A new ``ROOT/demo-<UTC time>/`` (suffixed where two demos start in the same second)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_dir = root / f"demo-{stamp}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(2, 100):
            try:
                run_dir.mkdir()
                return run_dir
            except FileExistsError:
                run_dir = root / f"demo-{stamp}-{n}"
    except OSError as err:
        raise SpecrlError(f"--out {root}: cannot write there ({err}); give another") from None
    return run_dir


class _Laps:
    """Seconds spent in each stage, in order."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._clock = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._clock, 1)
        self._clock = now


@dataclass
class _Exported:
    """Step 4's output: the native table as a server reads it, and the searched schedules."""

    table: object
    fidelity: object
    native: Path
    schedules: list[str]


def _export(train_dir: Path, run_dir: Path, options: DemoOptions, artifacts: dict) -> _Exported:
    """The run's native table, checked against its policy, and each stack's searched schedule,
    written under ``run_dir``."""
    from specrl.train.exports import write_exports

    written = write_exports(
        TrainedRun.load(train_dir),
        run_dir,
        search=True,
        progress=options.progress,
        native_episodes=DEMO_NATIVE_EPISODES,
    )
    if not written.fidelity.passed:
        _say("  WARNING: the table misses the fidelity goals; it is compared as it is")
    _say(_indent(written.fidelity.format()))
    if written.native_search is not None:
        _say(_indent(written.native_search.describe()))
    artifacts["K table (native)"] = str(written.native)
    schedules = []
    for stack in written.stacks:
        if stack.error is not None:
            _say(f"  {stack.fmt}: not written: {stack.error}")
            continue
        schedules.append(f"schedule:{stack.path}")
        artifacts[f"K schedule ({stack.fmt}, searched)"] = str(stack.path)
        _say(_indent(stack.searched.describe()))
        _say(f"  {stack.fmt}: {json.dumps(stack.config['speculative_config'])}")
    return _Exported(written.table, written.fidelity, written.native, schedules)


def _compare(pair, profile, exported: _Exported, options: DemoOptions) -> list:
    """Every policy in the surrogate on the held-out seeds of each workload, then off, the
    engineer and the table live: the reports, the live one last. The other baselines run in
    the surrogate only: live, each would cost two more traces of the demo's time."""
    from specrl.envs import LiveSpecEnv
    from specrl.envs.rollout import LIVE_WARMUP_STEPS
    from specrl.policies import default_policies, make_policy
    from specrl.policies.registry import trained_estimate

    lookup = f"lookup:{exported.native}"
    reports = compare_surrogate(
        profile,
        SURROGATE_WORKLOADS,
        [*default_policies(4), lookup, *exported.schedules],
        episodes=options.surrogate_episodes,
        seed=HELD_OUT_SEED,
        max_batch=options.max_batch,
        n_requests=options.n_requests,
        progress=options.progress,
    )
    mixed = reports[-1]
    live_env = LiveSpecEnv(
        pair=pair,
        device=options.device,
        workload="mixed",
        workload_kwargs={"n_requests": options.live_requests, "peak": options.max_batch},
        max_batch=options.max_batch,
        profile=profile,
        check_profile=False,  # checked above, once
        acceptance_estimate=trained_estimate([lookup]),  # the observation the table reads
    )
    engineer = mixed.engineer.policy if mixed.engineer else _best_static_spec(mixed)
    specs = list(dict.fromkeys(["off", engineer, lookup]))
    live = compare_policies(
        live_env,
        [make_policy(s, env=live_env, profile=profile) for s in specs],
        seed=HELD_OUT_SEED,
        episodes=options.live_episodes,
        env_name="live",
        workload="mixed",
        progress=options.progress,
        warmup_steps=LIVE_WARMUP_STEPS,
        speed_profile=profile,
        interleave=True,
    )
    return [*reports, live]


def _best_static_spec(report) -> str:
    """The policy spec of ``report``'s best static K (``off`` or ``fixed:K``)."""
    best = best_static(report.results)
    return "off" if best.policy == "off" else f"fixed:{best.policy.removeprefix('K=')}"


def _report(reports, exported, run_dir, train_dir, profile_path, options, artifacts) -> list:
    """Each comparison as JSON and CSV, the plots, and the wandb runs: the wandb groups."""

    mixed, live = reports[-2], reports[-1]
    for r in reports:
        name = f"{r.env}-{r.workload}"
        write_json(run_dir / f"compare-{name}.json", r.to_json())
        r.write_csv(run_dir / f"compare-{name}.csv")
    artifacts["comparisons (JSON, CSV)"] = str(run_dir / "compare-*.{json,csv}")
    plots = {
        "buckets-live": plot_buckets(live, run_dir / "buckets-live.png"),
        "buckets-surrogate-mixed": plot_buckets(mixed, run_dir / "buckets-surrogate-mixed.png"),
        "table": plot_table(exported.table, run_dir / "table.png"),
        "training": plot_training(train_dir, run_dir / "training.png"),
    }
    ramp = reports[0].result(live.results[-1].policy) or reports[0].results[-1]
    plots["k-over-time-ramp"] = plot_k_over_time(
        ramp.episodes[0], run_dir / "k-over-time-ramp.png", title="the K table on ramp (surrogate)"
    )
    artifacts["plots (PNG)"] = ", ".join(str(p) for p in plots.values())
    groups = log_comparison(
        reports,
        group=run_dir.name,
        out_dir=run_dir,
        mode=options.wandb,
        plots=plots,
        config={"profile": str(profile_path), "training_run": str(train_dir)},
    )
    if options.wandb != "disabled":
        artifacts["wandb runs"] = str(run_dir / "wandb")
    return groups


def _print_summary(reports, run_dir: Path, artifacts: dict, seconds: dict, options) -> None:
    mixed, live = reports[-2], reports[-1]
    _say(f"\nsurrogate, workload mixed, {options.surrogate_episodes} held-out episodes:")
    _say(mixed.format())
    traces = (
        "one held-out mixed trace"
        if options.live_episodes == 1
        else f"{options.live_episodes} held-out mixed traces"
    )
    _say(
        f"\nlive on this machine, {traces} of {options.live_requests} requests, the policies "
        "side by side:"
    )
    _say(live.format())
    _say(f"\nwrote {run_dir}/:")
    for what, where in artifacts.items():
        _say(f"  {what}: {where}")
    total = sum(seconds.values())
    _say("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()) + f"; {total:.0f} s")


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
