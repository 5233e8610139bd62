"""``specrl decode``: build or reuse the default pair, speculate on held-out prompts, report.

It prints, per held-out domain, the acceptance rate, the mean accepted length and tokens/s at
the chosen K next to K=0, then one decoded continuation.
"""

from __future__ import annotations

import argparse

from specrl import options
from specrl.models.build import PRESETS
from specrl.workload.prompts import token_streams


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "decode",
        help="build/reuse the default pair and run a short speculative generation",
        description="Build (or reuse) the default model pair, decode held-out prompts with "
        "speculative decoding and print the acceptance rate per domain.",
    )
    parser.add_argument("--preset", default="small", choices=list(PRESETS))
    parser.add_argument(
        "--k",
        type=options.int_in(0, options.K_MAX_RUN),
        default=3,
        help="draft tokens per step (default 3)",
    )
    parser.add_argument(
        "--batch", type=options.BATCH, default=4, help="concurrent requests (default 4)"
    )
    parser.add_argument("--prompt-len", type=options.positive_int, default=64)
    parser.add_argument("--new-tokens", type=options.positive_int, default=64)
    parser.add_argument("--temperature", type=options.nonnegative_float, default=0.0)
    parser.add_argument(
        "--device", type=options.device, default=None, help="default: cuda if available, else cpu"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from specrl.decode import decode
    from specrl.models import load_default_pair

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    pair = load_default_pair(args.preset, device=device)
    streams = token_streams(pair.tokenizer)
    print(
        f"pair: {pair.target_path} (target), {pair.draft_path} (draft); K={args.k}, "
        f"batch {args.batch}, {args.new_tokens} new tokens, temperature {args.temperature}"
    )
    print(
        f"{'domain':<8} {'acceptance':>10} {'mean acc. len':>13} {'tok/s K=' + str(args.k):>11} "
        f"{'tok/s K=0':>10} {'speedup':>8}"
    )
    sample = None
    for domain, stream in streams.items():
        stride = max(args.prompt_len, len(stream) // (args.batch + 1))
        prompts = [stream[i * stride : i * stride + args.prompt_len] for i in range(args.batch)]
        spec, outputs = decode(pair, prompts, args.k, **_lengths(args))
        plain, _ = decode(pair, prompts, 0, **_lengths(args))
        print(
            f"{domain:<8} {spec.acceptance_rate:>10.3f} {spec.mean_accepted_length:>13.2f} "
            f"{spec.tokens_per_s:>11.1f} {plain.tokens_per_s:>10.1f} "
            f"{spec.tokens_per_s / plain.tokens_per_s:>7.2f}x"
        )
        if sample is None:
            sample = (prompts[0], outputs[0])
    prompt, output = sample
    print("\nheld-out code prompt (tail) and its speculative continuation:")
    print(pair.tokenizer.decode(prompt[-40:]) + "\u2192" + pair.tokenizer.decode(output))
    return 0


def _lengths(args: argparse.Namespace) -> dict:
    return {"new_tokens": args.new_tokens, "temperature": args.temperature}
