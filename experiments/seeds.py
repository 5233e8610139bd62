"""Train PPO with several seeds, export each run's K table and compare every table with the
baselines on held-out seeds: the mean and standard deviation of every ratio. Each seed is a
trial of a sweep on Ray Tune (specrl.sweep.tune.run_sweep): Ray on this machine, or the
cluster at --address.

    python experiments/seeds.py --seeds 0,1,2
    python experiments/seeds.py --seeds 0,1,2 --max-concurrent 2
    python experiments/seeds.py --help

Writes the sweep's folder (``OUT/trials/<profile>-<mix>-s<seed>/``: the run, its table.json
and its comparisons; ``OUT/summary.{csv,json}``), ``OUT/seeds.json`` (every ratio, per seed
and workload, and their mean and std) and the wandb runs (offline by default: one run per
seed in the group ``exp_name``).

Run again with the same ``--out`` after an interruption: the sweep is resumed, a seed that
finished is reused, one that was stopped continues from its last checkpoint, and other
training arguments than the ones the sweep started with are refused.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from specrl.dataclass_cli import comma_list, one_of, script_main, value
from specrl.files import read_json, write_json
from specrl.options import (
    BATCH,
    N_REQUESTS_MAX,
    SEED,
    THREADS,
    WANDB_MODES,
    int_in,
    nonnegative_int,
    positive_int,
    workload_preset,
)
from specrl.train import TrainConfig

DEFAULT = TrainConfig()
RATIOS = ("best_static", "oracle", "goodput", "off", "min_bucket_off")
TABLE_POLICY = "lookup:table.json"
"""The exported table's name in each trial's comparisons."""


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
    """wandb mode: offline, online or disabled (one run per seed, in the group exp_name)."""
    address: str = ""
    """A Ray cluster's head node (HOST:PORT, ray://HOST:PORT or auto); empty: Ray on this
    machine."""
    max_concurrent: Annotated[int, value(positive_int)] = 1
    """Seeds training at once at most."""
    cpus_per_trial: Annotated[int, value(THREADS)] = 1
    """CPUs reserved per seed's trial, and its torch threads."""


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, run, argv, __doc__, "seeds")


def ratios(comparison: dict) -> dict[str, float]:
    """The table's tokens/s over each reference's in one comparison (its JSON), and its lowest
    per-bucket ratio to off."""
    results = {r["policy"]: r for r in comparison["results"]}
    mine, off = results[TABLE_POLICY], results["off"]
    out = {
        "best_static": mine["tokens_per_s"] / comparison["best_static"]["tokens_per_s"],
        "oracle": mine["tokens_per_s"] / results["oracle"]["tokens_per_s"],
        "goodput": mine["tokens_per_s"] / results["goodput"]["tokens_per_s"],
        "off": mine["tokens_per_s"] / off["tokens_per_s"],
    }
    mine_b, off_b = mine["bucket_tokens_per_s"], off["bucket_tokens_per_s"]
    out["min_bucket_off"] = min(mine_b[b] / off_b[b] for b in mine_b if b in off_b)
    return out


def sweep_spec(args: Args):
    """The sweep these arguments describe: one profile and training mix, a trial per seed."""
    from specrl.sweep.spec import spec_from_json

    train = {
        "total_timesteps": args.total_timesteps,
        "eval_workloads": list(args.eval_workloads),
        "max_batch": args.max_batch,
        "n_requests": args.n_requests or None,
        "n_envs": args.n_envs,
        "n_steps": args.n_steps,
        "batch_size": args.batch_size,
        "net_arch": list(args.net_arch),
        "eval_every": args.eval_every,
    }
    obj = {
        "name": args.exp_name,
        "workloads": [list(args.workloads)],
        "seeds": list(args.seeds),
        "train": train,
        "compare": {"workloads": list(args.eval_workloads), "episodes": args.episodes},
        "export": {"search": False},  # the native table is what is compared
        "wandb": args.wandb,
    }
    if args.profile:
        obj["profiles"] = [args.profile]
    return spec_from_json(obj, source="seeds.py arguments")


def run(args: Args) -> dict:
    from specrl.errors import SpecrlError
    from specrl.sweep.trial import METRICS_FILE, trial_dir
    from specrl.sweep.tune import run_sweep

    if len(set(args.seeds)) != len(args.seeds):
        raise SpecrlError(
            f"--seeds {','.join(map(str, args.seeds))} repeats a seed: a repeat is the same run "
            "again, and its spread would read 0; give distinct seeds"
        )
    spec = sweep_spec(args)
    out = Path(args.out or f"runs/{args.exp_name}__{int(time.time())}")
    trials = spec.trials()
    finished = {t.seed for t in trials if (trial_dir(out, t) / METRICS_FILE).is_file()}
    result = run_sweep(
        spec,
        out,
        address=args.address or None,
        max_concurrent=args.max_concurrent,
        cpus_per_trial=args.cpus_per_trial,
        resume=True,
    )
    if result.failed:
        raise SpecrlError(
            "seeds failed: "
            + "; ".join(f"{name}: {error}" for name, error in result.failed.items())
        )
    per_seed = {}
    for trial in trials:
        where = trial_dir(out, trial)
        record = read_json(where / METRICS_FILE, "trial metrics", f"delete {where}")
        training = "reused" if trial.seed in finished else record["training"]
        print(f"seed {trial.seed}: {where}: {training}")
        per_seed[trial.seed] = {
            w: ratios(read_json(where / f"compare-{w}.json", "comparison", f"delete {where}"))
            for w in args.eval_workloads
        }
    summary, lines = _summary(args, per_seed)
    write_json(out / "seeds.json", summary)
    print(
        f"\nthe exported table over {len(args.seeds)} seeds (mean ± std), "
        f"{args.episodes} held-out episodes per workload:"
    )
    print("\n".join(lines))
    print(f"wrote {out}/seeds.json")
    return summary


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
