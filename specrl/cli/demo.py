"""``specrl demo``: the whole job on this machine (:mod:`specrl.demo`)."""

from __future__ import annotations

import argparse

from specrl import demo
from specrl.errors import SpecrlError
from specrl.options import (
    BATCH,
    N_REQUESTS,
    THREADS,
    WANDB_MODES,
    device,
    model_preset,
    positive_int,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="the whole job: pair, profile, PPO, K table, comparison in the surrogate and live",
        description=demo.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = demo.DemoOptions()
    parser.add_argument("--out", default=defaults.out, help="runs directory (default: runs)")
    parser.add_argument(
        "--preset", type=model_preset, default=defaults.preset, help="default pair (small)"
    )
    parser.add_argument(
        "--timesteps",
        type=positive_int,
        default=defaults.timesteps,
        help=f"PPO env steps ({defaults.timesteps:,})",
    )
    parser.add_argument(
        "--surrogate-episodes",
        type=positive_int,
        default=defaults.surrogate_episodes,
        help="held-out episodes per workload and policy in the surrogate "
        f"({defaults.surrogate_episodes})",
    )
    parser.add_argument(
        "--live-requests",
        type=N_REQUESTS,
        default=defaults.live_requests,
        help=f"requests in the live held-out trace ({defaults.live_requests})",
    )
    parser.add_argument(
        "--live-episodes",
        type=positive_int,
        default=defaults.live_episodes,
        help="live held-out traces, the policies side by side on each (2)",
    )
    parser.add_argument(
        "--max-batch",
        type=BATCH,
        default=defaults.max_batch,
        help="largest batch: of a measured profile's grid, training, the comparisons and the "
        f"live trace's peak ({defaults.max_batch}); a profile whose grid stops below it is "
        "measured again",
    )
    parser.add_argument("--measure", action="store_true", help="measure a new profile")
    parser.add_argument(
        "--profile-reps",
        type=positive_int,
        default=defaults.profile_reps,
        help=f"rounds of a profile the demo measures ({defaults.profile_reps}; "
        "`specrl profile` takes 5)",
    )
    parser.add_argument("--wandb", choices=WANDB_MODES, default=defaults.wandb)
    parser.add_argument(
        "--threads",
        type=THREADS,
        default=None,
        help="torch threads (default: the profile's)",
    )
    parser.add_argument("--device", type=device, default="cpu")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    counts = (args.timesteps, args.live_requests, args.live_episodes, args.surrogate_episodes)
    if min(counts) < 1:
        raise SpecrlError(
            "--timesteps, --live-requests, --live-episodes and --surrogate-episodes must be >= 1"
        )
    demo.run_demo(
        demo.DemoOptions(
            out=args.out,
            preset=args.preset,
            timesteps=args.timesteps,
            surrogate_episodes=args.surrogate_episodes,
            live_requests=args.live_requests,
            live_episodes=args.live_episodes,
            max_batch=args.max_batch,
            measure=args.measure,
            profile_reps=args.profile_reps,
            wandb=args.wandb,
            threads=args.threads,
            device=args.device,
            progress=not args.no_progress,
        )
    )
    return 0
