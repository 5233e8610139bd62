"""``specrl workload``: write a seeded, replayable trace, from a preset or a prompts file."""

from __future__ import annotations

import argparse

from specrl import options
from specrl.errors import SpecrlError
from specrl.workload.presets import PRESETS, is_preset, preset_trace
from specrl.workload.user_prompts import load_prompts, prompts_trace


def _preset(name: str) -> str:
    """argparse type: a preset name (``steady-N`` for any N >= 1)."""

    if not is_preset(name):
        raise argparse.ArgumentTypeError(
            f"unknown preset {name!r}; choose one of {', '.join(PRESETS)} (steady-N for any N)"
        )
    return name


def add_parser(sub: argparse._SubParsersAction) -> None:

    parser = sub.add_parser(
        "workload",
        help="write a replayable workload trace (JSON)",
        description="Draw a seeded workload trace from a preset and write it as JSON; replay "
        "it with `specrl validate-surrogate --trace` or as an env's workload. With --prompts, "
        "the requests are your prompts (domain, temperature, top_p, max_new_tokens from the "
        "file, prompt lengths in tokens of --tokenizer) and the preset gives the load pattern "
        "and the output lengths the file leaves out.",
    )
    parser.add_argument(
        "--preset",
        type=_preset,
        default="ramp",
        help=f"one of {', '.join(PRESETS)}; steady-N for any N (default: ramp)",
    )
    parser.add_argument("--seed", type=options.SEED, default=0)
    parser.add_argument(
        "--n-requests",
        type=options.N_REQUESTS,
        default=None,
        help=f"requests, 1..{options.N_REQUESTS_MAX:,} (default: the preset's; with --prompts, "
        "one per prompt, cycled when more)",
    )
    parser.add_argument(
        "--peak",
        type=options.BATCH,
        default=64,
        help=f"largest concurrency, 1..{options.MAX_BATCH_LIMIT} (default 64)",
    )
    parser.add_argument(
        "--prompts", metavar="PROMPTS.jsonl", help="build the requests from this prompts file"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="ID_OR_DIR",
        help="with --prompts: the target's tokenizer (a Hugging Face id or a model directory)",
    )
    parser.add_argument("--out", required=True, metavar="TRACE.json")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    if args.prompts:
        from specrl.models.pair import load_tokenizer

        if not args.tokenizer:
            raise SpecrlError(
                "--prompts needs --tokenizer (the target model's id or directory) to count "
                "prompt tokens"
            )
        prompts = load_prompts(args.prompts)
        trace = prompts_trace(
            prompts,
            load_tokenizer(args.tokenizer),
            preset=args.preset,
            seed=args.seed,
            n_requests=args.n_requests,
            peak=args.peak,
        )
    elif args.tokenizer:
        raise SpecrlError("--tokenizer goes with --prompts; a preset trace needs no tokenizer")
    else:
        trace = preset_trace(
            args.preset, seed=args.seed, n_requests=args.n_requests, peak=args.peak
        )
    trace.save(args.out)
    mix = ", ".join(f"{d} {w:.2f}" for d, w in trace.domains.items())
    print(
        f"wrote {args.out}: {len(trace.requests)} requests, {trace.total_tokens} tokens, "
        f"load {trace.load['kind']}, domains {mix}"
    )
    return 0
