"""Train PPO with several seeds, export each run's K table and compare every table with the
baselines on held-out seeds: the mean and standard deviation of every ratio.

    python experiments/seeds.py --seeds 0,1,2
    python experiments/seeds.py --help

Writes ``OUT/seed-<s>/`` (the run and its table.json), ``OUT/seeds.json`` (every ratio, per
seed and workload, and their mean and std) and the wandb runs (offline by default: one group
per seed and workload).

Run again with the same ``--out`` after an interruption: a seed whose run finished is reused,
one that was stopped continues from its last checkpoint (``specrl train --resume``), and a
run made with other training arguments is refused. A comparison already logged to wandb with
the same figures is not logged again (``OUT/seed-<s>/wandb-logged.json``).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from specrl.dataclass_cli import comma_list, one_of, script_main, value
from specrl.files import write_json
from specrl.options import (
    BATCH,
    N_REQUESTS_MAX,
    SEED,
    WANDB_MODES,
    int_in,
    nonnegative_int,
    positive_int,
    workload_preset,
)
from specrl.seeds import HELD_OUT_SEED
from specrl.train import TrainConfig

DEFAULT = TrainConfig()
RATIOS = ("best_static", "oracle", "goodput", "off", "min_bucket_off")
LOGGED_FILE = "wandb-logged.json"
"""Per seed: the group, mode and ratios of the comparison logged to wandb, and its runs. A
re-run whose comparison reads the same does not log a second copy into the group."""


@dataclass
class Args:
    exp_name: str = "seeds"
    """Name of the experiment: the wandb groups' prefix and the output directory's."""
    out: str = ""
    """Output directory; empty: runs/{exp_name}__{unix time}."""
    seeds: Annotated[tuple[int, ...], comma_list(SEED)] = (0, 1, 2)
    """Training seeds, one run each."""
    total_timesteps: Annotated[int, value(positive_int)] = DEFAULT.total_timesteps
    """Env steps per run."""
    workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = DEFAULT.workloads
    """Training workload presets."""
    eval_workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = (
        "ramp",
        "day",
        "bursts",
    )
    """Workloads of the comparison (and of training's own evaluation)."""
    episodes: Annotated[int, value(positive_int)] = 3
    """Comparison episodes per workload and policy."""
    compare_seed: Annotated[int, value(SEED)] = HELD_OUT_SEED
    """First seed of the comparison's traces (held out from training and its evaluation)."""
    profile: str = ""
    """Hardware profile JSON; empty: the one shipped with specrl."""
    max_batch: Annotated[int, value(BATCH)] = DEFAULT.max_batch
    """Largest batch, and the workloads' peak concurrency."""
    n_requests: Annotated[int, value(int_in(0, N_REQUESTS_MAX))] = 0
    """Requests per trace; 0: the preset's own."""
    n_envs: Annotated[int, value(positive_int)] = DEFAULT.n_envs
    """Training envs stepped together."""
    n_steps: Annotated[int, value(positive_int)] = DEFAULT.n_steps
    """Steps per env per rollout."""
    batch_size: Annotated[int, value(int_in(2))] = DEFAULT.batch_size
    """PPO minibatch size."""
    net_arch: Annotated[tuple[int, ...], comma_list(positive_int)] = DEFAULT.net_arch
    """Hidden layer widths."""
    eval_every: Annotated[int, value(nonnegative_int)] = DEFAULT.eval_every
    """Env steps between training's held-out evaluations (0: the final one only)."""
    wandb: Annotated[str, value(one_of(*WANDB_MODES))] = "offline"
    """wandb mode: offline, online or disabled."""


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, run, argv, __doc__, "seeds")


def ratios(report, table_name: str) -> dict[str, float]:
    """The table's tokens/s over each reference's in one comparison, and its lowest per-bucket
    ratio to off."""
    mine, off = report.result(table_name), report.result("off")
    out = {
        "best_static": mine.tokens_per_s / report.best_static.tokens_per_s,
        "oracle": mine.tokens_per_s / report.result("oracle").tokens_per_s,
        "goodput": mine.tokens_per_s / report.result("goodput").tokens_per_s,
        "off": mine.tokens_per_s / off.tokens_per_s,
    }
    shared = [b for b in mine.bucket_tokens_per_s if b in off.bucket_tokens_per_s]
    out["min_bucket_off"] = min(
        mine.bucket_tokens_per_s[b] / off.bucket_tokens_per_s[b] for b in shared
    )
    return out


def _logged(path: Path) -> dict | None:
    """The marker's fields but its run list, or None where there is none (or it is unreadable:
    the comparison is then logged again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {k: v for k, v in data.items() if k != "runs"} if isinstance(data, dict) else None


def train_or_continue(config: TrainConfig) -> str:
    """Train the run ``config`` describes: ``"trained"`` afresh, ``"resumed"`` from the last
    checkpoint of a run stopped in ``config.out`` (started again where it stopped before its
    first one), or ``"reused"`` when that run finished.
    A run there made with other arguments (besides ``wandb``) is refused."""
    from specrl.config import CHECKPOINT_DIR, CONFIG_FILE, MODEL_FILE, SUMMARY_FILE
    from specrl.errors import SpecrlError
    from specrl.train import load_config, train

    run_dir = Path(config.out)
    if not (run_dir / CONFIG_FILE).is_file():
        train(config)
        return "trained"
    changed = [n for n in config.changes_from(load_config(run_dir)) if n not in ("wandb", "out")]
    if changed:
        raise SpecrlError(
            f"{run_dir} holds a run with another {', '.join(changed)}; pass the arguments it was "
            "made with, or choose another --out"
        )
    if (run_dir / SUMMARY_FILE).is_file() and (run_dir / MODEL_FILE).is_file():
        return "reused"
    if not any((run_dir / CHECKPOINT_DIR).glob("step-*")):
        # Stopped before its first checkpoint: nothing to go on from, so start it again.
        shutil.rmtree(run_dir)
        train(config)
        return "started again (stopped before its first checkpoint)"
    train(config, resume=True)
    return "resumed"


def run(args: Args) -> dict:
    from specrl.errors import SpecrlError

    if len(set(args.seeds)) != len(args.seeds):
        raise SpecrlError(
            f"--seeds {','.join(map(str, args.seeds))} repeats a seed: a repeat is the same run "
            "again, and its spread would read 0; give distinct seeds"
        )
    out = Path(args.out or f"runs/{args.exp_name}__{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    per_seed = {seed: _run_seed(args, seed, out / f"seed-{seed}") for seed in args.seeds}
    summary, lines = _summary(args, per_seed)
    write_json(out / "seeds.json", summary)
    print(
        f"\nthe exported table over {len(args.seeds)} seeds (mean ± std), "
        f"{args.episodes} held-out episodes per workload:"
    )
    print("\n".join(lines))
    print(f"wrote {out}/seeds.json")
    return summary


def _run_seed(args: Args, seed: int, where: Path) -> dict[str, dict[str, float]]:
    """One seed's run in ``where``: trained (or taken up again), exported and compared on
    held-out seeds, the comparison logged unless it already is; the table's ratios per
    workload."""
    from specrl.compare import compare_surrogate
    from specrl.policies import default_policies
    from specrl.profile import load_profile
    from specrl.train.to_table import checked_table

    config = TrainConfig(
        out=str(where / "run"),
        seed=seed,
        total_timesteps=args.total_timesteps,
        workloads=args.workloads,
        eval_workloads=args.eval_workloads,
        profile=args.profile or None,
        max_batch=args.max_batch,
        n_requests=args.n_requests or None,
        n_envs=args.n_envs,
        n_steps=args.n_steps,
        batch_size=args.batch_size,
        net_arch=args.net_arch,
        eval_every=args.eval_every,
        wandb=args.wandb,
    )
    print(f"\nseed {seed}: {config.out}")
    print(f"seed {seed}: {train_or_continue(config)}")
    table, _ = checked_table(config.out, progress=False)  # as `specrl export` writes it
    table_path = where / "table.json"
    table.save(table_path)
    profile = load_profile(table.provenance["profile_path"])
    specs = [*default_policies(profile.k_max), f"lookup:{table_path}"]
    reports = compare_surrogate(
        profile,
        args.eval_workloads,
        specs,
        episodes=args.episodes,
        seed=args.compare_seed,
        k_max=config.k_max,
        max_batch=args.max_batch,
        n_requests=args.n_requests or None,
    )
    name = f"lookup:{table_path.name}"
    seed_ratios = {r.workload: ratios(r, name) for r in reports}
    _log_once(args, seed, where, reports, seed_ratios)
    return seed_ratios


def _log_once(args: Args, seed: int, where: Path, reports, seed_ratios: dict) -> None:
    """Log one seed's comparison to wandb, unless its marker in ``where`` says this very
    comparison is there already; a logged one leaves that marker."""
    from specrl.report import log_comparison

    group = f"{args.exp_name}-seed{seed}"
    logged = {"group": group, "mode": args.wandb, "ratios": seed_ratios}
    marker = where / LOGGED_FILE
    if args.wandb != "disabled" and _logged(marker) == logged:
        print(f"seed {seed}: this comparison is already in wandb group {group}; not logged")
        return
    groups = log_comparison(reports, group=group, out_dir=where, mode=args.wandb)
    if args.wandb != "disabled":
        runs = [str(p) for g in groups for p in [*g.policy_runs.values(), g.summary_run]]
        write_json(marker, {**logged, "runs": runs})


def _summary(
    args: Args, per_seed: dict[int, dict[str, dict[str, float]]]
) -> tuple[dict, list[str]]:
    """The ratios of every seed with their mean and spread per workload, and the markdown
    table of mean ± std."""
    summary = {"per_seed": per_seed, "mean": {}, "std": {}}
    lines = [
        "| workload | " + " | ".join(f"/ {r}" for r in RATIOS) + " |",
        "|---|" + "---|" * len(RATIOS),
    ]
    for workload in args.eval_workloads:
        cells = []
        for ratio in RATIOS:
            values = [per_seed[s][workload][ratio] for s in args.seeds]
            mean = statistics.fmean(values)
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            summary["mean"].setdefault(workload, {})[ratio] = mean
            summary["std"].setdefault(workload, {})[ratio] = std
            cells.append(f"{mean:.3f} ± {std:.3f}")
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return summary, lines


if __name__ == "__main__":
    sys.exit(main())
