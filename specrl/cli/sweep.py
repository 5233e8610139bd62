"""``specrl sweep``: a grid of training runs on Ray Tune (:mod:`specrl.sweep`)."""

from __future__ import annotations

import argparse

from specrl.options import THREADS, positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "sweep",
        help="train, export and compare a grid of profiles x workload mixes x seeds x "
        "training settings on Ray Tune",
        description="Run the grid a spec file (YAML or JSON; docs/sweep.md) describes on Ray "
        "Tune: each trial trains PPO, exports its K table in every format and compares it "
        "with the baselines on held-out seeds. Writes OUT/summary.csv and summary.json "
        "(mean ± std over seeds per configuration), OUT/best/<profile>-<mix>/ (the best table "
        "of each, every format) and OUT/trials/. Exit status 1 if a trial failed. Ray runs "
        "on this machine unless --address names a cluster.",
    )
    parser.add_argument("spec", metavar="SPEC", help="the sweep's spec file (.yaml or .json)")
    parser.add_argument("--out", metavar="DIR", required=True, help="the sweep's folder")
    parser.add_argument(
        "--address",
        metavar="ADDR",
        default=None,
        help="a Ray cluster's head node (HOST:PORT from `ray start --head`, ray://HOST:PORT, "
        "or auto); default: Ray on this machine",
    )
    parser.add_argument(
        "--max-concurrent",
        metavar="N",
        type=positive_int,
        default=None,
        help="trials running at once at most (default: as many as the CPUs allow; a resumed "
        "sweep keeps what it was started with)",
    )
    parser.add_argument(
        "--cpus-per-trial",
        metavar="C",
        type=THREADS,
        default=None,
        help="CPUs reserved per trial, and its torch threads (default 1; a resumed sweep "
        "keeps what it was started with)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="finish the sweep in --out (killed, or with failed trials): finished trials are "
        "kept, stopped runs continue from their last checkpoint",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specrl.sweep.spec import load_spec
    from specrl.sweep.tune import run_sweep

    result = run_sweep(
        load_spec(args.spec),
        args.out,
        address=args.address,
        max_concurrent=args.max_concurrent,
        cpus_per_trial=args.cpus_per_trial,
        resume=args.resume,
    )
    return result.exit_code
