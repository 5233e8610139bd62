"""``specrl validate-surrogate`` (sim-to-real); `benchmark` backs ``specrl bench surrogate``."""

from __future__ import annotations

import argparse
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    val = sub.add_parser(
        "validate-surrogate",
        help="compare surrogate and live tokens/s for fixed policies on one trace",
        description="Run off, K=2, K=4 and a batch threshold on the same trace in the live "
        "and the surrogate env; print surrogate tokens/s / live tokens/s per policy (goal: "
        "0.9-1.1). With --measure, the profile is measured now, its timing rounds taking "
        "turns with the live episodes, so that a machine whose speed drifts (a shared VM) "
        "drifts under both alike; it is then written to --profile.",
    )
    val.add_argument("--profile", required=True, metavar="PROFILE.json")
    val.add_argument(
        "--measure",
        action="store_true",
        help="measure PROFILE.json now, interleaved with the live episodes, and write it",
    )
    val.add_argument("--force", action="store_true", help="accept a profile from elsewhere")
    val.add_argument("--preset", default="small", help="default pair to run live (small)")
    val.add_argument("--device", default="cpu")
    val.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own choice)"
    )
    val.add_argument("--trace", metavar="TRACE.json", help="default: the ramp preset")
    val.add_argument("--peak", type=int, default=32, help="ramp peak concurrency")
    val.add_argument("--n-requests", type=int, default=96)
    val.add_argument(
        "--threshold",
        type=int,
        default=8,
        help="batch threshold policy: spec at or below this batch size",
    )
    val.add_argument(
        "--surrogate-seeds", type=int, default=20, help="surrogate episodes averaged per policy"
    )
    val.add_argument(
        "--live-repeats", type=int, default=2, help="live episodes per policy, taking turns"
    )
    val.add_argument("--seed", type=int, default=0)
    val.set_defaults(func=validate)


def _fixed_policies(k_max: int, threshold: int, max_batch: int):
    from specrl.policies import BatchThreshold, FixedK

    ks = [k for k in (0, 2, 4) if k <= k_max]
    return [FixedK(k) for k in ks] + [BatchThreshold(min(4, k_max), threshold, max_batch)]


def validate(args: argparse.Namespace) -> int:
    from specrl.envs import LiveSpecEnv, SurrogateSpecEnv
    from specrl.envs.sim2real import LiveRuns, compare_runs, format_comparison
    from specrl.models.pair import load_default_pair
    from specrl.profile import load_profile
    from specrl.workload import load_trace, preset_trace

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    profile = None if args.measure else load_profile(args.profile)
    if args.trace:
        trace = load_trace(args.trace)
    else:
        trace = preset_trace("ramp", seed=args.seed, n_requests=args.n_requests, peak=args.peak)
    max_batch = max(args.peak, max(c for _, c in trace.load.get("schedule", [[0, 1]])))
    k_max = 4 if profile is None else min(4, profile.k_max)
    pair = load_default_pair(args.preset, device=args.device)
    common = {"workload": trace, "k_max": k_max, "max_batch": max_batch}
    # The reward's reference rate plays no part in tokens/s; a fresh profile needs no check.
    live = LiveSpecEnv(
        pair=pair,
        device=args.device,
        profile=profile,
        force_profile=args.force,
        reference_tokens_per_s=1.0 if profile is None else None,
        **common,
    )
    policies = _fixed_policies(k_max, args.threshold, max_batch)
    runs = LiveRuns(live, policies, seed=args.seed, repeats=args.live_repeats)
    if profile is None:
        from specrl.profile.measure import measure_profile

        profile = measure_profile(
            pair,
            k_max=k_max,
            reps=max(5, len(runs.todo)),
            device=args.device,
            seed=args.seed,
            preset=args.preset,
            between_rounds=runs.run_next,
        )
        profile.meta["interleaved_with"] = "specrl validate-surrogate --measure"
        profile.save(args.profile)
        print(f"wrote {args.profile} ({profile.meta['duration_s']} s, live episodes included)")
    surrogate = SurrogateSpecEnv(profile=profile, **common)
    rows = compare_runs(runs.run_all(), surrogate, policies, surrogate_seeds=args.surrogate_seeds)
    print(
        f"trace {trace.name!r}: {len(trace.requests)} requests, {trace.total_tokens} tokens; "
        f"profile {args.profile}"
    )
    print(format_comparison(rows))
    return 0


def benchmark(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import specrl  # noqa: F401  (registers the ids)

    kwargs = {"max_batch": args.max_batch}
    if args.profile:
        kwargs["profile"] = args.profile
    env = gym.make("specrl/SurrogateSpec-v0", disable_env_checker=True, **kwargs)
    k_cycle = list(range(env.action_space.n)) * 7
    env.reset(seed=0)
    steps, episodes = 0, 0
    started = time.perf_counter()
    while steps < args.steps:
        _, _, terminated, truncated, _ = env.step(k_cycle[steps % len(k_cycle)])
        steps += 1
        if terminated or truncated:
            episodes += 1
            env.reset()
    elapsed = time.perf_counter() - started
    print(
        f"{steps / elapsed:,.0f} env steps/s ({steps} steps, {episodes} episodes incl. "
        f"resets, {elapsed:.1f} s, K cycling 0..{env.action_space.n - 1}, one process)"
    )
    return 0
