"""``specrl validate-surrogate``: surrogate vs live tokens/s for baseline policies (sim-to-real)."""

from __future__ import annotations

import argparse
import math

from specrl import options
from specrl.errors import SpecrlError
from specrl.features import ACCEPTANCE_ESTIMATES
from specrl.files import check_output, write_json
from specrl.policy_names import parse_policies
from specrl.workload import load_trace, preset_trace
from specrl.workload.prompts import token_streams

SIM2REAL_POLICIES = ("off", "fixed:2", "fixed:4", "threshold:4:8", "goodput")
DRAW_SPREAD = 2.0
"""A mean gap within this many draw std (``Comparison.surrogate_draw_std``) is what one draw
of the trace's requests can show (about 95% of draws, were the surrogate right)."""
SIM2REAL_TRACES = (("mixed", 256, 128), ("steady-8", 64, 8), ("steady-64", 256, 64))
"""(preset, requests, peak): a sampled mixed day, and two steady loads at both ends of the
grid (ramp alone is mostly small batches and hides errors at the top)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    # Long: one declaration per option, in the order --help lists them.
    val = sub.add_parser(
        "validate-surrogate",
        help="compare surrogate and live tokens/s for baseline policies on three traces",
        description="Run off, K=2, K=4, a batch threshold and the goodput baseline on the same "
        "traces in the live and the surrogate env; print surrogate tokens/s / live tokens/s "
        "per policy (goal: 0.9-1.1) and the acceptance estimate each env showed the "
        "controller (mean and std over the steps, each weighted by the rows it served), "
        "with how far one draw of the trace's requests moves that mean (one draw ±: live "
        "replays one draw). The profile's freshness is checked first. With "
        "--measure, the profile is measured first, right before the live episodes, and "
        "written to --profile. The same check runs before every round of live episodes and "
        "after the last: a second surrogate column runs on the profile scaled to the speed "
        "those checks measured (speed-matched), which separates the surrogate's error from "
        "the machine's drift since the profile. --trace-seeds N pools N draws of each trace.",
    )
    val.add_argument("--profile", required=True, metavar="PROFILE.json")
    val.add_argument(
        "--measure",
        action="store_true",
        help="measure PROFILE.json now, right before the live episodes, and write it",
    )
    val.add_argument(
        "--force", action="store_true", help="accept a profile from elsewhere, or a stale one"
    )
    val.add_argument(
        "--preset",
        type=options.model_preset,
        default="small",
        help="default pair to run live (small)",
    )
    val.add_argument(
        "--device", type=options.device, default="cpu", help="cpu, cuda or cuda:N (default cpu)"
    )
    val.add_argument(
        "--threads",
        type=options.THREADS,
        default=None,
        help="torch threads (default: the profile's; with --measure, as `specrl profile` "
        "measures: one fewer than the CPU's cores, at least 1)",
    )
    val.add_argument(
        "--trace",
        action="append",
        metavar="TRACE.json",
        help="a trace to replay (repeatable); default: a mixed day (256 requests, peak 128), "
        "steady-8 (64 requests) and steady-64 (256 requests)",
    )
    val.add_argument(
        "--policies",
        default=",".join(SIM2REAL_POLICIES),
        help=f"comma list of policy names (default {','.join(SIM2REAL_POLICIES)})",
    )
    val.add_argument(
        "--surrogate-seeds",
        type=options.positive_int,
        default=20,
        help="surrogate episodes averaged per policy (default 20)",
    )
    val.add_argument(
        "--live-repeats",
        type=options.positive_int,
        default=3,
        help="live episodes per policy, taking turns (forward, then reversed; even counts "
        "cancel a drift in the machine's speed)",
    )
    val.add_argument("--seed", type=options.SEED, default=0)
    val.add_argument(
        "--trace-seeds",
        type=options.positive_int,
        default=1,
        metavar="N",
        help="draw each preset trace N times (seeds --seed .. --seed + N - 1), play "
        "--live-repeats live episodes and --surrogate-seeds surrogate episodes on each, and pool "
        "them per policy: the acceptance a trace shows is heavy-tailed from draw to draw (one "
        "slow request can hold a trace's tail alone), so one draw is a noisy yardstick",
    )
    val.add_argument(
        "--acceptance-estimate",
        choices=ACCEPTANCE_ESTIMATES,
        default=None,
        help="the observation's acceptance in both envs: the step EMA (steps) or pooled from "
        "each request's own accepted runs (requests, usable; the live env reads the profile's "
        "acceptance for them). Default: the one the lookup: tables and ppo: runs in "
        "--policies were trained on, else steps",
    )
    val.add_argument(
        "--no-speed-check",
        action="store_true",
        help="skip the freshness checks between live rounds and the speed-matched surrogate",
    )
    val.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    val.set_defaults(func=validate)


def _traces(args) -> list[list]:
    """The traces to compare on, each as its list of draws (one per trace seed)."""

    if args.trace:
        if args.trace_seeds != 1:
            raise SpecrlError(
                "--trace-seeds draws the preset traces again; a --trace file is replayed as "
                "it is: drop one of the two"
            )
        return [[load_trace(path)] for path in args.trace]
    return [
        [
            preset_trace(name, seed=args.seed + i, n_requests=n, peak=peak)
            for i in range(args.trace_seeds)
        ]
        for name, n, peak in SIM2REAL_TRACES
    ]


def validate(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from specrl.envs.rollout import odd_rounds_note
    from specrl.models.pair import load_default_pair
    from specrl.profile import load_profile, use_profile_threads

    if args.measure:
        import torch

        from specrl.profile.fingerprint import measuring_threads

        torch.set_num_threads(measuring_threads(args.device, args.threads))
    elif args.threads:
        import torch

        torch.set_num_threads(args.threads)
    specs = parse_policies(args.policies)
    if "oracle" in specs:  # it reads the surrogate's hidden rates; each policy runs live too
        from specrl.policies.oracle import LIVE_REFUSAL

        raise SpecrlError(f"{LIVE_REFUSAL}: drop it from --policies")
    from specrl.policies.registry import observation_estimate

    args.acceptance_estimate = observation_estimate(specs, args.acceptance_estimate)
    if args.measure and args.acceptance_estimate != "steps":
        raise SpecrlError(
            f"--acceptance-estimate {args.acceptance_estimate} reads the profile's acceptance "
            "as the live envs are built, before --measure would measure it: measure first "
            "(`specrl profile --out P.json`), then pass --profile P.json without --measure"
        )
    traces = _traces(args)
    profile = None
    for option, path in (("--profile", args.measure and args.profile), ("--json", args.json)):
        if path:
            check_output(path, option)  # before measuring and running, not after
    if not args.measure:
        from specrl.envs.live import refuse_prompts_profile

        profile = load_profile(args.profile)
        refuse_prompts_profile(profile, args.profile)  # before the pair loads
        use_profile_threads(profile, args.threads)  # step times hold at the profile's count
    pair = load_default_pair(args.preset, device=args.device)
    if profile is not None:
        _check_profile(args, profile, pair)
    k_max = 4 if profile is None else min(4, profile.k_max)
    setups = _live_setups(args, pair, traces, k_max, profile)
    if profile is None:
        from specrl.profile.measure import measure_profile

        profile = measure_profile(
            pair, k_max=k_max, device=args.device, seed=args.seed, preset=args.preset
        )
        profile.save(args.profile)
        print(f"wrote {args.profile} ({profile.meta['duration_s']} s)")
    rounds = args.live_repeats * args.trace_seeds
    if note := odd_rounds_note(rounds, "--live-repeats"):
        print(note)
    rows, speed = [], []
    bar = tqdm(total=len(setups) * len(specs) * rounds, desc="live episodes")
    for setup in setups:
        rows += _run_trace(args, profile, pair, specs, setup, bar, speed)
    bar.close()
    _report(args, rows, speed)
    return 0


def _check_profile(args: argparse.Namespace, profile, pair) -> None:
    """Refuse a profile from another machine or pair, or a stale one (unless --force), and
    print its freshness."""
    from specrl.profile import check_compatible, pair_fingerprint
    from specrl.profile.freshness import enforce_freshness, remeasure_command

    fp = pair_fingerprint(pair, k_max=profile.k_max, device=args.device)
    check_compatible(
        profile, fp, force=args.force, source=args.profile, remeasure=remeasure_command(pair)
    )
    report = enforce_freshness(
        profile, pair, device=args.device, force=args.force, source=args.profile
    )
    print(f"profile freshness ({report.seconds:.0f} s):\n{report.format()}")


def _live_setups(
    args: argparse.Namespace, pair, traces: list[list], k_max: int, profile=None
) -> list:
    """For each trace: (its draws, the env settings both envs share, a live env per draw).
    With a per-request ``--acceptance-estimate`` the live envs read ``profile``'s acceptance."""

    from specrl.envs import LiveSpecEnv

    streams = token_streams(pair.tokenizer)  # tokenized once, shared by every live env
    setups = []
    for draws in traces:
        max_batch = max(c for t in draws for _, c in t.load.get("schedule", [[0, 1]]))
        max_len = max(384, *(t.max_request_len for t in draws))
        common = {
            "k_max": k_max,
            "max_batch": max_batch,
            "max_len": max_len,
            "acceptance_estimate": args.acceptance_estimate,
        }
        # The reward's reference rate plays no part in tokens/s, so the live env needs no
        # profile for it; the per-request estimate reads the profile's acceptance.
        estimate = {} if args.acceptance_estimate == "steps" else {"profile": profile}
        lives = [
            LiveSpecEnv(
                pair=pair,
                device=args.device,
                reference_tokens_per_s=1.0,
                workload=t,
                streams=streams,
                **estimate,
                **common,
            )
            for t in draws
        ]
        setups.append((draws, common, lives))
    return setups


def _run_trace(args: argparse.Namespace, profile, pair, specs, setup, bar, speed: list) -> list:
    """Every policy live on one trace's draws, then in the surrogate (and, unless
    --no-speed-check, the surrogate at the speed measured between the rounds): its rows.
    Appends the trace's speed check to ``speed``."""
    from tqdm.auto import tqdm

    from specrl.envs import SurrogateSpecEnv
    from specrl.envs.sim2real import LiveRuns, compare_runs, format_comparison
    from specrl.policies.registry import make_policies
    from specrl.profile.freshness import check_freshness, speed_matched

    draws, common, lives = setup
    trace = draws[0]
    surrogates = [SurrogateSpecEnv(profile=profile, workload=t, **common) for t in draws]
    policies = make_policies(specs, env=surrogates[0])
    bar.set_postfix_str(f"trace {trace.name}")
    checks = []

    def check():
        checks.append(check_freshness(profile, pair, device=args.device))

    live_runs: dict[str, list] = {p.name: [] for p in policies}
    for i, live in enumerate(lives):
        runs = LiveRuns(
            live,
            policies,
            seed=args.seed + i,
            repeats=args.live_repeats,
            first_round=i * args.live_repeats,
        )
        for name, results in runs.run_all(
            on_episode=lambda _: bar.update(),
            before_round=None if args.no_speed_check else check,
        ).items():
            live_runs[name] += results
        live.close()  # one draw's engine caches at a time
    matched = None
    if not args.no_speed_check:
        check()  # and after the last round: the checks bracket every episode
        fast = speed_matched(profile, checks)
        matched = [SurrogateSpecEnv(profile=fast, workload=t, **common) for t in draws]
        speed.append({"trace": trace.name, **fast.meta["speed_matched"]})
    rows = compare_runs(
        live_runs, surrogates, policies, surrogate_seeds=args.surrogate_seeds, matched=matched
    )
    requests = sum(len(t.requests) for t in draws)
    tokens = sum(t.total_tokens for t in draws)
    drawn = f" over {len(draws)} draws (seeds {args.seed}-{args.seed + len(draws) - 1})"
    tqdm.write(
        f"\ntrace {trace.name!r}{drawn if len(draws) > 1 else ''}: {requests} requests, "
        f"{tokens} tokens, peak {common['max_batch']}; profile {args.profile}"
    )
    if matched is not None:
        tqdm.write(
            f"speed now / profile, median of {len(checks)} checks between the rounds: "
            + ", ".join(f"B={b} K={k} {r:.2f}" for b, k, r in speed[-1]["ratios"])
            + _prefill_speed(speed[-1]["prefill_ratio"])
        )
    tqdm.write(format_comparison(rows))
    return rows


def _report(args: argparse.Namespace, rows: list, speed: list) -> None:

    print("\n" + _in_band(rows, "ratio", "ratios within 0.9-1.1"))
    if not args.no_speed_check:
        print("speed-matched: " + _in_band(rows, "matched_ratio", "within 0.9-1.1"))
    print(acceptance_line(rows))
    if args.json:
        out = {
            "profile": str(args.profile),
            "trace_seeds": list(range(args.seed, args.seed + args.trace_seeds)),
            "policies": [r.to_json() for r in rows],
            "speed_checks": speed,
        }
        write_json(args.json, out)
        print(f"wrote {args.json}")


def acceptance_line(rows, tolerance: float = 0.05) -> str:
    """ "acceptance ... within 0.05 for N of M policy runs that drafted", and the runs outside
    it with their gap; the runs that never drafted are counted apart (nothing to compare)."""
    observed = [r for r in rows if r.observed]
    out = [r for r in observed if r.acceptance_gap > tolerance]
    line = (
        f"acceptance observation (mean and std) within {tolerance:g} for "
        f"{len(observed) - len(out)} of {len(observed)} policy runs that drafted"
    )
    if unobserved := len(rows) - len(observed):
        line += f" ({unobserved} never drafted: no observation to compare)"
    if out:
        line += "; outside: " + ", ".join(
            f"{r.trace}/{r.policy} {r.acceptance_gap:.3f}" + _in_draws(r) for r in out
        )
        drawn = [r for r in out if r.std_gap <= tolerance and r.gap_in_draws <= DRAW_SPREAD]
        if drawn:
            line += (
                f". {len(drawn)} of these {len(out)} are within {DRAW_SPREAD:g} draw std of "
                "the surrogate's mean: one draw of the trace's requests explains them, so "
                "pool more draws (--trace-seeds) before reading them as the surrogate's error"
            )
    return line


def _in_draws(r) -> str:
    """ " (mean gap 1.2 draw std)", or nothing where the draw spread was not computed."""
    ratio = r.gap_in_draws
    return "" if math.isnan(ratio) else f" (mean gap {ratio:.1f} draw std)"


def _in_band(rows, ratio: str, what: str) -> str:
    """ "N of M <what>", and the rows whose ``ratio`` attribute falls outside 0.9-1.1."""
    out = [r for r in rows if not 0.9 <= getattr(r, ratio) <= 1.1]
    line = f"{len(rows) - len(out)} of {len(rows)} {what}"
    if out:
        line += "; outside: " + ", ".join(
            f"{r.trace}/{r.policy} {getattr(r, ratio):.2f}" for r in out
        )
    return line


def _prefill_speed(ratio: float | None) -> str:
    """The speed line's prefill part: the checked admissions' median now / profile."""
    return "" if ratio is None else f"; prefill (the checks' admissions of served size) {ratio:.2f}"
