"""``specrl profile``: measure this machine, or show a measured profile's table.

The pair is the default one (``--preset``) or any two Hugging Face causal LMs that share a
vocabulary (``--target`` and ``--draft``: Hub ids or local directories); acceptance is
measured on the held-out corpus or on your own prompts (``--prompts P.jsonl``, the format in
:mod:`specrl.workload.user_prompts`). ``--device`` is checked before anything loads.
"""

from __future__ import annotations

import argparse

from specrl import options
from specrl.errors import SpecrlError
from specrl.files import check_output
from specrl.workload.user_prompts import load_prompts


def add_parser(sub: argparse._SubParsersAction) -> None:
    # Long: one declaration per option, in the order --help lists them.
    parser = sub.add_parser(
        "profile",
        help="measure step times and acceptance on this machine (a hardware profile)",
        description="Measure verify/draft/catch-up times by batch size, K and context, and "
        "per-domain per-position acceptance, with the real engine; write them as JSON. "
        "The pair is the default one (--preset) or any Hugging Face target and draft that "
        "share a vocabulary (--target, --draft); acceptance is measured on the held-out "
        "corpus or on your own prompts (--prompts, JSON Lines). "
        "With --show, print the tokens/s table of an existing profile.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", metavar="PROFILE.json", help="measure and write here")
    what.add_argument("--show", metavar="PROFILE.json", help="print a profile's table")
    what.add_argument(
        "--check",
        metavar="PROFILE.json",
        help="rebuild the profile's shortest level (every batch size at its shortest context) "
        "and time it now by its own procedure (about a minute at --reps 5); print batch 1, 8 "
        "and 64 beside its figures with the median and "
        "largest |now / profile - 1|; exit 1 when a cell is outside its tolerance (3 times its "
        "measured spread, 5-15%%)",
    )
    parser.add_argument(
        "--all-cells",
        action="store_true",
        help="with --check: compare every batch size of the grid up to 64, not only 1, 8 and 64",
    )
    parser.add_argument(
        "--preset",
        type=options.model_preset,
        default=None,
        help="default pair to measure (small); not with --target",
    )
    parser.add_argument(
        "--target", metavar="ID_OR_DIR", help="target model: a Hugging Face id or a directory"
    )
    parser.add_argument(
        "--draft", metavar="ID_OR_DIR", help="draft model sharing the target's vocabulary"
    )
    parser.add_argument(
        "--prompts",
        metavar="PROMPTS.jsonl",
        help="measure acceptance on these prompts, JSON Lines: one object per line with "
        '"prompt" and optional "domain", "temperature", "top_p", "max_new_tokens"',
    )
    parser.add_argument(
        "--acceptance-rows",
        type=options.positive_int,
        default=None,
        help="requests decoded per domain and temperature band (default 384; with --prompts, "
        "sampled bands cycle through their prompts to reach it, greedy ones decode each once)",
    )
    parser.add_argument(
        "--acceptance-from",
        metavar="PROFILE.json",
        help="take acceptance from this profile of the same weights (measured on any machine "
        "of the same device kind) and measure only the step times: a few minutes faster",
    )
    parser.add_argument(
        "--device", type=options.device, default="cpu", help="cpu, cuda or cuda:N (default cpu)"
    )
    parser.add_argument(
        "--threads",
        type=options.THREADS,
        default=None,
        help=f"torch threads, 1..{options.THREADS_MAX} (default on a CPU: one fewer than its "
        "cores, at least 1; on a GPU, torch's own choice; with --check, the profile's)",
    )
    parser.add_argument(
        "--k-max",
        type=options.K_MAX,
        default=4,
        help=f"largest K timed, 1..{options.K_MAX_RUN} (default 4)",
    )
    parser.add_argument(
        "--batch-sizes", type=options.positive_ints, default=[1, 2, 4, 8, 16, 32, 64, 128]
    )
    parser.add_argument(
        "--contexts",
        type=options.positive_ints,
        default=[16, 128, 256],
        help="prompt lengths of the timing cells (tokens)",
    )
    parser.add_argument(
        "--reps",
        type=options.positive_int,
        default=5,
        help="repetitions per K and cell, >= 1 (default 5)",
    )
    parser.add_argument(
        "--seed",
        type=options.SEED,
        default=None,
        help="seed of the timing cells' rows and the acceptance requests (default 0)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specrl.profile.measure import format_table
    from specrl.profile.schema import load_profile

    if args.all_cells and not args.check:
        raise SpecrlError("--all-cells goes with --check PROFILE.json")
    if args.acceptance_from and not args.out:
        raise SpecrlError("--acceptance-from goes with --out PROFILE.json (a measurement)")
    if args.check and args.seed is not None:
        raise SpecrlError(
            "--seed does not go with --check: the check rebuilds the profile's cells from the "
            "seed the profile was measured with"
        )
    if args.check:
        return _check(args)
    if args.show:
        profile = load_profile(args.show)
    else:
        import torch

        from specrl.profile.fingerprint import measuring_threads

        torch.set_num_threads(measuring_threads(args.device, args.threads))
        from specrl.profile.acceptance import ACCEPTANCE_ROWS
        from specrl.profile.measure import measure_profile

        prompts = load_prompts(args.prompts) if args.prompts else None
        source = load_profile(args.acceptance_from) if args.acceptance_from else None
        check_output(args.out, "--out")  # before measuring, not after it
        pair = _load_pair(args)
        profile = measure_profile(
            pair,
            k_max=args.k_max,
            batch_sizes=args.batch_sizes,
            contexts=args.contexts,
            reps=args.reps,
            device=args.device,
            seed=args.seed or 0,
            acceptance_rows=args.acceptance_rows or ACCEPTANCE_ROWS,
            preset=None if args.target else _preset(args),
            prompts=prompts,
            acceptance_from=source,
            acceptance_source=args.acceptance_from,
        )
        profile.save(args.out)
        print(f"wrote {args.out} ({profile.meta['duration_s']} s)")
    fp = profile.fingerprint
    source = profile.meta.get("prompts", {}).get("file", "the held-out corpus")
    print(f"target {fp.get('target_id')}, draft {fp.get('draft_id')}; acceptance on {source}")
    print(
        f"committed tokens/s on {fp.get('device')}, context {profile.contexts[0]:.0f}, "
        f"prompts from all domains (bold: best K)"
    )
    print(format_table(profile))
    print("acceptance by position (conditional):")
    for d, by_band in profile.acceptance.items():
        rates = ", ".join(f"{b} " + "/".join(f"{a:.2f}" for a in r) for b, r in by_band.items())
        print(f"  {d}: {rates}")
    return 0


def _preset(args: argparse.Namespace) -> str:
    return args.preset or "small"


def _load_pair(args: argparse.Namespace):
    """The default pair of ``--preset``, or ``--target`` with ``--draft``; ``--device`` is
    checked before either loads."""
    from specrl.models.pair import load_default_pair, load_pair

    if bool(args.target) != bool(args.draft):
        raise SpecrlError("give --target and --draft together (or neither, for the default pair)")
    if args.target and args.preset:
        raise SpecrlError("give --preset (a default pair) or --target and --draft, not both")
    if args.target:
        return load_pair(args.target, args.draft, device=args.device)
    return load_default_pair(_preset(args), device=args.device)


def _check_pair(args: argparse.Namespace, profile, source: str):
    """The pair to time ``profile`` with: ``--preset`` or ``--target``/``--draft`` where
    given, else the pair the profile names (its preset, or the target and draft as they were
    given to ``specrl profile``). Returns ``(pair, the command that re-measures it)``."""
    from specrl.models.pair import load_default_pair, load_pair
    from specrl.profile.freshness import profile_prompts, remeasure_command

    if args.target or args.draft or args.preset:
        pair = _load_pair(args)
    elif preset := profile.meta.get("preset"):
        pair = load_default_pair(preset, device=args.device)
    else:
        fp = profile.fingerprint
        target, draft = fp.get("target_id"), fp.get("draft_id")
        if not (target and draft):
            raise SpecrlError(
                f"{source} names no default preset and no target/draft; pass the pair it was "
                "measured on: --target ID_OR_DIR --draft ID_OR_DIR"
            )
        try:
            pair = load_pair(target, draft, device=args.device)
        except SpecrlError as err:
            raise SpecrlError(
                f"{err}. {source} was measured on target {target}, draft {draft}; where they "
                "are elsewhere now, pass --target and --draft"
            ) from None
    return pair, remeasure_command(pair, profile_prompts(profile))


def _check(args: argparse.Namespace) -> int:
    from specrl.profile.fingerprint import (
        check_compatible,
        other_weights,
        pair_fingerprint,
        use_profile_threads,
    )
    from specrl.profile.freshness import all_cell_batches, check_freshness
    from specrl.profile.schema import load_profile

    profile = load_profile(args.check)
    measured_with = profile.fingerprint.get("threads")
    if args.threads and measured_with and args.threads != measured_with:
        # Step times hold only at the thread count they were measured with.
        raise SpecrlError(
            f"{args.check} was measured with {measured_with} torch thread(s); --threads "
            f"{args.threads} would time something else: drop --threads (the check runs at "
            f"{measured_with}) or measure a profile at {args.threads} with `specrl profile "
            f"--threads {args.threads} --out PROFILE.json`"
        )
    threads = use_profile_threads(profile, args.threads)
    pair, remeasure = _check_pair(args, profile, args.check)
    here = pair_fingerprint(pair, k_max=profile.k_max, device=args.device)
    theirs = profile.fingerprint
    if not theirs.get("target_sha256"):
        raise SpecrlError(
            f"{args.check} records no weights hash for its target (a synthetic profile?); "
            "there is no pair to time it against"
        )
    other = other_weights(theirs, here)
    if other:
        # Timing another pair says nothing about this profile.
        raise SpecrlError(
            f"{args.check} was measured on another {' and '.join(other)} (target "
            f"{theirs.get('target_id')}, draft {theirs.get('draft_id')}; loaded here: "
            f"{here['target_id']}, {here['draft_id']}, whose weights differ); check it with "
            "the pair it was measured on: --target ID_OR_DIR --draft ID_OR_DIR, or --preset"
        )
    if theirs.get("device") != here["device"]:
        print(
            f"{args.check} was measured on {theirs.get('device')}; this is {here['device']}: "
            "the ratios below compare the two machines"
        )
    # Same weights; the device is reported above, so only versions and threads may warn.
    check_compatible(profile, {**here, "device": theirs.get("device")}, source=args.check)
    batches = all_cell_batches(profile) if args.all_cells else None
    report = check_freshness(profile, pair, device=args.device, batches=batches)
    print(
        f"{args.check} (measured {profile.meta.get('created', '?')} on "
        f"{theirs.get('device')}), timed now with {threads} torch thread(s) in "
        f"{report.seconds:.1f} s:"
    )
    print(report.format())
    print(report.summary())
    if report.fresh:
        print("fresh: every cell within its tolerance")
        return 0
    print(report.message(args.check, remeasure))
    return 1
