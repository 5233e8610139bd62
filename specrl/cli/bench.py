"""``specrl bench ...`` subcommands."""

from __future__ import annotations

import argparse

from specrl import options
from specrl.errors import SpecrlError
from specrl.files import check_output
from specrl.models.build import PRESETS


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmarks that print measured ratios")
    bench = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    engine = bench.add_parser(
        "engine",
        help="SpecEngine vs HF generate and assisted generation, tokens/s by batch and K",
        description="Greedy decoding of held-out code prompts on the default pair. Prints K=0 "
        "vs HF generate, the cost of a loaded-but-idle draft, tokens/s per K relative to K=0, "
        "and the batch-1 best K vs HF assisted generation.",
    )
    engine.add_argument(
        "--preset",
        default="small",
        choices=list(PRESETS),
        help="built-in pair to benchmark (default: small)",
    )
    engine.add_argument("--target", help="target model id or directory (with --draft)")
    engine.add_argument("--draft", help="draft model id or directory (with --target)")
    engine.add_argument(
        "--device",
        type=options.device,
        default=None,
        help="cpu, cuda or cuda:N (default: cuda if available, else cpu)",
    )
    engine.add_argument("--batch-sizes", type=options.positive_ints, default=[1, 4, 16, 64])
    engine.add_argument(
        "--k-max",
        type=options.K_MAX,
        default=4,
        help=f"largest K, 1..{options.K_MAX_RUN} (default 4)",
    )
    engine.add_argument(
        "--prompt-len", type=options.positive_int, default=128, help="tokens (default 128)"
    )
    engine.add_argument(
        "--new-tokens", type=options.positive_int, default=64, help="tokens (default 64)"
    )
    engine.add_argument("--repeats", type=options.positive_int, default=5, help="default 5")
    engine.add_argument(
        "--min-sample-s",
        type=options.nonnegative_float,
        default=0.0,
        help="run short jobs back to back until a sample spans this long (default: 0, off)",
    )
    engine.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    engine.set_defaults(func=_engine)

    surrogate = bench.add_parser(
        "surrogate",
        help="SurrogateSpecEnv steps per second",
        description="Step the surrogate env (through gymnasium.make) with a fixed K cycle "
        "and print env steps per second on one core.",
    )
    surrogate.add_argument("--profile", metavar="PROFILE.json", help="default: the shipped one")
    surrogate.add_argument(
        "--steps", type=options.positive_int, default=200_000, help="default 200000"
    )
    surrogate.add_argument(
        "--max-batch",
        type=options.BATCH,
        default=64,
        help="default 64 (the envs' own default is 128)",
    )
    surrogate.set_defaults(func=_surrogate)

    episodes = bench.add_parser(
        "episodes",
        help="surrogate episodes on every core against one process (wall-time ratio)",
        description="The engineer's tuning on ramp, day, bursts and mixed, then every default "
        "policy compared on them, each in one process and then on the pool of worker "
        "processes (SPECRL_WORKERS, default one per core): the wall times, their ratio, and "
        "whether every result is the same (exit 1 if not).",
    )
    episodes.add_argument("--profile", metavar="PROFILE.json", help="default: the shipped one")
    episodes.add_argument(
        "--workers", type=options.positive_int, default=None, help="default: one per core"
    )
    episodes.add_argument(
        "--episodes", type=options.positive_int, default=2, help="held-out episodes, default 2"
    )
    episodes.add_argument("--max-batch", type=options.BATCH, default=128, help="default 128")
    episodes.add_argument(
        "--n-requests",
        type=options.positive_int,
        default=None,
        help="requests per trace (default: each workload's own)",
    )
    episodes.set_defaults(func=_episodes)

    controller = bench.add_parser(
        "controller",
        help="LookupController.choose_k nanoseconds per call",
        description="Call the serving-side controller's choose_k over seeded batch sizes and "
        "print nanoseconds per call against its 2 µs budget.",
    )
    controller.add_argument(
        "--table", metavar="TABLE.json", help="default: a built-in example table"
    )
    controller.add_argument(
        "--calls", type=options.positive_int, default=1_000_000, help="default 1000000"
    )
    controller.set_defaults(func=_controller)

    sweep = bench.add_parser(
        "sweep",
        help="Ray Tune: trials side by side against one at a time (wall-time ratio)",
        description="The same small sweep (TRIALS seeds, one torch thread each) under Ray "
        "Tune one trial at a time, then CONCURRENT at once: the wall-time ratio (goal on 2 "
        "cores: at most 0.65), Ray's start-up time and its overhead per trial. Needs the "
        "[sweep] extra.",
    )
    sweep.add_argument("--trials", type=options.positive_int, default=4)
    sweep.add_argument("--concurrent", type=options.positive_int, default=2)
    sweep.add_argument(
        "--timesteps", type=options.positive_int, default=4096, help="PPO steps per trial"
    )
    sweep.add_argument("--out", help="where the two sweeps go (default: a new temp folder)")
    sweep.set_defaults(func=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from specrl.bench.sweep import run

    run(trials=args.trials, concurrent=args.concurrent, timesteps=args.timesteps, out=args.out)
    return 0


def _episodes(args: argparse.Namespace) -> int:
    from specrl.bench.episodes import run

    return run(
        profile=args.profile,
        workers=args.workers,
        episodes=args.episodes,
        max_batch=args.max_batch,
        n_requests=args.n_requests,
    )


def _controller(args: argparse.Namespace) -> int:
    from specrl.bench.controller import run

    return run(args)


def _surrogate(args: argparse.Namespace) -> int:
    from specrl.bench.surrogate import run

    return run(steps=args.steps, max_batch=args.max_batch, profile=args.profile)


def _engine(args: argparse.Namespace) -> int:
    import torch

    from specrl.bench.engine import format_report, run_engine_benchmark, write_json
    from specrl.models import load_default_pair, load_pair

    if args.json:
        check_output(args.json, "--json")  # before minutes of timing
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if bool(args.target) != bool(args.draft):
        raise SpecrlError("--target and --draft go together; give both or neither")
    if args.target:
        pair = load_pair(args.target, args.draft, device=device)
    else:
        pair = load_default_pair(args.preset, device=device)
    result = run_engine_benchmark(
        pair,
        batch_sizes=args.batch_sizes,
        k_max=args.k_max,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        min_sample_s=args.min_sample_s,
    )
    print(format_report(result))
    if args.json:
        write_json(result, args.json)
        print(f"wrote {args.json}")
    return 0
