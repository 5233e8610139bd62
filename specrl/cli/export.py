"""``specrl export``: a trained run's K table, for specrl or a serving stack."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from specrl import options
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.files import check_output, write_atomic
from specrl.table import PROBE_SCOPES, KTable, load_table, table_from_json
from specrl.table.stacks import FORMATS, export_file
from specrl.train.to_table import (
    BELOW_ENGINEER,
    DEFAULT_PROBE_SCOPE,
    FIDELITY_EPISODES,
    MIN_MATCH,
    MIN_RATIO,
    checked_table,
)
from specrl.train.trained import TrainedRun


def add_parser(sub: argparse._SubParsersAction) -> None:
    # Long: one declaration per option, in the order --help lists them.
    parser = sub.add_parser(
        "export",
        help="write a trained run's K table: native, or a vLLM, TensorRT-LLM or SGLang schedule",
        description="Tabulate a `specrl train` run's policy by batch size and acceptance "
        "(native format, see the README), check on held-out surrogate seeds that the table "
        "acts as the policy does, and write it in specrl's own format, or, for a serving "
        "stack, the best schedule its format can express (vLLM's "
        "num_speculative_tokens_per_batch_size, TensorRT-LLM's draft_len_schedule, SGLang's "
        "--speculative-adaptive-config), searched in the surrogate (docs/stacks.md).",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="RUN_DIR", help="a finished `specrl train` run")
    src.add_argument("--table", metavar="TABLE.json", help="an exported native table, to convert")
    parser.add_argument("--out", metavar="FILE.json", required=True)
    parser.add_argument("--format", choices=FORMATS, default="native")
    parser.add_argument(
        "--acceptance",
        type=options.probability,
        default=None,
        help="the operating acceptance: where vllm/trtllm collapse the table and where the "
        "native table's probe looks (scope operating); default: the policy's mean acceptance "
        "estimate over the fidelity check's episodes (played for it even with --no-check); "
        "with --table, the table's recorded one",
    )
    parser.add_argument(
        "--context-len",
        type=options.positive_int,
        default=None,
        help="trtllm, sglang: the context bin to export (a table with context bins)",
    )
    parser.add_argument(
        "--k-max", type=options.K_MAX, default=None, help="refuse a run trained with another k_max"
    )
    parser.add_argument(
        "--episodes",
        type=options.positive_int,
        default=None,
        help=f"fidelity check episodes per workload (default {FIDELITY_EPISODES})",
    )
    parser.add_argument(
        "--no-check", action="store_true", help="skip the fidelity check (not recommended)"
    )
    parser.add_argument(
        "--monotone",
        action="store_true",
        help="make each batch size's Ks non-decreasing in the acceptance estimate, changing "
        "the cells the policy visits least (the fidelity check says what that cost)",
    )
    parser.add_argument(
        "--probe-scope",
        choices=PROBE_SCOPES,
        default=None,
        help="where the table's probe rule fires while K=0: at every batch size (all), only "
        "where the table has a K > 0 at some estimate (speculating), or only where it has one "
        "at or below the operating acceptance, --acceptance or the policy's mean (operating; "
        "the default)",
    )
    parser.add_argument(
        "--workload",
        default=None,
        metavar="W[,W...]",
        help="the traffic the table or schedule is searched for, presets or trace files, "
        "comma-separated (default: the run's training mix)",
    )
    parser.add_argument(
        "--search-episodes",
        type=options.positive_int,
        default=None,
        metavar="N",
        help="the search's tuning episodes per table or schedule and workload (each search "
        "confirms on as many more); default: 8 for the native table (NATIVE_EPISODES), and "
        "for a stack's schedule 8 per workload and 32 in all at least (32 for one workload)",
    )
    parser.add_argument(
        "--no-search",
        action="store_true",
        help="write the learned table as it is (native), or collapsed at the operating "
        "acceptance (vllm/trtllm/sglang), without searching the format's best",
    )
    parser.add_argument(
        "--cuda-graph-bs",
        type=_batch_sizes,
        default=None,
        metavar="B[,B...]",
        help="sglang: the deployment's CUDA-graph batch sizes (--cuda-graph-bs), which SGLang "
        "pads the batch up to (default: specrl.table.sglang.SGLANG_CUDA_GRAPH_BS)",
    )
    parser.add_argument(
        "--force", action="store_true", help="write the table even if the fidelity check fails"
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=run)


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected batch sizes >= 1, comma-separated (1,2,4,8,16), got {text!r}"
        )
    return sizes


RUN_ONLY = {
    "k_max": "--k-max",
    "workload": "--workload",
    "search_episodes": "--search-episodes",
    "no_search": "--no-search",
    "episodes": "--episodes",
    "no_check": "--no-check",
    "monotone": "--monotone",
    "probe_scope": "--probe-scope",
    "force": "--force",
}
"""Options that act on tabulating a run (``--run``); a ``--table`` is only converted."""


def run(args: argparse.Namespace) -> int:
    from specrl.policies.engineer import shared_episodes
    from specrl.policies.episode_pool import parallel_episodes

    # The engineer's tuning and the search on every core; the search's episodes are shared
    # with the check against the engineer that follows it.
    with parallel_episodes(), shared_episodes():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    acceptance = args.acceptance
    check_output(args.out, "--out")  # before the fidelity check, not after it
    if args.cuda_graph_bs is not None and args.format != "sglang":
        raise SpecrlError(
            f"--cuda-graph-bs: SGLang's CUDA-graph sizes, for --format sglang, not {args.format}"
        )
    if args.table:
        given = [
            flag for dest, flag in RUN_ONLY.items() if getattr(args, dest) not in (None, False)
        ]
        if given:
            raise SpecrlError(
                f"{', '.join(given)}: {'these act' if len(given) > 1 else 'this acts'} on "
                "tabulating a run, and --table only converts a table already written; pass "
                f"{'them' if len(given) > 1 else 'it'} with --run RUN_DIR instead"
            )
        table = load_table(args.table)
        if acceptance is None:
            acceptance = table.provenance.get("operating_acceptance")
        fidelity = None
    else:
        run = TrainedRun.load(args.run, args.k_max)  # loaded once, passed down
        table, fidelity = checked_table(
            run,
            k_max=args.k_max,
            acceptance=acceptance,
            check=not args.no_check,
            episodes=FIDELITY_EPISODES if args.episodes is None else args.episodes,
            monotone=args.monotone,
            progress=not args.no_progress,
            probe_scope=args.probe_scope or DEFAULT_PROBE_SCOPE,
        )
        acceptance = table.provenance["operating_acceptance"]
        changed = table.provenance.get("monotone_cells_changed")
        if changed is not None:
            cells = table.max_batch * (len(table.acceptance_edges) - 1) * table.n_context
            print(f"monotone in acceptance: {changed} of {cells} cells changed from the policy's K")
        if fidelity is not None:
            print(fidelity.format())
        if fidelity is not None and not fidelity.passed and not args.force:
            raise SpecrlError(
                f"the table does not reproduce {args.run}'s policy (match {fidelity.match:.2%},"
                f" tokens/s ratio {fidelity.ratio:.4f}; goals {MIN_MATCH:.0%} and {MIN_RATIO});"
                " nothing written. Pass --force to write it anyway"
            )
        if args.format == "native":
            if not args.no_search:
                table = searched_native(args, run, table)
            if fidelity is not None or not args.no_search:  # not a --no-check learned table
                report_against_engineer(run, table, **_episodes(args))
    if args.format != "native" and acceptance is None:
        raise SpecrlError(
            f"--format {args.format} collapses the table over acceptance; give --acceptance A"
        )
    table = table_from_json(table.to_json(), source="the exported table")  # check it whole
    graphs = {} if args.cuda_graph_bs is None else {"cuda_graph_bs": args.cuda_graph_bs}
    if args.format != "native" and args.run and not args.no_search:
        obj = searched_file(args, run, table, acceptance, graphs)
    else:
        if args.format != "native":
            why = "--no-search" if args.run else "a --table is converted as it is"
            print(f"{args.format}: the table collapsed at acceptance {acceptance} ({why})")
        obj = export_file(
            table, fmt=args.format, acceptance=acceptance, context_len=args.context_len, **graphs
        )
    if args.format == "native":
        table.save(args.out)
    else:
        write_atomic(Path(args.out), json.dumps(obj, indent=1) + "\n")
    print(_describe(table, args.format, obj, acceptance))
    print(f"wrote {args.out}")
    return 0


def searched_native(args: argparse.Namespace, run, table: KTable) -> KTable:
    """The best native table searched from the learned ``table`` (specrl.train.table_search),
    with how it was chosen in its provenance."""
    from specrl.train.table_search import native_file, search_native

    workloads = args.workload.split(",") if args.workload else None
    result = search_native(
        run, table, workloads=workloads, progress=not args.no_progress, **_episodes(args)
    )
    print(result.describe())
    return native_file(table, result)


def _episodes(args: argparse.Namespace) -> dict:
    """The searches' ``episodes`` keyword where ``--search-episodes`` is given."""
    return {} if args.search_episodes is None else {"episodes": args.search_episodes}


def report_against_engineer(run, table: KTable, **episodes) -> None:
    """Print the table against the engineer's sweep on the tuning seeds, record it in the
    provenance (``against_engineer``), and warn where the table is below
    :data:`BELOW_ENGINEER` of it: the learned table's level depends on the training seed,
    and the searched table holds the engineer's."""
    from specrl.train.search import against_engineer

    versus = against_engineer(run, table, **episodes)
    table.provenance["against_engineer"] = versus
    print(
        f"against the engineer: the table {versus['table_tokens_per_s']:.1f} tokens/s, the "
        f"sweep tuned on seeds {versus['seeds'][0]}-{versus['seeds'][-1]} of the training mix "
        f"{versus['engineer_tokens_per_s']:.1f} ({versus['ratio']:.4f}x)"
    )
    if versus["ratio"] < BELOW_ENGINEER:
        warnings.warn(
            f"the table is below the engineer's per-bucket sweep on the tuning seeds "
            f"({versus['ratio']:.4f}x): export without --no-search (the searched table starts "
            "from the sweep and is never below it there), or train again with another --seed",
            category=SpecrlWarning,
            stacklevel=2,
        )


def searched_file(args: argparse.Namespace, run, table: KTable, acceptance: float, graphs: dict):
    """The file of the format's best schedule (:mod:`specrl.train.search`), its search
    recorded under ``specrl.chosen_by``."""
    from specrl.train.search import search_run, searched_export

    if table.context_bins is not None:
        raise SpecrlError(
            "the schedule search covers batch-only tables; this table indexes context: pass "
            "--no-search to collapse it at one context bin"
        )
    workloads = args.workload.split(",") if args.workload else None
    result = search_run(
        run,
        table,
        [args.format],
        acceptance=acceptance,
        workloads=workloads,
        progress=not args.no_progress,
        **graphs,
        **_episodes(args),
    )[args.format]
    print(result.describe())
    return searched_export(table, result, acceptance, **graphs)


def _describe(table: KTable, fmt: str, obj: dict, acceptance) -> str:
    if fmt == "native":
        lines = ["K by batch size (rows) and acceptance estimate; stale: estimate unknown"]
        edges = table.acceptance_edges
        for b, (lo, hi) in enumerate(table.batch_buckets):
            ks = table.cell(b)
            runs, start = [], 0
            for j in range(1, len(ks) + 1):
                if j == len(ks) or ks[j] != ks[start]:
                    runs.append(f"[{edges[start]:.2f},{edges[j]:.2f}): {ks[start]}")
                    start = j
            rows = f"{lo}" if lo == hi else f"{lo}-{hi}"
            lines.append(f"  B {rows}: " + ", ".join(runs) + f"; stale: {table.stale(b)}")
        return "\n".join(lines)
    how = "searched" if "chosen_by" in obj["specrl"] else f"at acceptance {acceptance}"
    return f"{fmt} {how}: " + json.dumps(obj["speculative_config"])
