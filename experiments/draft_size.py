"""The same pipeline for two drafts of one target: how the crossover batch and the learned K
table move when the draft's cost and acceptance change.

    python experiments/draft_size.py                      # small (1-layer draft) vs small-draft3
    python experiments/draft_size.py --presets micro,micro-draft3 --total-timesteps 2048
    python experiments/draft_size.py --help

For each preset: build the pair if needed (a draft variant distils its draft from the base
pair's target and is cached under $SPECRL_HOME, never shipped), measure a profile on this
machine (both the same way, one after the other), train PPO on it, export the table, and
compare it with the baselines in the surrogate on held-out seeds. Serving folklore says a
larger draft lowers the batch size above which speculation stops paying; the table printed
at the end shows whether it does here.
"""

from __future__ import annotations

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
    THREADS,
    WANDB_MODES,
    int_in,
    model_preset,
    positive_int,
    workload_preset,
)
from specrl.seeds import HELD_OUT_SEED
from specrl.train import TrainConfig

DEFAULT = TrainConfig()


@dataclass
class Args:
    exp_name: str = "draft_size"
    """Name of the experiment: the wandb groups' prefix and the output directory's."""
    out: str = ""
    """Output directory; empty: runs/{exp_name}__{unix time}."""
    presets: Annotated[tuple[str, ...], comma_list(model_preset)] = ("small", "small-draft3")
    """Pairs to run, each with its own profile, run and table."""
    batch_sizes: Annotated[tuple[int, ...], comma_list(BATCH)] = (1, 2, 4, 8, 16, 32, 64, 128)
    """The profiles' batch grid."""
    contexts: Annotated[tuple[int, ...], comma_list(int_in(2))] = (16, 128, 256)
    """The profiles' prompt lengths."""
    reps: Annotated[int, value(positive_int)] = 3
    """Profile repetitions per cell."""
    acceptance_rows: Annotated[int, value(positive_int)] = 384
    """Requests per domain and temperature band for the profiles' acceptance."""
    threads: Annotated[int, value(THREADS)] = 1
    """torch threads while profiling (the profile holds at this count)."""
    total_timesteps: Annotated[int, value(positive_int)] = 50_000
    """PPO env steps per preset (PPO trains whole rollouts of n_envs x n_steps)."""
    n_envs: Annotated[int, value(positive_int)] = DEFAULT.n_envs
    """Training envs stepped together."""
    n_steps: Annotated[int, value(positive_int)] = DEFAULT.n_steps
    """Steps per env per rollout."""
    batch_size: Annotated[int, value(int_in(2))] = DEFAULT.batch_size
    """PPO minibatch size."""
    workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = (
        "ramp",
        "day",
        "bursts",
        "mixed",
    )
    """Workloads of the comparison."""
    episodes: Annotated[int, value(positive_int)] = 2
    """Comparison episodes per workload and policy."""
    seed: Annotated[int, value(SEED)] = HELD_OUT_SEED
    """First seed of the comparison's traces (held out from training)."""
    n_requests: Annotated[int, value(int_in(0, N_REQUESTS_MAX))] = 0
    """Requests per surrogate trace; 0: the preset's own."""
    wandb: Annotated[str, value(one_of(*WANDB_MODES))] = "offline"
    """wandb mode: offline, online or disabled."""


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, run, argv, __doc__, "draft_size")


def crossover(profile) -> int | None:
    """The smallest batch size of the profile's grid from which off has the best tokens/s at
    every larger size too (None: speculation pays at every size measured)."""
    best = [max(range(len(row)), key=row.__getitem__) for row in profile.tokens_per_s]
    for i, batch in enumerate(profile.batch_sizes):
        if all(k == 0 for k in best[i:]):
            return batch
    return None


def table_k_by_batch(table, acceptance: float) -> dict[str, int]:
    """The table's K at ``acceptance`` for each of its batch ranges, keyed ``"lo-hi"`` (``"lo"``
    for a range of one size): a table's ranges are its own, not the profile's grid."""
    from specrl.features import range_label

    column = table.acceptance_bin(acceptance)
    return {
        range_label(lo, hi): table.cell(b)[column] for b, (lo, hi) in enumerate(table.batch_buckets)
    }


def run(args: Args) -> dict:
    out = Path(args.out or f"runs/{args.exp_name}__{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    results = {preset: _run_preset(args, preset, out / preset) for preset in args.presets}
    write_json(out / "draft_size.json", results)
    _print_summary(results)
    print(f"wrote {out}/draft_size.json")
    return results


def _run_preset(args: Args, preset: str, where: Path) -> dict:
    """One pair's pipeline in ``where``: its profile, PPO run, table and comparison; what the
    summary reports of it."""
    import numpy as np

    from specrl.compare import compare_surrogate
    from specrl.policies import default_policies
    from specrl.report import log_comparison, plot_table
    from specrl.train.to_table import checked_table

    where.mkdir(exist_ok=True)
    max_batch = max(args.batch_sizes)
    profile, profile_path, draft_layers, draft_params = _measure(args, preset, where)
    config = _train(args, preset, where, profile_path, max_batch)
    table, _ = checked_table(config.out, progress=False)  # as `specrl export` writes it
    table.save(where / "table.json")
    plot_table(table, where / "table.png")
    acceptance = float(np.mean(profile.mean_acceptance))
    reports = compare_surrogate(
        profile,
        args.workloads,
        [*default_policies(4), f"lookup:{where / 'table.json'}"],
        episodes=args.episodes,
        seed=args.seed,
        max_batch=max_batch,
        n_requests=args.n_requests or None,
    )
    log_comparison(reports, group=f"{args.exp_name}-{preset}", out_dir=where, mode=args.wandb)
    cost = profile.step_seconds(0, 4, 0) / profile.step_seconds(0, 0, 0)
    return {
        "draft_layers": draft_layers,
        "draft_params": draft_params,
        "mean_acceptance": acceptance,
        "cost_k4_over_k0_at_batch_1": cost,
        "crossover_batch": crossover(profile),
        "best_k_by_batch": {
            b: max(range(len(row)), key=row.__getitem__)
            for b, row in zip(profile.batch_sizes, profile.tokens_per_s)
        },
        "table_k_by_batch": table_k_by_batch(table, acceptance),
        "table_over_best_static": {
            r.workload: r.result("lookup:table.json").tokens_per_s / r.best_static.tokens_per_s
            for r in reports
        },
    }


def _measure(args: Args, preset: str, where: Path) -> tuple:
    """The pair ``preset`` built and profiled on this machine, its profile saved in ``where``:
    the profile, its path, and the draft's layer and parameter counts."""
    import torch

    from specrl.models import load_default_pair
    from specrl.profile.measure import measure_profile

    print(f"\n{preset}: pair and profile")
    torch.set_num_threads(args.threads)
    pair = load_default_pair(preset)
    draft_params = sum(p.numel() for p in pair.draft.parameters())
    draft_layers = pair.draft.config.num_hidden_layers
    profile = measure_profile(
        pair,
        k_max=4,
        batch_sizes=list(args.batch_sizes),
        contexts=list(args.contexts),
        reps=args.reps,
        acceptance_rows=args.acceptance_rows,
        preset=preset,
    )
    profile_path = where / "profile.json"
    profile.save(profile_path)
    return profile, profile_path, draft_layers, draft_params


def _train(args: Args, preset: str, where: Path, profile_path: Path, max_batch: int):
    """PPO trained on the profile at ``profile_path``, its run in ``where/run``; its config."""
    from specrl.train import train

    print(f"{preset}: PPO, --total-timesteps {args.total_timesteps:,}")
    config = TrainConfig(
        out=str(where / "run"),
        total_timesteps=args.total_timesteps,
        profile=str(profile_path.resolve()),
        max_batch=max_batch,
        n_requests=args.n_requests or None,
        n_envs=args.n_envs,
        n_steps=args.n_steps,
        batch_size=args.batch_size,
        eval_every=min(25_000, args.total_timesteps),
        wandb=args.wandb,
    )
    print(f"{preset}: PPO trained {train(config).num_timesteps:,} steps")
    return config


def _print_summary(results: dict) -> None:
    """One markdown row per preset: the draft, its cost, the crossover and the Ks chosen."""
    print(
        "\n| preset | draft layers | params | mean acceptance | T(1,4)/T(1,0) | crossover "
        "batch (profile) | best K by batch (profile) | table K by batch (at mean acc.) | "
        "table / best static |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for preset, r in results.items():
        ks = " ".join(f"{b}:{k}" for b, k in r["best_k_by_batch"].items())
        tk = " ".join(f"{b}:{k}" for b, k in r["table_k_by_batch"].items())
        ratios = " ".join(f"{w} {v:.3f}" for w, v in r["table_over_best_static"].items())
        print(
            f"| {preset} | {r['draft_layers']} | {r['draft_params']:,} | "
            f"{r['mean_acceptance']:.3f} | {r['cost_k4_over_k0_at_batch_1']:.2f} | "
            f"{r['crossover_batch']} | {ks} | {tk} | {ratios} |"
        )


if __name__ == "__main__":
    sys.exit(main())
