"""The same pipeline for two drafts of one target: how the crossover batch and the learned K
table move when the draft's cost and acceptance change.

    python experiments/draft_size.py                      # small (1-layer draft) vs small-draft3
    python experiments/draft_size.py --presets micro,micro-draft3 --total-timesteps 2048
    python experiments/draft_size.py --help

For each preset: build the pair if needed (a draft variant distils its draft from the base
pair's target and is cached under $SPECRL_HOME, never shipped) and measure a profile on this
machine (both the same way, one after the other, into ``OUT/profiles/<preset>.json``). Then
one sweep on Ray Tune (specrl.sweep.tune.run_sweep), a trial per profile, trains PPO on it,
exports the table and compares it with the baselines in the surrogate on held-out seeds
(``OUT/trials/<preset>-<mix>-s<seed>/``). Serving folklore says a
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
from specrl.files import read_json, write_json
from specrl.options import (
    BATCH,
    N_REQUESTS_MAX,
    THREADS,
    WANDB_MODES,
    int_in,
    model_preset,
    positive_int,
    workload_preset,
)
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
    n_requests: Annotated[int, value(int_in(0, N_REQUESTS_MAX))] = 0
    """Requests per surrogate trace; 0: the preset's own."""
    wandb: Annotated[str, value(one_of(*WANDB_MODES))] = "offline"
    """wandb mode: offline, online or disabled (one run per preset, in the group exp_name)."""
    address: str = ""
    """A Ray cluster's head node (HOST:PORT, ray://HOST:PORT or auto); empty: Ray on this
    machine."""
    max_concurrent: Annotated[int, value(positive_int)] = 1
    """Presets training at once at most."""
    cpus_per_trial: Annotated[int, value(THREADS)] = 1
    """CPUs reserved per preset's trial, and its torch threads."""


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
    from specrl.errors import SpecrlError
    from specrl.sweep.tune import SPEC_FILE, run_sweep

    out = Path(args.out or f"runs/{args.exp_name}__{int(time.time())}")
    if (out / SPEC_FILE).is_file():
        raise SpecrlError(f"{out} holds a draft_size run already; give another --out")
    measured = {preset: _measure(args, preset, out / "profiles") for preset in args.presets}
    spec = _sweep_spec(args, [str(m[1]) for m in measured.values()])
    result = run_sweep(
        spec,
        out,
        address=args.address or None,
        max_concurrent=args.max_concurrent,
        cpus_per_trial=args.cpus_per_trial,
    )
    if result.failed:
        raise SpecrlError(
            "presets failed: "
            + "; ".join(f"{name}: {error}" for name, error in result.failed.items())
        )
    trials = {t.profile_name: t for t in spec.trials()}
    results = {
        preset: _results(args, preset, out, trials[preset], *measured[preset])
        for preset in args.presets
    }
    write_json(out / "draft_size.json", results)
    _print_summary(results)
    print(f"wrote {out}/draft_size.json")
    return results


def _sweep_spec(args: Args, profiles: list[str]):
    """The sweep of one trial per measured profile, trained and compared as these arguments
    say."""
    from specrl.sweep.spec import spec_from_json

    train = {
        "total_timesteps": args.total_timesteps,
        "max_batch": max(args.batch_sizes),
        "n_requests": args.n_requests or None,
        "n_envs": args.n_envs,
        "n_steps": args.n_steps,
        "batch_size": args.batch_size,
        "eval_every": min(25_000, args.total_timesteps),
    }
    obj = {
        "name": args.exp_name,
        "profiles": profiles,
        "workloads": [list(DEFAULT.workloads)],
        "seeds": [DEFAULT.seed],
        "train": train,
        "compare": {"workloads": list(args.workloads), "episodes": args.episodes},
        "export": {"search": False},  # the native table is what is compared
        "wandb": args.wandb,
    }
    return spec_from_json(obj, source="draft_size.py arguments")


def _results(args: Args, preset: str, out: Path, trial, profile, profile_path, layers, params):
    """What the summary reports of one preset: its profile, and its trial's table and
    comparisons (the trial's folder also gets the table's plot)."""
    import numpy as np

    from specrl.report import plot_table
    from specrl.sweep.trial import trial_dir
    from specrl.table import load_table
    from specrl.train.exports import NATIVE_FILE

    where = trial_dir(out, trial)
    trained = read_json(where / "run" / "summary.json", "run summary", f"delete {out}")
    print(f"{preset}: PPO trained {trained['num_timesteps']:,} steps ({where})")
    table = load_table(where / NATIVE_FILE)
    plot_table(table, where / "table.png")
    acceptance = float(np.mean(profile.mean_acceptance))
    # The table's bins index the figure its run observed: read it where the export collapses
    # it, at the mean of that figure (a per-request one reads lower than the profile's mean).
    operating = float(table.provenance.get("operating_acceptance", acceptance))
    over_best_static = {}
    for workload in args.workloads:
        report = read_json(where / f"compare-{workload}.json", "comparison", f"delete {out}")
        mine = next(r for r in report["results"] if r["policy"] == "lookup:table.json")
        over_best_static[workload] = mine["tokens_per_s"] / report["best_static"]["tokens_per_s"]
    cost = profile.step_seconds(0, 4, 0) / profile.step_seconds(0, 0, 0)
    return {
        "draft_layers": layers,
        "draft_params": params,
        "mean_acceptance": acceptance,
        "cost_k4_over_k0_at_batch_1": cost,
        "crossover_batch": crossover(profile),
        "best_k_by_batch": {
            b: max(range(len(row)), key=row.__getitem__)
            for b, row in zip(profile.batch_sizes, profile.tokens_per_s)
        },
        "operating_acceptance": operating,
        "table_k_by_batch": table_k_by_batch(table, operating),
        "table_over_best_static": over_best_static,
    }


def _measure(args: Args, preset: str, where: Path) -> tuple:
    """The pair ``preset`` built and profiled on this machine, its profile saved as
    ``where/<preset>.json``: the profile, its path, and the draft's layer and parameter
    counts."""
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
    where.mkdir(parents=True, exist_ok=True)
    profile_path = where / f"{preset}.json"
    profile.save(profile_path)
    return profile, profile_path.resolve(), draft_layers, draft_params


def _print_summary(results: dict) -> None:
    """One markdown row per preset: the draft, its cost, the crossover and the Ks chosen."""
    print(
        "\n| preset | draft layers | params | mean acceptance | T(1,4)/T(1,0) | crossover "
        "batch (profile) | best K by batch (profile) | table K by batch (at its operating acc.) | "
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
