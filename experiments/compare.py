"""Compare K controllers side by side in the surrogate: every baseline, and a trained run or
an exported table, on held-out seeds of several workloads.

    python experiments/compare.py --table runs/demo-*/table.json
    python experiments/compare.py --run runs/ppo --workloads ramp,day --episodes 5
    python experiments/compare.py --help

Writes ``OUT/compare-<workload>.{json,csv}``, a tokens/s-per-bucket PNG per workload and the
wandb runs (offline by default: one group per workload, one run per policy, a summary run
with the table and the plots).
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
    WANDB_MODES,
    int_in,
    positive_int,
    workload_preset,
)
from specrl.seeds import HELD_OUT_SEED


@dataclass
class Args:
    exp_name: str = "compare"
    """Name of the experiment: the first part of the output directory and of each wandb
    group ({exp_name}-surrogate-{workload}; the group itself with one workload)."""
    out: str = ""
    """Output directory; empty: runs/{exp_name}__{unix time}."""
    workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = (
        "ramp",
        "day",
        "bursts",
        "mixed",
    )
    """Workload presets, one comparison each."""
    policies: str = ""
    """Comma list of policies (specrl compare's names); empty: every baseline and the oracle."""
    run: str = ""
    """A `specrl train` run to add as ppo:RUN."""
    table: str = ""
    """An exported K table to add as lookup:TABLE."""
    episodes: Annotated[int, value(positive_int)] = 3
    """Episodes per workload and policy (seeds seed..seed+episodes-1)."""
    seed: Annotated[int, value(SEED)] = HELD_OUT_SEED
    """First seed: held out from training (0..), its evaluation (10,000) and warm start (30,000)."""
    profile: str = ""
    """Hardware profile JSON; empty: the one shipped with specrl."""
    max_batch: Annotated[int, value(BATCH)] = 128
    """Largest batch, and the workloads' peak concurrency."""
    n_requests: Annotated[int, value(int_in(0, N_REQUESTS_MAX))] = 0
    """Requests per trace; 0: the preset's own."""
    wandb: Annotated[str, value(one_of(*WANDB_MODES))] = "offline"
    """wandb mode: offline, online or disabled."""


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, run, argv, __doc__, "compare")


def run(args: Args) -> Path:
    from specrl.compare import compare_surrogate
    from specrl.envs import default_profile_path
    from specrl.policies import default_policies, parse_policies
    from specrl.profile import load_profile
    from specrl.report import log_comparison, plot_buckets

    out = Path(args.out or f"runs/{args.exp_name}__{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    profile = load_profile(args.profile or default_profile_path())
    specs = parse_policies(args.policies) if args.policies else default_policies(profile.k_max)
    specs += [f"ppo:{args.run}"] if args.run else []
    specs += [f"lookup:{args.table}"] if args.table else []
    reports = compare_surrogate(
        profile,
        args.workloads,
        specs,
        episodes=args.episodes,
        seed=args.seed,
        k_max=profile.k_max,
        max_batch=args.max_batch,
        n_requests=args.n_requests or None,
    )
    for report in reports:
        stem = out / f"compare-{report.workload}"
        write_json(f"{stem}.json", report.to_json())
        report.write_csv(f"{stem}.csv")
        plot_buckets(report, f"{stem}-buckets.png")  # also with --wandb disabled
        print(
            f"\nsurrogate, workload {report.workload}, {args.episodes} episode(s) from seed "
            f"{args.seed}"
        )
        print(report.format())
    # Each summary run holds its report's bucket plot already (written to out/plots/).
    log_comparison(reports, group=args.exp_name, out_dir=out, mode=args.wandb)
    print(f"\nwrote {out}/")
    return out


if __name__ == "__main__":
    sys.exit(main())
