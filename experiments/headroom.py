"""How much any controller could gain over the engineer who tunes by hand: a clairvoyant
lookahead oracle in the surrogate, next to the myopic oracle and the engineer.

    python experiments/headroom.py                      # the shipped profile
    python experiments/headroom.py --profile P.json --episodes 2 --horizon 64

The lookahead oracle tries every K at each step on copies of the surrogate (its random
state copied too, so it sees the acceptance draws to come), plays each copy ``horizon``
steps on with the myopic oracle, and takes the K whose copy committed the most tokens per
second over those steps. It knows each request's true acceptance and the draws ahead, and
it weighs what K now does to later steps (the draft's catch-up, which requests finish
together): no serving controller has that much, so it stands above any of them. It is a
rollout policy, not a proven bound; where it reads below the myopic oracle, the larger of
the two is the headroom.

Prints per workload tokens/s of off, the engineer (the better of ``threshold:tuned`` and
``sweep``), the myopic and lookahead oracles, and the headroom: the best of them over the
engineer. Writes ``OUT/headroom.json`` and ``OUT/headroom.md``.
"""

from __future__ import annotations

import copy
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from args import arg, script_main

from specrl.features import AcceptanceTracker
from specrl.files import write_atomic, write_json
from specrl.options import (
    BATCH,
    N_REQUESTS_MAX,
    SEED,
    int_in,
    positive_int,
    workload_preset,
)
from specrl.workload.driver import TraceDriver


@dataclass
class Args:
    out: str = ""
    """Output directory; empty: runs/headroom__{unix time}."""
    profile: str = ""
    """Hardware profile JSON; empty: the one shipped with specrl."""
    workloads: tuple[str, ...] = arg(("ramp", "day", "mixed", "bursts"), workload_preset)
    """Workloads, one comparison each."""
    episodes: int = arg(2, positive_int)
    """Held-out episodes per workload and policy."""
    seed: int = arg(20_000, SEED)
    """First held-out seed (apart from the tuning seeds, 50,000)."""
    horizon: int = arg(32, positive_int)
    """Steps each copy plays on after the K it tries."""
    max_batch: int = arg(128, BATCH)
    """Largest batch, and the workloads' peak concurrency."""
    n_requests: int = arg(0, int_in(0, N_REQUESTS_MAX))
    """Requests per trace; 0: the preset's own."""


SHARED = (
    "profile",
    "costs",
    "trace",
    "workload",
    "_step_s",
    "_sigma",
    "_prefill_s",
    "_catchup_s",
    "_logits",
    "_levels",
    "_groups",
    "_group_index",
)
"""The surrogate's attributes a copy shares with the original: its tables and the trace."""


class LookaheadOracle:
    """Per step, the K whose copy of the surrogate commits the most tokens per second over
    the next ``horizon`` steps, the myopic oracle choosing after the first (see the module).

    :param env: the :class:`~specrl.envs.SurrogateSpecEnv` it acts in (its state is read).
    """

    def __init__(self, env, horizon: int = 32):
        self.env, self.horizon, self.name = env.unwrapped, horizon, "lookahead oracle"
        self.tokens, self.seconds = 0, 0.0

    def _clone(self):
        """A copy of the env that steps on its own: the tables and the trace shared, the
        episode's state (row arrays, queues, counters, the random generator) copied."""
        env = self.env
        sim = copy.copy(env)
        for name, value in vars(env).items():
            if name in SHARED or isinstance(value, (int, float, str, bool, type(None))):
                continue
            if isinstance(value, np.ndarray):
                if value.size <= 4096:  # a row's state; the large ones are tables
                    setattr(sim, name, value.copy())
            elif isinstance(value, (list, dict, deque)):
                setattr(sim, name, copy.copy(value))  # of numbers and tuples
            elif isinstance(value, TraceDriver):
                setattr(sim, name, copy.copy(value))  # counters over an unchanged trace
            elif isinstance(value, (AcceptanceTracker, np.random.Generator)):
                setattr(sim, name, copy.deepcopy(value))
        return sim

    def predict(self, obs, state=None, episode_start=None, deterministic=False):
        if episode_start is not None and np.any(episode_start):
            self.tokens, self.seconds = 0, 0.0
        # The episode's rate so far prices a second: a K pays where its copy commits more
        # tokens than that rate would in the seconds it takes (the ratio objective's margin).
        price = self.tokens / self.seconds if self.seconds > 0 else 0.0
        best_k, best_value, best_step = 0, -np.inf, (0, 0.0)
        for k in range(self.env.k_max + 1):
            sim = self._clone()
            tokens, seconds, action, first = 0, 0.0, k, None
            for _ in range(self.horizon):
                _, _, terminated, truncated, info = sim.step(action)
                tokens += info["committed"]
                seconds += info["step_time_s"]
                first = first or (info["committed"], info["step_time_s"])
                if terminated or truncated:
                    break
                action = sim.oracle_k()
            value = tokens - price * seconds if price > 0 else tokens / max(seconds, 1e-12)
            if value > best_value:
                best_k, best_value, best_step = k, value, first
        self.tokens += best_step[0]  # what the chosen K's first step commits (its copy's)
        self.seconds += best_step[1]
        return np.int64(best_k), state


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, run, argv, __doc__, "headroom")


def run(args: Args) -> Path:
    from specrl.compare import compare_policies
    from specrl.envs import SurrogateSpecEnv, default_profile_path
    from specrl.policies import make_policies
    from specrl.profile import load_profile

    start = time.perf_counter()
    out = Path(args.out or f"runs/headroom__{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    profile_path = args.profile or default_profile_path()
    profile = load_profile(profile_path)
    rows = []
    for workload in args.workloads:
        env = SurrogateSpecEnv(
            profile=profile,
            workload=workload,
            workload_kwargs={"peak": args.max_batch}
            | ({"n_requests": args.n_requests} if args.n_requests else {}),
            k_max=profile.k_max,
            max_batch=args.max_batch,
        )
        policies = make_policies(["off", "threshold:tuned", "sweep", "oracle"], env=env)
        policies.append(LookaheadOracle(env, args.horizon))
        report = compare_policies(
            env, policies, seed=args.seed, episodes=args.episodes, workload=workload
        )
        print(f"\n{workload}")
        print(report.format())
        eng = report.engineer
        rate = {r.policy: r.tokens_per_s for r in report.results}
        top = max(rate["oracle"], rate["lookahead oracle"])
        rows.append(
            {
                "workload": workload,
                "engineer": eng.policy,
                "tokens_per_s": rate,
                "engineer_vs_off": rate[eng.policy] / rate["off"],
                "myopic_oracle": rate["oracle"] / rate[eng.policy],
                "lookahead_oracle": rate["lookahead oracle"] / rate[eng.policy],
                "headroom": top / rate[eng.policy] - 1,
            }
        )
    lines = [
        f"profile {profile_path}, {args.episodes} held-out episodes from seed {args.seed}, "
        f"lookahead {args.horizon} steps",
        "",
        "| workload | engineer vs off | myopic oracle / engineer | lookahead oracle / engineer "
        "| headroom over the engineer |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['engineer_vs_off']:.3f} ({r['engineer']}) | "
            f"{r['myopic_oracle']:.3f} | {r['lookahead_oracle']:.3f} | {r['headroom']:+.1%} |"
        )
    text = "\n".join(lines)
    print("\n" + text)
    write_atomic(out / "headroom.md", text + "\n")
    write_json(
        out / "headroom.json",
        {
            "profile": str(profile_path),
            "episodes": args.episodes,
            "seed": args.seed,
            "horizon": args.horizon,
            "rows": rows,
            "wall_s": time.perf_counter() - start,
        },
    )
    print(f"\nwrote {out}/ in {time.perf_counter() - start:.0f} s")
    return out


if __name__ == "__main__":
    sys.exit(main())
