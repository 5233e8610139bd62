"""How much of the myopic oracle's headroom a batch x acceptance table can take, tuned even on
the very episodes it is judged on, and whether that survives fresh episodes.

    python experiments/table_headroom.py                    # ramp, the shipped profile, 4 min
    python experiments/table_headroom.py --workload mixed --profile P.json

1. The engineer's per-bucket sweep, tuned on the workload's tuning seeds
   (:data:`specrl.seeds.TUNE_SEED`), written as a native table (one K at every acceptance;
   probes only where a row drafts, as exported tables do).
2. In sample: on the held-out seeds themselves (``--seed``, ``--episodes``), for each small
   bucket of :data:`BUCKETS` in turn, every table that splits the bucket's rows at one
   acceptance of :data:`CUTS` into a lower K below and a higher K above (at most
   :data:`MAX_STEP` apart), and every stale K; the best is kept where it gains. This is an
   optimistic figure: the table is chosen on the episodes that judge it.
3. Out of sample: that table, the sweep and the oracle on fresh seeds (``--fresh-seed``,
   ``--fresh-episodes``), with the ratio per episode.

Prints each step; the oracle reads every request's true acceptance, which a table's
observation (the batch's acceptance estimate) does not carry; experiments/row_headroom.py
measures what each request's own accepted runs carry.

With ``--batch-only``, the same for the class of the stacks' exports (vLLM's ranges, SGLang's
keys): one K per batch bucket, at every acceptance.

1. The engineer: the better on the held-out seeds of ``threshold:tuned`` and ``sweep``,
   each tuned on the workload's tuning seeds, as ``specrl compare`` judges them.
2. In sample: from the engineer's schedule, bucket by bucket
   (:func:`specrl.train.search.search_buckets`), every K of ``0..k_max``; the best is kept
   where it gains at all, pass after pass (at most :data:`BATCH_PASSES`) until none gains.
3. Out of sample: that schedule, the engineer (the better of the two again, on the fresh
   seeds) and each ``--schedule`` file (an export of any stack), on the fresh seeds.

If even the schedule chosen on the judged episodes gains little over the engineer, no
export searched on other episodes can gain more than that on them: the class's headroom.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated

from specrl.dataclass_cli import comma_list, script_main, value
from specrl.options import SEED, positive_int, workload_preset
from specrl.seeds import HELD_OUT_SEED

BUCKETS = ((1, 1), (2, 2), (3, 4), (5, 8))
"""The buckets split by acceptance: where the oracle gains over the engineer on ramp."""
CUTS = tuple(round(0.3 + 0.1 * i, 1) for i in range(7))
"""The acceptances a bucket's rows may be split at (0.3-0.9)."""
MAX_STEP = 2
"""The higher K of a split is at most this much above the lower."""
BATCH_PASSES = 4
"""Passes over the buckets at most, with ``--batch-only``."""
FRESH_SEED = 60_000
"""Seeds no job of specrl.seeds uses."""


@dataclass
class Args:
    workload: Annotated[str, value(workload_preset)] = "ramp"
    """The workload preset judged (its peak at ``max_batch``)."""
    profile: str = ""
    """A profile JSON; empty: the shipped one."""
    max_batch: Annotated[int, value(positive_int)] = 128
    """Largest batch of the surrogate env and the tables."""
    seed: Annotated[int, value(SEED)] = HELD_OUT_SEED
    """First held-out seed: the in-sample search is judged (and chosen) on these."""
    episodes: Annotated[int, value(positive_int)] = 4
    """Held-out episodes (seeds seed..seed+episodes-1), as experiments/engineer.py judges."""
    fresh_seed: Annotated[int, value(SEED)] = FRESH_SEED
    """First of the fresh seeds the chosen table is judged on again."""
    fresh_episodes: Annotated[int, value(positive_int)] = 8
    """Fresh episodes."""
    batch_only: bool = False
    """Search the stacks' class (one K per batch bucket), not batch x acceptance tables."""
    schedule: Annotated[tuple[str, ...], comma_list(str)] = ()
    """With ``--batch-only``: stack schedule files (``specrl export --format vllm``,
    ``trtllm`` or ``sglang``) judged beside it on both sets of seeds."""


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, _on_every_core, argv, __doc__, "table_headroom")


def _on_every_core(args: Args) -> dict:
    from specrl.policies.engineer import shared_episodes
    from specrl.policies.episode_pool import parallel_episodes

    with shared_episodes(), parallel_episodes():
        return batch_only(args) if args.batch_only else run(args)


def run(args: Args) -> dict:
    from specrl.features import STALE_STEPS
    from specrl.policies import make_policy
    from specrl.policies.engineer import (
        Scorer,
        best_sweep,
        geometric_rate,
        sweep_dense,
        tuning_seeds,
    )
    from specrl.table.build import table_from_policy
    from specrl.train.search import _NO_PROVENANCE
    from specrl.train.table_search import TableGrid
    from specrl.train.to_table import ACCEPTANCE_EDGES

    env, held, fresh = _judges(args)
    k_max = env.k_max
    bucket_k, _ = best_sweep(Scorer([env], tuning_seeds()), k_max, args.max_batch)
    sweep = sweep_dense(bucket_k, args.max_batch)
    template = table_from_policy(
        lambda b, a, c: int(sweep[b]),
        k_max=k_max,
        max_batch=args.max_batch,
        acceptance_edges=list(ACCEPTANCE_EDGES),
        provenance=dict(_NO_PROVENANCE),
        probe={"after_steps": STALE_STEPS, "k": 1, "scope": "speculating"},
    )
    grid = TableGrid.constant(sweep, template)
    oracle = lambda scorer: geometric_rate(  # noqa: E731
        scorer.play_policy(lambda e: make_policy("oracle", env=e))
    )
    engineer = held.score(sweep)
    print(
        f"{args.workload}: the engineer's sweep ({_words(bucket_k)}) {engineer:.1f} tokens/s on "
        f"seeds {held.seeds[0]}-{held.seeds[-1]}; the oracle {oracle(held) / engineer:.4f}x",
        flush=True,
    )
    score, kept = engineer, []
    for lo, hi in BUCKETS:
        trials = _splits(grid, lo, hi, k_max)
        tables = {name: trial.table() for name, trial in trials.items()}
        held.prefetch_tables(list(tables.values()))
        best = max(tables, key=lambda name: held.score_table(tables[name]))
        if held.score_table(tables[best]) > score:
            grid, score = trials[best], held.score_table(tables[best])
            kept.append(f"B {lo}-{hi}: {best}")
            print(f"  in sample, B {lo}-{hi}: {best} -> {score / engineer:.4f}x", flush=True)
    table = grid.table()
    f_engineer, f_table, f_oracle = fresh.score(sweep), fresh.score_table(table), oracle(fresh)
    per_seed = [
        (t.tokens / t.seconds) / (e.tokens / e.seconds)
        for e, t in zip(fresh.play(sweep)[0], fresh.play_table(table)[0], strict=True)
    ]
    print(
        f"in sample: the table {score / engineer:.4f}x the engineer\n"
        f"fresh seeds {fresh.seeds[0]}-{fresh.seeds[-1]}: the table {f_table / f_engineer:.4f}x, "
        f"the oracle {f_oracle / f_engineer:.4f}x; per seed "
        + " ".join(f"{r:.3f}" for r in per_seed)
    )
    return {
        "in_sample": score / engineer,
        "fresh": f_table / f_engineer,
        "oracle_fresh": f_oracle / f_engineer,
        "kept": kept,
    }


def _judges(args: Args):
    """The surrogate env of ``args``' workload and profile, and its scorers on the held-out
    and on the fresh seeds: ``(env, held, fresh)``."""
    from specrl.envs import SurrogateSpecEnv
    from specrl.policies.engineer import Scorer

    env = SurrogateSpecEnv(
        workload=args.workload,
        workload_kwargs={"peak": args.max_batch},
        max_batch=args.max_batch,
        **({"profile": args.profile} if args.profile else {}),
    )
    held = Scorer([env], list(range(args.seed, args.seed + args.episodes)))
    fresh = Scorer([env], list(range(args.fresh_seed, args.fresh_seed + args.fresh_episodes)))
    return env, held, fresh


def batch_only(args: Args) -> dict:
    """The ``--batch-only`` steps (see the module)."""
    from specrl.policies.engineer import (
        Scorer,
        best_sweep,
        best_threshold,
        sweep_dense,
        threshold_dense,
        tuning_seeds,
    )
    from specrl.policies.schedule import BatchSchedule
    from specrl.train.search import search_buckets

    env, held, fresh = _judges(args)
    k_max, top = env.k_max, args.max_batch
    tuning = Scorer([env], tuning_seeds())
    k, b, _ = best_threshold(tuning, k_max, top)
    bucket_k, _ = best_sweep(tuning, k_max, top)
    engineers = {
        f"threshold:tuned (K={k} up to {b})": threshold_dense(k, b, top),
        f"sweep ({_words(bucket_k)})": sweep_dense(bucket_k, top),
    }
    files = {
        path: BatchSchedule.from_file(path, max_batch=top, k_max=k_max).table[:, 0].copy()
        for path in args.schedule
    }
    held.prefetch([*engineers.values(), *files.values()])
    name = max(engineers, key=lambda n: held.score(engineers[n]))
    engineer = held.score(engineers[name])
    print(
        f"{args.workload}: the engineer is {name}, {engineer:.1f} tokens/s on seeds "
        f"{held.seeds[0]}-{held.seeds[-1]}",
        flush=True,
    )
    dense, score, kept = engineers[name].copy(), engineer, []
    for _ in range(BATCH_PASSES):
        changed = False
        for lo, hi in search_buckets(top):
            trials = []
            for k in range(k_max + 1):
                trial = dense.copy()
                trial[lo : hi + 1] = k
                if not (trial == dense).all():
                    trials.append(trial)
            held.prefetch(trials)
            best = max(trials, key=held.score)
            if held.score(best) > score:
                dense, score, changed = best, held.score(best), True
                kept.append(f"B {lo}-{hi}: K={int(best[lo])}")
                print(f"  in sample, B {lo}-{hi}: K={int(best[lo])} -> {score / engineer:.4f}x")
        if not changed:
            break
    fresh.prefetch([dense, *engineers.values(), *files.values()])
    f_engineer = max(fresh.score(d) for d in engineers.values())
    ratios = {
        "searched in sample": (score / engineer, fresh.score(dense) / f_engineer),
        **{
            path: (held.score(d) / engineer, fresh.score(d) / f_engineer)
            for path, d in files.items()
        },
    }
    print(
        f"over the engineer, on seeds {held.seeds[0]}-{held.seeds[-1]} and on fresh seeds "
        f"{fresh.seeds[0]}-{fresh.seeds[-1]}:"
    )
    for label, (inside, outside) in ratios.items():
        print(f"  {label}: {inside:.4f}x, {outside:.4f}x")
    return {
        "engineer": name,
        "schedule": [int(x) for x in dense],
        "kept": kept,
        "ratios": {label: list(r) for label, r in ratios.items()},
    }


def _splits(grid, lo: int, hi: int, k_max: int) -> dict:
    """Every split of rows ``lo..hi`` at one of :data:`CUTS`, and every stale K, by name."""
    out = {}
    for cut in CUTS:
        at = int(round(cut * (grid.k.shape[1])))
        for low in range(k_max + 1):
            for high in range(low, min(k_max, low + MAX_STEP) + 1):
                trial = grid.copy()
                trial.k[lo : hi + 1, :at], trial.k[lo : hi + 1, at:] = low, high
                if not trial.same(grid):
                    out[f"K={low} below {cut}, K={high} above"] = trial
    for stale in range(k_max + 1):
        trial = grid.copy()
        trial.stale[lo : hi + 1] = stale
        if not trial.same(grid):
            out[f"stale K={stale}"] = trial
    return out


def _words(bucket_k: dict) -> str:
    return ", ".join(f"{lo}-{hi}: {k}" for (lo, hi), k in bucket_k.items())


if __name__ == "__main__":
    sys.exit(main())
