"""The learned table and every export against the engineer who tunes by hand, on held-out
seeds of each workload in the surrogate.

    python experiments/engineer.py --run runs/ppo
    python experiments/engineer.py --run runs/ppo --per-workload   # exports searched per workload
    python experiments/engineer.py --run runs/ppo --headroom       # + a table per workload
    python experiments/engineer.py --run runs/ppo --worst-weight 0 # the searches' score before

Exports the run (the learned native table, with its fidelity check, and the native table
searched from it; vLLM, TensorRT-LLM and SGLang, each the best schedule of its format
searched on the tuning seeds of the run's training mix, or of the judged workload with
``--per-workload``), then per workload compares on held-out seeds: off, the engineer's
``threshold:tuned`` and ``sweep`` (tuned on that workload's tuning seeds), the sweep held to
TensorRT-LLM's format, the learned and the searched native table, the three exports and the
myopic oracle; with ``--headroom`` also a native table searched on that workload alone.
Prints tokens/s of each over the engineer (the better of ``threshold:tuned`` and ``sweep``;
for TensorRT-LLM, the better of ``threshold:tuned`` and ``sweep:trtllm``), and writes
``OUT/engineer.json``, ``OUT/engineer.md`` and the exported files.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from specrl.dataclass_cli import comma_list, optional, script_main, value
from specrl.files import write_atomic, write_json
from specrl.options import SEED, float_in, positive_int, workload_preset
from specrl.seeds import HELD_OUT_SEED

FORMATS = ("vllm", "trtllm", "sglang")


@dataclass
class Args:
    run: str = ""
    """A finished `specrl train` run (required)."""
    out: str = ""
    """Output directory; empty: RUN/engineer."""
    workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = (
        "ramp",
        "day",
        "mixed",
        "bursts",
    )
    """Workloads judged, one comparison each."""
    episodes: Annotated[int, value(positive_int)] = 4
    """Held-out episodes per workload and policy (seeds seed..seed+episodes-1)."""
    seed: Annotated[int, value(SEED)] = HELD_OUT_SEED
    """First held-out seed: apart from training (0..), its evaluation (10,000), the warm
    start (30,000), the export's visits (40,000) and the tuning seeds (50,000)."""
    per_workload: bool = False
    """Search each export on the judged workload's tuning seeds, not the training mix."""
    native_only: bool = False
    """Judge the native table alone (no stack exports searched): a quicker look at a run."""
    worst_weight: Annotated[float | None, optional(float_in(0, 1))] = None
    """The worst workload's share of the searches' score (``specrl.train.search.WORST_WEIGHT``
    when not given); 0: the geometric mean over the workloads alone, as the searches scored
    before stop 51."""
    search_episodes: Annotated[int | None, optional(positive_int)] = None
    """The stack searches' tuning episodes per schedule and workload
    (``specrl.train.search.stack_search_episodes`` when not given: 8 per workload over the
    training mix, 32 with --per-workload)."""
    native_episodes: Annotated[int | None, optional(positive_int)] = None
    """The native search's tuning (and confirmation) episodes per table and workload
    (``specrl.train.search.NATIVE_EPISODES`` when not given)."""
    judge_only: bool = False
    """Judge the files already in OUT (``learned.json``, ``table.json``, the exports) without
    exporting or searching again: a comparison that was cut short, or more episodes."""
    headroom: bool = False
    """Also search a native table on each judged workload's own tuning seeds, and judge it
    beside the oracle: how much a batch x acceptance table tuned for that traffic gains."""


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, _on_every_core, argv, __doc__, "engineer")


def _on_every_core(args: Args) -> Path:
    from specrl.policies.episode_pool import parallel_episodes

    with parallel_episodes():
        return run(args)


def _ratio(report, policy: str, reference: str) -> dict:
    return report.ratio(policy, reference) | {"reference": reference}


def export_all(run_dir: Path, out: Path, table, acceptance, workloads=None, **search) -> dict:
    """The three searched exports of ``table``, written to ``out``; their search results.
    ``search``: the searches' keywords (:func:`_search`)."""
    from specrl.train.search import search_run, searched_export

    results = search_run(
        run_dir,
        table,
        list(FORMATS),
        acceptance=acceptance,
        workloads=workloads,
        **search,
    )
    for fmt, result in results.items():
        print(result.describe())
        obj = searched_export(table, result, acceptance)
        write_atomic(out / f"{fmt}.json", json.dumps(obj, indent=1) + "\n")
    return results


def _search(args: Args, episodes: int | None) -> dict:
    """A search's ``worst_weight`` and ``episodes`` keywords, those given."""
    out = {} if args.worst_weight is None else {"worst_weight": args.worst_weight}
    if episodes is not None:
        out["episodes"] = episodes
    return out


def _native(run_dir: Path, table, path: Path, workloads=None, **search):
    """The native table searched from the learned ``table`` on ``workloads`` (default: the
    training mix), written to ``path``; the search's result."""
    from specrl.train.table_search import native_file, search_native

    result = search_native(run_dir, table, workloads=workloads, **search)
    print(result.describe())
    native_file(table, result).save(path)
    return result


def run(args: Args) -> Path:
    from specrl.config import load_config
    from specrl.errors import SpecrlError
    from specrl.train.envs import load_run_profile as _load_run_profile
    from specrl.train.to_table import checked_table

    if not args.run:
        raise SpecrlError("--run RUN_DIR is required: a finished `specrl train` run")
    start = time.perf_counter()
    run_dir = Path(args.run)
    out = Path(args.out or run_dir / "engineer")
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(run_dir)
    profile, profile_path = _load_run_profile(config)
    formats = () if args.native_only else FORMATS
    searches, native_searches = {}, {}
    if args.judge_only:
        _check_judged_files(args, out, formats)
    else:
        table, fidelity = checked_table(run_dir)
        print(fidelity.format())
        table.save(out / "learned.json")
        acceptance = table.provenance["operating_acceptance"]
        search, native = _search(args, args.search_episodes), _search(args, args.native_episodes)
        native_searches["mix"] = _native(run_dir, table, out / "table.json", **native)
    if formats and not args.per_workload and not args.judge_only:
        searches["mix"] = export_all(run_dir, out, table, acceptance, **search)
    rows, reports = [], {}
    for workload in args.workloads:
        where = out
        if formats and args.per_workload:
            where = out / workload
            if not args.judge_only:
                where.mkdir(exist_ok=True)
                searches[workload] = export_all(
                    run_dir, where, table, acceptance, [workload], **search
                )
        if args.headroom and not args.judge_only:
            native_searches[workload] = _native(
                run_dir, table, out / f"table-{workload}.json", [workload], **native
            )
        report = _judge(args, config, profile, workload, out, where, formats)
        reports[workload] = report
        rows.append(_row(report, workload, formats))
        print(f"\n{workload}, {args.episodes} held-out episode(s) from seed {args.seed}")
        print(report.format())
    text = _markdown(args, rows, formats, profile_path, run_dir)
    print("\n" + text)
    write_atomic(out / "engineer.md", text + "\n")
    write_json(
        out / "engineer.json",
        {
            "run": str(run_dir),
            "profile": str(profile_path),
            "episodes": args.episodes,
            "seed": args.seed,
            "per_workload": args.per_workload,
            "rows": rows,
            "searches": {
                k: {fmt: r.to_json() for fmt, r in v.items()} for k, v in searches.items()
            },
            "native_searches": {k: r.to_json() for k, r in native_searches.items()},
            "reports": {w: r.to_json() for w, r in reports.items()},
            "wall_s": time.perf_counter() - start,
        },
    )
    print(f"\nwrote {out}/ in {time.perf_counter() - start:.0f} s")
    return out


def _check_judged_files(args: Args, out: Path, formats) -> None:
    """With ``--judge-only``: every file the comparisons read is in ``out``, or a
    :class:`SpecrlError` naming the missing ones, before any episode."""
    from specrl.errors import SpecrlError

    needed = [out / "learned.json", out / "table.json"]
    for workload in args.workloads:
        where = out / workload if args.per_workload else out
        needed += [where / f"{fmt}.json" for fmt in formats]
        if args.headroom:
            needed.append(out / f"table-{workload}.json")
    missing = [str(p) for p in dict.fromkeys(needed) if not p.exists()]
    if missing:
        raise SpecrlError(
            f"--judge-only judges the files a finished run of this script wrote, and "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: run it "
            "without --judge-only first (same --out)"
        )


def _judge(args: Args, config, profile, workload: str, out: Path, where: Path, formats):
    """The comparison on ``workload``'s held-out seeds: off, the engineer's two tunings, the
    sweep held to TensorRT-LLM's format, the native table (in ``out``), the exports of
    ``formats`` (in ``where``) and the myopic oracle."""
    from specrl.compare import compare_policies
    from specrl.policies import make_policies
    from specrl.policies.engineer import tune_sweep_trtllm
    from specrl.train.envs import surrogate_env

    env = surrogate_env(config, profile, workload)
    specs = [
        "off",
        "threshold:tuned",
        "sweep",
        f"lookup:{out / 'learned.json'}",
        f"lookup:{out / 'table.json'}",
        *([f"lookup:{out / f'table-{workload}.json'}"] if args.headroom else []),
        *(f"schedule:{where / f'{fmt}.json'}" for fmt in formats),
        "oracle",
    ]
    policies = make_policies(specs, env=env)
    policies.insert(3, tune_sweep_trtllm(env))
    return compare_policies(
        env, policies, seed=args.seed, episodes=args.episodes, workload=workload
    )


def _row(report, workload: str, formats) -> dict:
    """One workload's ratios: the engineer over off, and the native table, each export and
    the oracle over the engineer (TensorRT-LLM's export over the engineer held to its format)."""
    eng = report.engineer.policy
    trt_eng = max(("threshold:tuned", "sweep:trtllm"), key=lambda n: report.result(n).tokens_per_s)
    row = {
        "workload": workload,
        "engineer": eng,
        "engineer_vs_off": _ratio(report, eng, "off"),
        "learned": _ratio(report, "lookup:learned.json", eng),
        "native": _ratio(report, "lookup:table.json", eng),
        "oracle": _ratio(report, "oracle", eng),
        "learned_vs_oracle": _ratio(report, "lookup:learned.json", "oracle"),
        "native_vs_oracle": _ratio(report, "lookup:table.json", "oracle"),
    }
    own = f"lookup:table-{workload}.json"
    if report.result(own) is not None:
        row["own"] = _ratio(report, own, eng)
        row["own_vs_oracle"] = _ratio(report, own, "oracle")
    for fmt in formats:
        row[fmt] = _ratio(report, f"schedule:{fmt}", trt_eng if fmt == "trtllm" else eng)
    picked = report.engineer_by_tuning
    own_trt = report.picked_by_tuning(("threshold:tuned", "sweep:trtllm"))
    if picked is not None:
        own_eng = picked.policy
        row["engineer_by_tuning"] = own_eng
        row["by_tuning"] = {
            "engineer": _ratio(report, eng, own_eng),
            "learned": _ratio(report, "lookup:learned.json", own_eng),
            "native": _ratio(report, "lookup:table.json", own_eng),
        }
        for fmt in formats:
            ref = own_trt.policy if fmt == "trtllm" and own_trt else own_eng
            row["by_tuning"][fmt] = _ratio(report, f"schedule:{fmt}", ref)
    return row


def _markdown(args: Args, rows: list[dict], formats, profile_path, run_dir: Path) -> str:
    """The summary table of ``rows``, under a line saying what was judged."""
    keys = ["learned", "native", *formats, "oracle", "learned_vs_oracle", "native_vs_oracle"]
    if "own" in rows[0]:
        keys += ["own", "own_vs_oracle"]
    names = {"native": "native table (searched)", "vllm": "vLLM export"}
    names |= {"trtllm": "TRT-LLM export", "learned": "learned table (PPO)"}
    names |= {"sglang": "SGLang export", "oracle": "myopic oracle"}
    names |= {"native_vs_oracle": "native vs oracle", "learned_vs_oracle": "learned vs oracle"}
    names |= {"own": "table searched per workload", "own_vs_oracle": "per-workload vs oracle"}
    searched = "each workload's tuning seeds" if args.per_workload else "the training mix"
    lines = [
        f"profile {profile_path}, run {run_dir}, {args.episodes} held-out episodes per workload "
        f"from seed {args.seed}"
        + (f"; exports searched on {searched}" if formats else "; the native table alone"),
        "",
        "| workload | engineer vs off | " + " | ".join(names[k] for k in keys) + " |",
        "|" + "---|" * (len(keys) + 2),
    ]
    for r in rows:
        cells = [
            f"{r[key]['ratio']:.4f} ± {r[key]['se']:.4f} ({r[key]['min']:.3f}-{r[key]['max']:.3f})"
            for key in keys
        ]
        vs_off = f"{r['engineer_vs_off']['ratio']:.3f} ({r['engineer']})"
        lines.append(f"| {r['workload']} | {vs_off} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(± the standard error of the mean per-episode log ratio; min-max: the ratio per "
        "held-out episode)",
    ]
    if all("by_tuning" in r for r in rows):
        mine = ["engineer", "learned", "native", *formats]
        names |= {"engineer": "the engineer (picked on these episodes)"}
        lines += [
            "",
            "Against the engineer who picks between the two on their own benchmark (the "
            "tuning seeds; TensorRT-LLM's held to its format):",
            "",
            "| workload | picked | " + " | ".join(names[k] for k in mine) + " |",
            "|" + "---|" * (len(mine) + 2),
        ]
        for r in rows:
            cells = [
                f"{r['by_tuning'][k]['ratio']:.4f} ± {r['by_tuning'][k]['se']:.4f}" for k in mine
            ]
            lines.append(
                f"| {r['workload']} | {r['engineer_by_tuning']} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
