"""``specrl models ...`` subcommands: ``build`` and ``info``."""

from __future__ import annotations

import argparse
import json
import time

from specrl import options
from specrl.errors import SpecrlError
from specrl.models.build import PRESETS


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("models", help="build and inspect the draft/target model pair")
    parser.set_defaults(func=lambda args: parser.print_help())
    models_sub = parser.add_subparsers(dest="models_command", metavar="SUBCOMMAND")

    build = models_sub.add_parser(
        "build",
        help="build the offline stdlib pair (or verify and reuse the shipped/cached one)",
    )
    _add_preset(build)
    build.add_argument("--out", help="pair directory (default: $SPECRL_HOME/pairs/PRESET)")
    build.add_argument("--seed", type=options.SEED, default=0, help="training seed (default: 0)")
    build.add_argument(
        "--retrain", action="store_true", help="train from scratch even if a valid pair exists"
    )
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    build.set_defaults(func=_build)

    info = models_sub.add_parser("info", help="measure the pair: sizes, costs, agreement")
    _add_preset(info)
    info.add_argument("--target", help="target directory or Hub id (default: the preset's)")
    info.add_argument("--draft", help="draft directory or Hub id (default: the preset's)")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_info)


def _add_preset(parser: argparse.ArgumentParser) -> None:
    # Checked by get_preset, not argparse choices, so a bad name is one line, not usage + error.
    parser.add_argument(
        "--preset", default="small", help=f"one of: {', '.join(PRESETS)} (default: small)"
    )


def _build(args: argparse.Namespace) -> int:
    from specrl.models.build import build_pair, get_preset

    get_preset(args.preset)
    start = time.perf_counter()
    paths = build_pair(
        args.preset, args.out, seed=args.seed, force=args.retrain, progress=not args.quiet
    )
    print(f"target: {paths.target_path}")
    print(f"draft:  {paths.draft_path}")
    print(f"ready in {time.perf_counter() - start:.1f} s")
    return 0


def _info(args: argparse.Namespace) -> int:
    from specrl.models.build import build_pair, get_preset
    from specrl.models.pair import load_pair
    from specrl.models.quality import measure

    get_preset(args.preset)
    if (args.target is None) != (args.draft is None):
        raise SpecrlError("give both --target and --draft, or neither to use the preset's pair")
    if args.target is None:
        paths = build_pair(args.preset, progress=not args.json)
        target, draft, preset = paths.target_path, paths.draft_path, args.preset
    else:
        target, draft, preset = args.target, args.draft, None
    pair = load_pair(target, draft)
    report = {"preset": preset, "target_path": pair.target_path, "draft_path": pair.draft_path}
    report.update(measure(pair))
    if args.json:
        print(json.dumps(report))
        return 0
    agreement = report["agreement"]
    lines = [
        f"target: {report['target_path']} ({report['target_params']:,} parameters)",
        f"draft:  {report['draft_path']} ({report['draft_params']:,} parameters)",
        f"forward at batch 1 (1 token): target {report['target_forward_ms_b1']:.2f} ms, "
        f"draft {report['draft_forward_ms_b1']:.2f} ms, "
        f"ratio draft/target {report['draft_target_time_ratio_b1']:.3f}",
        f"verify 5 tokens vs 1: batch 1 {report['verify5_vs_1_ratio_b1']:.2f}x, "
        f"batch 64 {report['verify5_vs_1_ratio_b64']:.2f}x",
        "teacher-forced greedy agreement: "
        + ", ".join(f"{domain} {value:.3f}" for domain, value in agreement.items()),
        f"distinct 4-grams of sampled target output (T=0.8): {report['distinct_4gram_ratio']:.3f}",
    ]
    print("\n".join(lines))
    return 0
