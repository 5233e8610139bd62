"""``specrl workload``: write a seeded, replayable trace."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from specrl.workload.trace import PRESETS

    parser = sub.add_parser(
        "workload",
        help="write a replayable workload trace (JSON)",
        description="Draw a seeded workload trace from a preset and write it as JSON; replay "
        "it with `specrl validate-surrogate --trace` or as an env's workload.",
    )
    parser.add_argument("--preset", choices=PRESETS, default="ramp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-requests", type=int, default=None)
    parser.add_argument("--peak", type=int, default=64, help="largest concurrency")
    parser.add_argument("--out", required=True, metavar="TRACE.json")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specrl.workload.trace import preset_trace

    trace = preset_trace(args.preset, seed=args.seed, n_requests=args.n_requests, peak=args.peak)
    trace.save(args.out)
    print(
        f"wrote {args.out}: {len(trace.requests)} requests, {trace.total_tokens} tokens, "
        f"load {trace.load['kind']}"
    )
    return 0
