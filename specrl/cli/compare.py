"""``specrl compare``: every policy on the same held-out traces (:mod:`specrl.compare`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specrl import options
from specrl.compare import compare_policies
from specrl.errors import SpecrlError
from specrl.features import ACCEPTANCE_ESTIMATES
from specrl.files import check_output, write_json
from specrl.workload.presets import PRESETS, is_preset


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="run every policy on the same traces and compare tokens/s, buckets, K, TPOT",
        description="Run every policy on the same traces (the surrogate or the live engine) "
        "and print aggregate tokens/s, tokens/s per batch bucket, the share of steps at each "
        "K and per-request TPOT p50/p99. Policies: off, fixed:K, threshold:K:B, "
        "schedule:FILE, hf, ema, goodput, oracle (surrogate only), ppo:RUN_DIR, lookup:TABLE.json.",
    )
    parser.add_argument("--env", choices=("surrogate", "live"), default="surrogate")
    parser.add_argument(
        "--workload", default="mixed", help="a preset (mixed, ramp, day, ...) or TRACE.json"
    )
    parser.add_argument("--seed", type=options.SEED, default=0)
    parser.add_argument(
        "--episodes",
        type=options.positive_int,
        default=4,
        help="episodes per policy (default 4; even, so the play order cancels a drift)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="live: play the policies' episodes side by side, each on an engine of its own, "
        "the one that has served least time stepping next, so a drift in the machine's speed "
        "meets them alike (default: one episode after another, in ABBA order)",
    )
    parser.add_argument(
        "--policies", default=None, help="comma list (default: every baseline for the env)"
    )
    parser.add_argument(
        "--profile", metavar="PROFILE.json", help="hardware profile (default: the shipped one)"
    )
    parser.add_argument("--max-batch", type=options.BATCH, default=128)
    parser.add_argument("--max-len", type=options.positive_int, default=384)
    parser.add_argument(
        "--n-requests", type=options.N_REQUESTS, default=None, help="requests per preset trace"
    )
    parser.add_argument("--k-max", type=options.K_MAX, default=4)
    parser.add_argument(
        "--preset", type=options.model_preset, default="small", help="default pair for --env live"
    )
    parser.add_argument("--device", type=options.device, default="cpu")
    parser.add_argument(
        "--threads",
        type=options.THREADS,
        default=None,
        help="torch threads (live; default: the profile's)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="accept a profile (live) or a K table (lookup:) made elsewhere, or a stale profile",
    )
    parser.add_argument(
        "--acceptance-estimate",
        choices=ACCEPTANCE_ESTIMATES,
        default=None,
        help="the observation's acceptance, which lookup: tables, ppo: runs and the adaptive "
        "baselines read: the step EMA (steps) or a per-request figure (requests, usable). "
        "Default: the one the lookup: tables and ppo: runs were trained on, else steps",
    )
    parser.add_argument("--json", metavar="OUT.json", help="write the results as JSON")
    parser.add_argument("--csv", metavar="OUT.csv", help="write the results as CSV")
    parser.set_defaults(func=run)


def make_env(args: argparse.Namespace):
    """The env ``args`` ask for, and the profile it uses."""
    from specrl.envs import LiveSpecEnv, SurrogateSpecEnv, default_profile_path
    from specrl.profile import load_profile

    workload_kwargs = {"peak": args.max_batch}
    if args.n_requests:
        if not is_preset(args.workload):
            raise SpecrlError(
                f"--n-requests draws a preset's trace; {args.workload} replays the requests it "
                "holds: drop --n-requests (or write a trace of that many with `specrl workload "
                "--n-requests N`)"
            )
        workload_kwargs["n_requests"] = args.n_requests
    profile = load_profile(args.profile or default_profile_path())
    common = {
        "workload": args.workload,
        "workload_kwargs": workload_kwargs,
        "k_max": args.k_max,
        "max_batch": args.max_batch,
        "max_len": args.max_len,
        "acceptance_estimate": args.acceptance_estimate,
    }
    if args.env == "surrogate":
        return SurrogateSpecEnv(profile=profile, **common), profile
    from specrl.profile import use_profile_threads

    use_profile_threads(profile, args.threads)  # step times hold at the profile's count
    env = LiveSpecEnv(
        preset=args.preset,
        device=args.device,
        profile=profile,
        force_profile=args.force,
        **common,
    )
    return env, profile


def _known_workload(name: str) -> None:
    """``--workload`` names a preset or a trace file: said before any other option is judged
    by it (``--n-requests`` draws a preset's trace, and would otherwise take the blame)."""

    if not (is_preset(name) or name.endswith(".json") or Path(name).exists()):
        raise SpecrlError(
            f"workload {name!r} is neither a preset ({', '.join(PRESETS)}, or steady-N for "
            "any N) nor a trace file (.json, from `specrl workload`)"
        )


def run(args: argparse.Namespace) -> int:
    from specrl.policies.episode_pool import parallel_episodes

    with parallel_episodes():  # the engineer's tuning and the schedule search on every core
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    _known_workload(str(args.workload))
    if args.interleave and args.env != "live":
        raise SpecrlError(
            "--interleave plays live episodes side by side; the surrogate's times do not "
            "drift: drop it, or use --env live"
        )
    from specrl.envs.rollout import LIVE_WARMUP_STEPS, odd_rounds_note
    from specrl.policies import default_policies, make_policies, parse_policies
    from specrl.policies.oracle import LIVE_REFUSAL
    from specrl.policies.registry import observation_estimate

    for option, path in (("--json", args.json), ("--csv", args.csv)):
        if path:
            check_output(path, option)  # before the comparison, not after it
    specs = (
        parse_policies(args.policies)
        if args.policies
        else default_policies(args.k_max, surrogate=args.env == "surrogate")
    )
    if args.env == "live" and "oracle" in specs:
        # Before the live env's freshness timing: the oracle could never run there.
        raise SpecrlError(
            f"{LIVE_REFUSAL}: drop it from --policies, or compare with --env surrogate"
        )
    # The observation the trained policies read, refused early where the option names another.
    args.acceptance_estimate = observation_estimate(specs, args.acceptance_estimate)
    env, profile = make_env(args)
    policies = make_policies(specs, env=env, profile=profile, force=args.force)
    if (
        args.env == "live"
        and not args.interleave
        and (note := odd_rounds_note(args.episodes, "--episodes"))
    ):
        print(note)
    report = compare_policies(
        env,
        policies,
        seed=args.seed,
        episodes=args.episodes,
        env_name=args.env,
        workload=str(args.workload),
        warmup_steps=LIVE_WARMUP_STEPS if args.env == "live" else 0,
        speed_profile=profile if args.env == "live" else None,
        interleave=args.interleave,
    )
    side = ", side by side" if args.interleave else ""
    print(
        f"{args.env}, workload {args.workload}, {args.episodes} episode(s) from seed "
        f"{args.seed}{side}"
    )
    print(report.format())
    if args.json:
        write_json(args.json, report.to_json())
        print(f"wrote {args.json}")
    if args.csv:
        report.write_csv(args.csv)
        print(f"wrote {args.csv}")
    return 0
