"""How much any controller could gain over the engineer who tunes by hand: the myopic
oracle, the oracle + engineer and two lookahead oracles in the surrogate, beside (``--run``)
a run's native table.

    python experiments/headroom.py                            # shipped profile, 8 episodes
    python experiments/headroom.py --run runs/ppo --episodes 16 --workloads ramp,bursts
    python experiments/headroom.py --no-lookahead             # the quick oracles alone

The oracle + engineer (:class:`OracleAndEngineer`) is the myopic oracle with the engineer's
K in the batch buckets (one at a time, or a range from one up) where that beats it on tuning
seeds: the oracle switches K step by step and leaves out of its rate the draft's catch-up a
switch costs.

Both lookahead oracles try every K at each step on forks of the surrogate (:func:`fork`),
each K followed by the myopic oracle, and take the K whose fork first commits the tokens
the myopic oracle's own fork commits in ``horizon`` steps. The workloads' tokens are fixed
(every request is served), so the episode's tokens/s is highest where its tokens take the
least time: the time to a common number of tokens is the objective, where a rate over a
fixed number of steps would favour the K whose steps happen to hold a cheap admission.
They weigh what K now does to later steps (the draft's catch-up after an off step, which
requests finish and are admitted together), which the myopic oracle ignores.

* ``planning``: each of ``samples`` forks draws fresh acceptance draws and step-time noise
  (one draw shared by every K tried, so the Ks are compared on the same luck) and times
  its steps at their median; it knows each request's true acceptance level now and ahead,
  as the myopic oracle knows it now, but not which draft tokens will be accepted. Above any
  serving controller in what it knows; its sampled choice is noisy where Ks are close.
* ``clairvoyant``: the forks carry the episode's own draws (common random numbers, see
  ``SurrogateSpecEnv._draw_requests``): it sees which draft tokens will be accepted and how
  long each step will take. No controller can; this is the loose upper bound.

Both are rollout policies, not proven optima. The headroom is the best of the oracles but
the clairvoyant one over the engineer. Prints per workload the ratios over the engineer
(the better of ``threshold:tuned`` and ``sweep``) with their standard error over episodes,
and with ``--run`` the share of the headroom the native table takes; writes
``OUT/headroom.json`` and ``OUT/headroom.md``.
"""

from __future__ import annotations

import copy
import sys
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Annotated

import numpy as np

from specrl.dataclass_cli import comma_list, script_main, value
from specrl.files import write_atomic, write_json
from specrl.options import SEED, positive_int, workload_preset
from specrl.policies.base import KPolicy
from specrl.seeds import HELD_OUT_SEED


@dataclass
class Args:
    out: str = ""
    """Output directory; empty: RUN/headroom with --run, else runs/headroom__{unix time}."""
    run: str = ""
    """A `specrl train` run: the env is the run's (its profile, sizes and observation) and
    its searched native table is judged beside the oracles; empty: the shipped (or
    --profile) profile's env and no table."""
    table: str = ""
    """The native table judged with --run; empty: RUN/engineer/table.json (written by
    experiments/engineer.py)."""
    profile: str = ""
    """Hardware profile JSON without --run; empty: the one shipped with specrl."""
    workloads: Annotated[tuple[str, ...], comma_list(workload_preset)] = (
        "ramp",
        "day",
        "mixed",
        "bursts",
    )
    """Workloads, one comparison each."""
    episodes: Annotated[int, value(positive_int)] = 8
    """Held-out episodes per workload and policy (seeds seed..seed+episodes-1)."""
    seed: Annotated[int, value(SEED)] = HELD_OUT_SEED
    """First held-out seed (apart from the tuning seeds)."""
    horizon: Annotated[int, value(positive_int)] = 8
    """Steps the myopic oracle's fork plays; every fork then plays until it has committed
    the tokens that fork did."""
    samples: Annotated[int, value(positive_int)] = 8
    """The planning oracle's forks per K, each with fresh draws."""
    lookahead: bool = True
    """Play the two lookahead oracles (the slow part: about 2 minutes a ramp episode); off:
    the myopic oracle and the oracle + engineer alone."""


ROW_STATE = ("_ctx", "_left", "_group", "_level", "_index", "_generated", "_lag")
"""The surrogate's per-row arrays: copied into a fork (its tables and trace are shared)."""


def fork(env, rng: np.random.Generator | None = None, uniform: np.ndarray | None = None):
    """A copy of the surrogate ``env`` (unwrapped, mid-episode) that steps on its own: the
    rows, queue, clock and acceptance tracker copied, the tables and the trace shared.

    ``rng`` None: the fork keeps the episode's draws (each position's acceptance uniform and
    the step-time noise to come), so it plays exactly what the env would under the same Ks.
    Otherwise the fork draws them afresh from ``rng`` (the acceptance uniforms first, unless
    ``uniform`` holds them already, drawn so); each request's level path is kept.
    The fork's observation carries no per-request acceptance estimate (nothing reads it)."""
    sim = copy.copy(env)
    for name in ROW_STATE:
        setattr(sim, name, getattr(env, name).copy())
    sim._waiting = deque(env._waiting)
    sim._driver = copy.copy(env._driver)
    sim._tracker = copy.deepcopy(env._tracker)
    sim._awaiting_first = deque(env._awaiting_first)
    sim._first_token_s = dict(env._first_token_s)
    sim.request_tpot_s = []
    sim._requests = None
    if rng is None:
        sim._time_rng = copy.deepcopy(env._time_rng)
    else:
        sim._uniform = rng.random(env._uniform.shape) if uniform is None else uniform
        sim._time_rng = rng
        sim._sigma = np.zeros_like(env._sigma)  # the steps' median seconds
    return sim


def rollout(sim, k: int):
    """Play K=``k``, then the myopic oracle, on ``sim`` until its episode ends: per step the
    tokens committed, the seconds taken and whether the episode ended there."""
    action = k
    while True:
        _, _, terminated, truncated, info = sim.step(action)
        ended = terminated or truncated
        yield info["committed"], info["step_time_s"], ended
        if ended:
            return
        action = sim.oracle_k()


def rollout_tokens(sim, k: int, horizon: int) -> int:
    """The tokens :func:`rollout` commits in ``horizon`` steps at most (fewer where the
    episode ends)."""
    return sum(got for got, _, _ in islice(rollout(sim, k), horizon))


def rollout_seconds(sim, k: int, tokens: int, max_steps: int) -> float:
    """The serving seconds :func:`rollout` takes to commit ``tokens`` tokens, the last
    step's counted in proportion to the tokens it needed; where the episode ends first, its
    seconds; past ``max_steps`` steps, the rest charged at the rollout's own rate."""
    if tokens <= 0:
        return 0.0
    done, seconds = 0, 0.0
    for got, took, ended in islice(rollout(sim, k), max_steps):
        if done + got >= tokens:
            return seconds + took * (tokens - done) / got
        done, seconds = done + got, seconds + took
        if ended:
            return seconds
    return seconds * tokens / done if done else float("inf")


class LookaheadOracle(KPolicy):
    """Per step, the K whose forks of the surrogate take the least time to commit what the
    myopic oracle's fork commits in ``horizon`` steps, summed over ``samples`` forks per K
    (see the module): ``clairvoyant`` forks carry the episode's draws, the others draw
    their own.

    :param env: the :class:`~specrl.envs.SurrogateSpecEnv` it acts in, possibly wrapped (its
        state is read, as :class:`~specrl.policies.Oracle` reads it).
    """

    def __init__(self, env, *, horizon: int = 8, clairvoyant: bool = False, samples: int = 8):
        self.env = env.unwrapped
        self.horizon, self.clairvoyant = horizon, clairvoyant
        self.samples = 1 if clairvoyant else samples
        self.name = "clairvoyant lookahead" if clairvoyant else "planning lookahead"
        self._seeds = np.random.default_rng(0)

    def _forks(self, seed: int | None):
        """Forks of the env, one per call of the function returned: each with the episode's
        own draws (``seed`` None) or all with the same fresh ones from ``seed`` (the
        acceptance uniforms drawn once and shared, read-only)."""
        env = self.env
        if seed is None:
            return lambda: fork(env)
        rng = np.random.default_rng(seed)
        uniform = rng.random(env._uniform.shape)
        return lambda: fork(env, copy.deepcopy(rng), uniform)

    def _act(self, rows, starts):
        env = self.env
        if starts[0]:
            # The forks' draws follow from the episode's own, so a seed replays exactly.
            self._seeds = np.random.default_rng(int(env._uniform[0, 0] * 2**53))
        if env.running_rows == 0 and not env._waiting:
            return [0]
        base = env.oracle_k()
        seconds = np.zeros(env.k_max + 1)
        for _ in range(self.samples):
            seed = None if self.clairvoyant else int(self._seeds.integers(2**63))
            sim = self._forks(seed)
            goal = rollout_tokens(sim(), base, self.horizon)
            for k in range(env.k_max + 1):
                seconds[k] += rollout_seconds(sim(), k, goal, 4 * self.horizon)
        return [int(np.argmin(seconds))]


class OracleAndEngineer(KPolicy):
    """The myopic oracle, but in the batch buckets of ``buckets`` (labels of
    :data:`specrl.features.BUCKET_LABELS`, by the rows the coming step decodes) the
    ``engineer``'s schedule chooses: where a steady K beats the oracle's step-by-step choice
    (its switches pay the draft's catch-up, which it leaves out of its rate)."""

    def __init__(self, env, engineer, buckets=()):
        self.env, self.engineer = env.unwrapped, engineer
        self.buckets = frozenset(buckets)
        self.name = "oracle + engineer"

    def labels(self) -> list[str]:
        """The engineer's buckets, from one row up."""
        from specrl.features import BUCKET_LABELS

        return [label for label in BUCKET_LABELS if label in self.buckets]

    def _act(self, rows, starts):
        from specrl.features import batch_bucket

        if batch_bucket(self.env._batch_ahead()) in self.buckets:
            return self.engineer._act(rows, starts)
        return [self.env.oracle_k()]


TUNE_EPISODES = 4
"""Tuning episodes of :func:`tune_oracle_and_engineer` (seeds from ``TUNE_SEED``)."""


def tune_oracle_and_engineer(env, engineer) -> OracleAndEngineer:
    """The batch buckets where the engineer chooses, grown greedily on :data:`TUNE_EPISODES`
    tuning seeds of ``env``'s workload: each round adds the one bucket, or the range of
    buckets from one up, that raises tokens/s most, until none raises it. Ranges are tried
    because a steady K over several buckets can gain where no one bucket does: the engineer
    in one bucket moves the oracle's switches to its edges, where each still pays the
    catch-up. The buckets it took are on ``.buckets``, how they were chosen on ``.tuning``
    (so a comparison refuses to judge it on its tuning seeds, as it refuses the engineer's)."""
    from specrl.features import BUCKET_LABELS
    from specrl.policies.engineer import (
        Scorer,
        Tuning,
        geometric_rate,
        tuning_env,
        tuning_seeds,
    )

    start = time.perf_counter()
    surrogate = tuning_env(env)
    scorer = Scorer([surrogate], tuning_seeds(TUNE_EPISODES))
    scores: dict[str, float] = {}

    def rate(buckets: frozenset[str]) -> float:
        name = ", ".join(OracleAndEngineer(env, engineer, buckets).labels()) or "none"
        if name not in scores:  # a set recurs (the last bucket is its own range): play it once
            policy_for = lambda e: OracleAndEngineer(e, engineer, buckets)  # noqa: E731
            scores[name] = geometric_rate(scorer.play_policy(policy_for))
        return scores[name]

    buckets: frozenset[str] = frozenset()
    best = rate(buckets)
    while True:
        trials = [
            trial
            for i, label in enumerate(BUCKET_LABELS)
            for trial in (buckets | {label}, buckets | set(BUCKET_LABELS[i:]))
            if trial != buckets
        ]
        if not trials:
            break
        top = max(trials, key=rate)  # the first of equals: from one row up
        if rate(top) <= best:
            break
        buckets, best = top, rate(top)
    policy = OracleAndEngineer(env, engineer, buckets)
    policy.tuning = Tuning.played(
        "oracle + engineer",
        f"the {engineer.name} in buckets {', '.join(policy.labels()) or 'none'}",
        scorer,
        start,
        tokens_per_s=best,
        scores=scores,
    )
    return policy


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, _on_every_core, argv, __doc__, "headroom")


def _on_every_core(args: Args) -> Path:
    from specrl.policies.episode_pool import parallel_episodes

    with parallel_episodes():
        return run(args)


def _env(args: Args, workload: str):
    """The env judged and the native table's spec (None without --run)."""
    from specrl.envs import SurrogateSpecEnv

    if args.run:
        from specrl.config import load_config
        from specrl.errors import SpecrlError
        from specrl.train.envs import load_run_profile, surrogate_env

        table = Path(args.table or Path(args.run) / "engineer" / "table.json")
        if not table.is_file():
            raise SpecrlError(
                f"{table} is missing: run `python experiments/engineer.py --run {args.run} "
                "--native-only` first (it writes the searched native table)"
            )
        config = load_config(Path(args.run))
        profile, _ = load_run_profile(config)
        return surrogate_env(config, profile, workload), f"lookup:{table}"
    env = SurrogateSpecEnv(
        profile=args.profile or None, workload=workload, workload_kwargs={"peak": 128}
    )
    return env, None


ORACLES = ("oracle", "oracle + engineer", "planning lookahead", "clairvoyant lookahead")
"""The oracles judged; the headroom is the best of all but the clairvoyant one."""
MIN_SHARED_HEADROOM = 0.001
"""The share of the headroom the native table takes is given only where the headroom is at
least this (0.1%): a share of less is its ratio's noise over a near-zero figure."""


def run(args: Args) -> Path:
    from specrl.compare import compare_policies
    from specrl.policies import make_policies

    start = time.perf_counter()
    out = Path(
        args.out
        or (Path(args.run) / "headroom" if args.run else f"runs/headroom__{int(time.time())}")
    )
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workload in args.workloads:
        env, table = _env(args, workload)
        specs = ["off", "threshold:tuned", "sweep", *([table] if table else []), "oracle"]
        policies = make_policies(specs, env=env)
        engineer = max(policies[1:3], key=lambda p: p.tuning.tokens_per_s)
        hybrid = tune_oracle_and_engineer(env, engineer)
        policies.append(hybrid)
        if args.lookahead:
            policies += [
                LookaheadOracle(env, horizon=args.horizon, samples=args.samples),
                LookaheadOracle(env, horizon=args.horizon, clairvoyant=True),
            ]
        report = compare_policies(
            env, policies, seed=args.seed, episodes=args.episodes, workload=workload
        )
        print(f"\n{workload}, {args.episodes} held-out episode(s) from seed {args.seed}")
        print(report.format())
        eng = report.engineer.policy
        row = {"workload": workload, "engineer": eng, "engineer_vs_off": report.ratio(eng, "off")}
        row |= {name: report.ratio(name, eng) for name in ORACLES if report.result(name)}
        row["oracle_engineer"] = {"engineer": engineer.name, "buckets": hybrid.labels()}
        row["headroom"] = max(row[name]["ratio"] for name in ORACLES[:3] if name in row) - 1
        if table:
            name = policies[3].name
            row["native"] = report.ratio(name, eng)
            row["native_share"] = native_share(row["native"]["ratio"], row["headroom"])
        rows.append(row)
    text = _markdown(args, rows)
    print("\n" + text)
    write_atomic(out / "headroom.md", text + "\n")
    write_json(
        out / "headroom.json",
        {
            "run": args.run,
            "profile": args.profile,
            "episodes": args.episodes,
            "seed": args.seed,
            "horizon": args.horizon,
            "samples": args.samples,
            "lookahead": args.lookahead,
            "rows": rows,
            "wall_s": time.perf_counter() - start,
        },
    )
    print(f"\nwrote {out}/ in {time.perf_counter() - start:.0f} s")
    return out


def native_share(ratio: float, headroom: float) -> float | None:
    """The share of ``headroom`` (over the engineer, 0.01: 1%) that a table reading ``ratio``
    of the engineer takes; None where the headroom is under :data:`MIN_SHARED_HEADROOM`."""
    return (ratio - 1) / headroom if headroom >= MIN_SHARED_HEADROOM else None


def _cell(r: dict) -> str:
    return f"{r['ratio']:.4f} ± {r['se']:.4f}"


def _markdown(args: Args, rows: list[dict]) -> str:
    where = f"run {args.run}" if args.run else f"profile {args.profile or 'shipped'}"
    native = "native" in rows[0]
    oracles = [name for name in ORACLES if name in rows[0]]
    header = ["workload", "engineer vs off", *oracles, "headroom"]
    header += ["native table", "share taken"] if native else []
    lines = [
        f"{where}, {args.episodes} held-out episodes per workload from seed {args.seed}"
        + (
            f", lookahead {args.horizon} steps, planning samples {args.samples}"
            if args.lookahead
            else ""
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for r in rows:
        cells = [
            f"{r['engineer_vs_off']['ratio']:.3f} ({r['engineer']})",
            *(_cell(r[name]) for name in oracles),
            f"{r['headroom']:+.2%}",
        ]
        if native:
            share = r["native_share"]
            cells += [_cell(r["native"]), "-" if share is None else f"{share:.0%}"]
        lines.append(f"| {r['workload']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(tokens/s over the engineer, ± the standard error of the mean per-episode log ratio; "
        "headroom: the best oracle but the clairvoyant one over the engineer; oracle + "
        "engineer: the engineer's K in the buckets "
        + "; ".join(
            f"{r['workload']} {', '.join(r['oracle_engineer']['buckets']) or 'none'}" for r in rows
        )
        + ")",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
