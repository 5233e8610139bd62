"""``specrl decode``: build or reuse the default pair, speculate on held-out prompts, report.

The engine on its own, without a controller (``specrl demo`` is the whole pipeline). It
prints, per held-out domain, the acceptance rate, the mean accepted length and tokens/s at the
chosen K next to K=0, then one decoded continuation.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from specrl import options
from specrl.models.build import PRESETS


@dataclass
class DemoResult:
    domain: str
    k: int
    drafted: int
    accepted: int
    committed: int
    row_steps: int
    seconds: float
    k0_tokens_per_s: float

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        return self.committed / self.row_steps if self.row_steps else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.committed / self.seconds if self.seconds else 0.0


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
        type=options.int_in(0, options.K_MAX_LIMIT),
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


def _serve(pair, prompts, k, args) -> tuple[DemoResult, list[list[int]]]:
    from specrl.engine import SpecEngine

    engine = SpecEngine(
        pair.target,
        pair.draft,
        max_batch=args.batch,
        max_len=args.prompt_len + args.new_tokens + 1,
        k_max=max(k, 1),
        vocab_padding=pair.vocab_padding,
    )
    ids = [
        engine.add(p, max_new_tokens=args.new_tokens, temperature=args.temperature, seed=i)
        for i, p in enumerate(prompts)
    ]
    result = DemoResult("", k, 0, 0, 0, 0, 0.0, 0.0)
    outputs = {}
    while engine.has_work:
        stats = engine.step(k)
        result.drafted += stats.drafted
        result.accepted += stats.accepted
        result.committed += stats.committed
        result.row_steps += stats.batch_size
        result.seconds += stats.total_time
        outputs.update({f.request_id: f.token_ids for f in engine.pop_finished()})
    return result, [outputs[i] for i in ids]


def run(args: argparse.Namespace) -> int:
    import torch

    from specrl.models import load_default_pair
    from specrl.workload.prompts import token_streams

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
        spec, outputs = _serve(pair, prompts, args.k, args)
        plain, _ = _serve(pair, prompts, 0, args)
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
