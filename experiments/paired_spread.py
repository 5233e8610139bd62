"""How finely held-out surrogate episodes tell two schedules apart: the spread, episode to
episode, of one schedule's tokens/s over another's on the same seeds.

    python experiments/paired_spread.py                       # shipped profile, 16 episodes
    python experiments/paired_spread.py --profile P.json --episodes 32

Per workload, tunes the engineer's ``threshold:tuned`` and ``sweep`` on the tuning seeds (as
``specrl compare`` does), then plays on held-out seeds: the sweep, the threshold, the sweep
with every K>0 lowered by one and static K=1 and K=2. For each pair it prints the ratio of
aggregate tokens/s, the standard deviation over episodes of the per-episode log ratio, and
the standard error of the mean it gives (sd / sqrt(episodes)): a difference between two
schedules much smaller than that error is not measured by that many episodes. ``spread
alone`` is one schedule's own sd of log tokens/s over the episodes, what an unpaired
comparison would face. Writes ``OUT/paired_spread.json`` when ``--out`` is given.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np

from specrl.dataclass_cli import comma_list, script_main, value
from specrl.files import write_json
from specrl.options import SEED, positive_int, workload_preset
from specrl.results import standard_error
from specrl.seeds import HELD_OUT_SEED


@dataclass
class Args:
    profile: str = ""
    """Hardware profile; empty: the one shipped with specrl."""
    workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = (
        "ramp",
        "day",
        "mixed",
        "bursts",
    )
    """Workloads, each on its own."""
    episodes: Annotated[int, value(positive_int)] = 16
    """Held-out episodes per workload and schedule (seeds seed..seed+episodes-1)."""
    seed: Annotated[int, value(SEED)] = HELD_OUT_SEED
    """First held-out seed."""
    out: str = ""
    """Directory for paired_spread.json; empty: print only."""


def schedules(env) -> dict[str, np.ndarray]:
    """The schedules compared on ``env``: the engineer's two, tuned on the tuning seeds, the
    sweep one K lower, and static K=1 and K=2."""
    from specrl.policies.engineer import (
        Scorer,
        best_sweep,
        best_threshold,
        sweep_dense,
        threshold_dense,
        tuning_seeds,
    )

    k_max, max_batch = env.k_max, env.max_batch
    tuning = Scorer([env], tuning_seeds())
    sweep = sweep_dense(best_sweep(tuning, k_max, max_batch)[0], max_batch)
    k, b, _ = best_threshold(tuning, k_max, max_batch)
    lower = np.where(sweep > 0, np.maximum(sweep - 1, 1), 0)
    return {
        "sweep": sweep,
        "threshold:tuned": threshold_dense(k, b, max_batch),
        "sweep, K-1": lower,
        "K=1": np.full(max_batch + 1, min(1, k_max)),
        "K=2": np.full(max_batch + 1, min(2, k_max)),
    }


PAIRS = (("threshold:tuned", "sweep"), ("sweep, K-1", "sweep"), ("K=2", "K=1"))


def paired(a: list, b: list) -> dict:
    """Ratio of aggregate tokens/s of episodes ``a`` over ``b`` (same seeds, in order), and
    the spread of the per-episode log ratio."""
    from specrl.policies.engineer import geometric_rate

    rate = lambda runs: np.array([r.tokens / r.seconds for r in runs])  # noqa: E731
    se = standard_error(list(rate(a) / rate(b)))
    return {
        "ratio": geometric_rate([a]) / geometric_rate([b]),
        "sd": se * np.sqrt(len(a)),
        "se": se,
        "spread_alone": float(np.log(rate(b)).std(ddof=1)) if len(b) > 1 else 0.0,
    }


def run(args: Args) -> dict:
    from specrl.envs import SurrogateSpecEnv
    from specrl.policies.engineer import Scorer

    seeds = list(range(args.seed, args.seed + args.episodes))
    rows = {}
    print("| workload | pair | ratio | sd per episode | standard error | spread alone |")
    print("|---|---|---|---|---|---|")
    for workload in args.workloads:
        env = SurrogateSpecEnv(profile=args.profile or None, workload=workload)
        chosen = schedules(env)
        held_out = Scorer([env], seeds)
        held_out.prefetch(chosen.values())
        played = {name: held_out.play(dense)[0] for name, dense in chosen.items()}
        for a, b in PAIRS:
            row = paired(played[a], played[b])
            rows[f"{workload}: {a} / {b}"] = row
            print(
                f"| {workload} | {a} / {b} | {row['ratio']:.4f} | {row['sd']:.4f} | "
                f"{row['se']:.4f} | {row['spread_alone']:.4f} |",
                flush=True,
            )
    result = {"profile": args.profile or "shipped", "seeds": seeds, "pairs": rows}
    if args.out:
        write_json(Path(args.out) / "paired_spread.json", result)
    return result


def _on_every_core(args: Args) -> dict:
    from specrl.policies.episode_pool import parallel_episodes

    with parallel_episodes():
        return run(args)


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, _on_every_core, argv, __doc__, "paired_spread")


if __name__ == "__main__":
    sys.exit(main())
