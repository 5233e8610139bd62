"""``specrl compare``: every policy on the same traces, side by side.

For each episode seed, every policy serves the same trace in turn (a busy spell on the machine
then hits all of them alike), in the given order in even episodes and reversed in odd ones (a
drift in the machine's speed then hits all of them alike over an even number of episodes).
Per policy: aggregate tokens/s (the objective), tokens/s per batch bucket, the share of steps
at each K, and per-request time per output token (TPOT, p50 and p99), the latency a single
stream sees. With more than one episode, the table also gives the lowest and highest
per-episode ratio to the best static policy on the same trace: live, a difference inside that
range is not one a single run can tell from the machine's noise.

When the engineer's baselines ran (``threshold:tuned`` and ``sweep``, tuned in the surrogate
on seeds apart from the comparison's: :mod:`specrl.policies.engineer`), every policy is also
rated against "the engineer", the better of the two on the comparison's own episodes, and the
table says how each was tuned and, where their tuning seeds pick the other, which.

Live, against the profile the env reads, each episode also times the machine
(:mod:`specrl.profile.speed`): the table's notes give each policy's range of speeds, and say
so when one policy's episodes ran further apart than the policies' tokens/s are.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from specrl.errors import SpecrlError
from specrl.features import bucket_bounds, bucket_labels
from specrl.files import write_atomic
from specrl.results import (
    ENGINEER,
    PolicyResult,
    best_static,
    engineer,
    standard_error,
    static_results,
    summarize,
)


@dataclass
class ComparisonReport:
    env: str
    workload: str
    seed: int
    episodes: int
    results: list[PolicyResult]
    tuning: dict[str, dict] = field(default_factory=dict)
    """Per tuned policy (the engineer's), how it was tuned
    (:meth:`specrl.policies.engineer.Tuning.to_json`, plus ``"described"``)."""
    interleaved: bool = False
    """Live: whether the policies played each episode side by side
    (:func:`specrl.envs.rollout.run_interleaved`) rather than one after another."""

    @property
    def best_static(self) -> PolicyResult | None:
        """The best of off and the fixed Ks among the results (None if none ran)."""
        return best_static(self.results)

    @property
    def engineer(self) -> PolicyResult | None:
        """The better of ``threshold:tuned`` and ``sweep`` (None if neither ran)."""
        return engineer(self.results)

    @property
    def engineer_by_tuning(self) -> PolicyResult | None:
        """The engineer who picks on their own benchmark: of ``threshold:tuned`` and ``sweep``,
        the one with more tokens/s on the tuning seeds both were tuned on
        (:meth:`picked_by_tuning`). :attr:`engineer` picks on the judged episodes themselves,
        which no benchmark can: where the two differ, the judged episodes favour the schedule
        the benchmark did not pick."""
        return self.picked_by_tuning(ENGINEER)

    def picked_by_tuning(self, names) -> PolicyResult | None:
        """Of the tuned policies ``names``, the one with most tokens/s on the tuning seeds they
        were all tuned on (ties: the first); None unless each ran with its tuning recorded on
        the same seeds."""
        records = [self.tuning.get(name) for name in names]
        ran = [self.result(name) for name in names]
        if None in records or None in ran:
            return None
        if any(r["seeds"] != records[0]["seeds"] for r in records):
            return None
        return max(zip(records, ran, strict=True), key=lambda pair: pair[0]["tokens_per_s"])[1]

    def best_static_by_bucket(self) -> dict[str, str]:
        """Per batch bucket, the static policy (off or a fixed K) with the highest tokens/s
        in the steps of that bucket."""
        static = static_results(self.results)
        out = {}
        for label in self.reached_buckets():
            rated = [r for r in static if label in r.bucket_tokens_per_s]
            if rated:
                out[label] = max(rated, key=lambda r: r.bucket_tokens_per_s[label]).policy
        return out

    def reached_buckets(self) -> list[str]:
        """The buckets any policy reached, in order of batch size."""
        reached = {b for r in self.results for b in r.bucket_tokens_per_s}
        return sorted(reached, key=bucket_bounds)

    def bucket_labels(self) -> list[str]:
        """:data:`~specrl.features.BUCKET_LABELS`, then any bucket past 128 rows a policy
        reached (:func:`~specrl.features.bucket_labels`): the CSV's and wandb's keys."""
        return bucket_labels(self.reached_buckets())

    def result(self, policy: str) -> PolicyResult | None:
        return next((r for r in self.results if r.policy == policy), None)

    def paired_ratios(self, policy: str, reference: str) -> list[float]:
        """Per episode, ``policy``'s tokens/s over ``reference``'s on the same trace: how a
        ratio of the aggregates varies from trace to trace (and, live, with the machine)."""
        a, b = self.result(policy), self.result(reference)
        if a is None or b is None:
            missing = policy if a is None else reference
            raise SpecrlError(f"no policy named {missing!r} in this comparison")
        return [x / y for x, y in zip(a.episode_tokens_per_s, b.episode_tokens_per_s) if y > 0]

    def ratio(self, policy: str, reference: str) -> dict:
        """``policy``'s aggregate tokens/s over ``reference``'s (``ratio``), the standard
        error of the mean per-episode log ratio (``se``, :func:`specrl.results.
        standard_error`) and the lowest and highest per-episode ratio (``min``, ``max``)."""
        per = self.paired_ratios(policy, reference)
        return {
            "ratio": self.result(policy).tokens_per_s / self.result(reference).tokens_per_s,
            "se": standard_error(per),
            "min": min(per),
            "max": max(per),
        }

    def to_json(self) -> dict:
        best = self.best_static
        return {
            "env": self.env,
            "workload": self.workload,
            "seed": self.seed,
            "episodes": self.episodes,
            "results": [r.to_json() for r in self.results],
            "best_static": None
            if best is None
            else {"policy": best.policy, "tokens_per_s": best.tokens_per_s},
            "best_static_by_bucket": self.best_static_by_bucket(),
            "engineer": None
            if self.engineer is None
            else {"policy": self.engineer.policy, "tokens_per_s": self.engineer.tokens_per_s},
            "engineer_by_tuning": None
            if (own := self.engineer_by_tuning) is None
            else {"policy": own.policy, "tokens_per_s": own.tokens_per_s},
            "tuning": self.tuning,
            "interleaved": self.interleaved,
        }

    def format(self) -> str:
        """A Markdown table: tokens/s, ratios to best static, the engineer and off, each
        bucket, TPOT; then the best static policy overall and per bucket, naming the static
        policies it was chosen among, how the engineer's baselines were tuned (and which of
        the two their tuning seeds pick, where that is not the engineer), and the fewest
        steps any policy took in each bucket. The best static column and lines are left out
        with fewer than two static policies: one policy is no finding."""
        off, eng = self.result("off"), self.engineer
        static = [r.policy for r in static_results(self.results)]
        best = self.best_static if len(static) > 1 else None
        buckets = self.reached_buckets()
        spread = best is not None and self.episodes > 1
        head = ["policy", "tokens/s"] + (["/ best static"] if best else [])
        head += ["min-max per episode"] if spread else []
        head += ["/ engineer"] if eng else []
        head += ["min-max per episode"] if eng and self.episodes > 1 else []
        head += ["/ off"] + [f"B {b}" for b in buckets] + ["TPOT p50 ms", "TPOT p99 ms"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.results:
            cells = [r.policy, f"{r.tokens_per_s:.0f}"]
            if best:
                cells.append(f"{r.tokens_per_s / best.tokens_per_s:.3f}")
            if spread:
                ratios = self.paired_ratios(r.policy, best.policy)
                cells.append(f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-")
            if eng:
                cells.append(f"{r.tokens_per_s / eng.tokens_per_s:.3f}")
                if self.episodes > 1:
                    ratios = self.paired_ratios(r.policy, eng.policy)
                    cells.append(f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-")
            cells.append(f"{r.tokens_per_s / off.tokens_per_s:.3f}" if off else "-")
            cells += [
                f"{r.bucket_tokens_per_s[b]:.0f}" if b in r.bucket_tokens_per_s else "-"
                for b in buckets
            ]
            cells += [f"{r.tpot_p50_s * 1e3:.1f}", f"{r.tpot_p99_s * 1e3:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
        notes = []
        if best:
            among = ", ".join(static)
            notes.append(
                f"best static policy, among {among}: {best.policy} "
                f"({best.tokens_per_s:.0f} tokens/s)"
            )
            notes.append(
                f"best static policy per bucket, among {among}: "
                + ", ".join(
                    f"B {label}: {name}" for label, name in self.best_static_by_bucket().items()
                )
            )
        if eng:
            ran = [name for name in ENGINEER if self.result(name)]
            better = f", the better of {' and '.join(ran)}" if len(ran) > 1 else ""
            notes.append(f"the engineer: {eng.policy} ({eng.tokens_per_s:.0f} tokens/s){better}")
            own = self.engineer_by_tuning
            if own is not None and own.policy != eng.policy:
                notes.append(
                    f"on its tuning seeds the benchmark picks {own.policy}, "
                    f"{own.tokens_per_s / eng.tokens_per_s:.4f}x the engineer here: "
                    "the engineer's pick between the two is made on these episodes"
                )
        for name, tuning in self.tuning.items():
            notes.append(f"{name}: {tuning['described']}")
        if note := self.speed_note():
            notes.append(note)
        if any(r.bucket_steps for r in self.results):
            fewest = {
                b: min(r.bucket_steps.get(b, 0) for r in self.results) / self.episodes
                for b in buckets
            }
            notes.append(
                "fewest steps per episode in a bucket, over the policies: "
                + ", ".join(f"B {b}: {n:.1f}" for b, n in fewest.items())
            )
        return "\n".join(lines + ([""] + notes if notes else []))

    def speed_note(self) -> str | None:
        """Live, with each episode's machine speed: each policy's range, the widest spread
        within one policy's episodes, and whether that spread exceeds how far apart the
        policies' tokens/s are (then these episodes do not tell the policies apart). Played
        side by side, the spread that counts is between the policies within one episode (a
        drift between episodes meets them all): the widest, against the same. None without
        speeds."""
        from specrl.profile.speed import speed_spread

        timed = [r for r in self.results if r.episode_speed]
        if not timed:
            return None

        def span(speeds: list[float]) -> str:
            finite = [x for x in speeds if math.isfinite(x)]
            if not finite:
                return "-"
            lo, hi = min(finite), max(finite)
            return f"{lo:.2f}" if len(finite) == 1 else f"{lo:.2f}-{hi:.2f}"

        across = max(speed_spread(r.episode_speed) for r in timed)
        rates = [r.tokens_per_s for r in self.results if r.tokens_per_s > 0]
        between = max(rates) / min(rates) - 1.0 if rates else 0.0
        note = (
            "machine speed per episode, decode time over the profile's (1.00: the profile's "
            "speed; higher: slower): "
            + ", ".join(f"{r.policy} {span(r.episode_speed)}" for r in timed)
            + f"; one policy's episodes up to {across:.0%} apart"
        )
        if not self.interleaved:
            within = across
            why = (
                "the machine, not the policies, moved these episodes; compare on a steadier "
                "machine or with more episodes"
            )
        else:
            n = min(len(r.episode_speed) for r in timed)
            within = max(speed_spread([r.episode_speed[i] for r in timed]) for i in range(n))
            note += f"; side by side, the policies in one episode up to {within:.1%} apart"
            why = (
                "the machine, or the profile's error where their K differ, moved them apart; "
                "compare with more episodes"
            )
        if len(self.results) > 1 and within > between:
            note += f", more than the policies' tokens/s differ ({between:.1%}): {why}"
        return note

    def write_csv(self, path: str | Path) -> None:
        """One row per policy: tokens/s, TPOT, then ``bucket/<label>`` and ``k_share/<K>``."""
        buckets = self.bucket_labels()
        ks = sorted({k for r in self.results for k in r.k_share}, key=int)
        out = io.StringIO(newline="")
        writer = csv.writer(out)
        writer.writerow(
            ["policy", "tokens_per_s", "tpot_p50_s", "tpot_p99_s"]
            + [f"bucket/{b}" for b in buckets]
            + [f"k_share/{k}" for k in ks]
        )
        for r in self.results:
            writer.writerow(
                [r.policy, r.tokens_per_s, r.tpot_p50_s, r.tpot_p99_s]
                + [r.bucket_tokens_per_s.get(b, "") for b in buckets]
                + [r.k_share.get(k, 0.0) for k in ks]
            )
        write_atomic(path, out.getvalue())


def compare_policies(
    env,
    policies: list,
    *,
    seed: int = 0,
    episodes: int = 4,
    env_name: str = "",
    workload: str = "",
    progress: bool = True,
    warmup_steps: int = 0,
    speed_profile=None,
    interleave: bool = False,
) -> ComparisonReport:
    """Run every policy (objects with ``predict`` and ``name``) for ``episodes`` episodes of
    ``env``; episode ``i`` is reset with ``seed + i`` for every policy, so a preset workload
    serves each policy the same trace. The policies play each episode in turn, in the order
    given and then reversed (:func:`specrl.envs.rollout.round_order`). ``warmup_steps`` steps
    of the first episode (played by the last policy) are played and discarded first
    (:func:`specrl.envs.rollout.warm_up`). With ``speed_profile`` (a
    :class:`~specrl.profile.Profile`; live, the one the env reads), each result also holds
    each episode's machine speed against it (:func:`specrl.profile.speed.episode_speed`).

    Live, with ``interleave``, the policies play each episode side by side instead, each on
    an env of its own (``env.sibling()``), stepping in turn by the time each has served
    (:func:`specrl.envs.rollout.run_interleaved`): a drift in the machine's speed then meets
    every policy alike, not only on average over an even number of rounds."""
    from tqdm.auto import tqdm

    from specrl.envs import SurrogateSpecEnv
    from specrl.envs.rollout import round_order, run_episode, run_interleaved, warm_up
    from specrl.policies.episode_pool import play_policies

    if episodes < 1:
        raise SpecrlError(f"--episodes must be >= 1, got {episodes}")
    for p in policies:
        if not isinstance(getattr(p, "name", None), str) or not p.name:
            raise SpecrlError(
                f"a {type(p).__name__} policy has no name; set self.name, the short label "
                "result tables and wandb runs use"
            )
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise SpecrlError(f"policies repeat a name: {names}; list each policy once")
    evaluated = set(range(seed, seed + episodes))
    for p in policies:
        tuned_on = set(getattr(getattr(p, "tuning", None), "seeds", ()))
        if tuned_on & evaluated:
            raise SpecrlError(
                f"{p.name} was tuned on seeds {sorted(tuned_on)}, and this comparison plays "
                f"seeds {seed}..{seed + episodes - 1}: a tuned baseline is judged on seeds it "
                "has not seen; pick another --seed"
            )
    live = not isinstance(getattr(env, "unwrapped", env), SurrogateSpecEnv)
    if interleave and (not live or not hasattr(env, "sibling")):
        raise SpecrlError(
            "interleave plays the policies side by side on a live env's siblings; pass the "
            "LiveSpecEnv itself (not a wrapper, not a surrogate env, whose times do not drift)"
        )
    warm_up(env, policies[-1], seed=seed, steps=warmup_steps)
    runs: dict[str, list] = {p.name: [] for p in policies}
    with tqdm(total=episodes * len(policies), desc="compare", disable=not progress) as bar:
        if not live:
            # Timed by the profile, not the clock: the episodes are independent and are
            # played together (on every core inside parallel_episodes).
            tasks = [(env, p, seed + i) for i in range(episodes) for p in round_order(policies, i)]
            for (_, policy, _), run in zip(tasks, play_policies(tasks), strict=True):
                runs[policy.name].append(run)
            bar.update(len(tasks))
        elif interleave:
            siblings = [env.sibling() for _ in policies[1:]]
            envs = dict(zip(names, [env, *siblings], strict=True))
            try:
                for i in range(episodes):
                    order = round_order(policies, i)  # who steps first on a tie
                    bar.set_postfix_str(f"side by side, seed {seed + i}")
                    played = run_interleaved([envs[p.name] for p in order], order, seed=seed + i)
                    for policy, run in zip(order, played, strict=True):
                        runs[policy.name].append(run)
                    bar.update(len(policies))
            finally:
                for sibling in siblings:
                    sibling.close()
        else:  # live: one at a time, in turn
            for i in range(episodes):
                for policy in round_order(policies, i):
                    bar.set_postfix_str(f"{policy.name} seed {seed + i}")
                    runs[policy.name].append(run_episode(env, policy, seed=seed + i))
                    bar.update()
    k_max = env.unwrapped.k_max
    results = [summarize(p.name, runs[p.name], k_max) for p in policies]
    if speed_profile is not None:
        _time_machine(results, speed_profile, env.unwrapped)
    tuning = {
        p.name: {**p.tuning.to_json(), "described": p.tuning.describe()}
        for p in policies
        if getattr(p, "tuning", None) is not None
    }
    return ComparisonReport(env_name, workload, seed, episodes, results, tuning, interleave)


def _time_machine(results: list[PolicyResult], profile, env) -> None:
    """Fill each result's ``episode_speed`` against ``profile`` at ``env``'s sizes."""
    from specrl.profile.costs import StepCosts
    from specrl.profile.speed import episode_speed

    if profile.k_max < env.k_max:
        raise SpecrlError(
            f"speed_profile: its k_max is {profile.k_max}, below the env's {env.k_max}; "
            "pass the profile the env reads"
        )
    costs = StepCosts(profile, max_batch=env.max_batch, max_len=env.max_len, k_max=env.k_max)
    for r in results:
        r.episode_speed = [episode_speed(e, costs) for e in r.episodes]


def compare_surrogate(
    profile,
    workloads,
    specs: list[str],
    *,
    episodes: int = 3,
    seed: int = 0,
    k_max: int = 4,
    max_batch: int = 128,
    max_len: int = 384,
    n_requests: int | None = None,
    progress: bool = True,
    acceptance_estimate: str | None = None,
) -> list[ComparisonReport]:
    """One :func:`compare_policies` report per workload preset, in the surrogate on
    ``profile``, every policy named in ``specs`` (see :func:`specrl.policies.make_policy`).
    ``acceptance_estimate``: the envs' observation acceptance; None: the one the ``lookup:``
    tables and ``ppo:`` runs in ``specs`` were trained on
    (:func:`~specrl.policies.registry.trained_estimate`)."""
    from specrl.envs import SurrogateSpecEnv
    from specrl.policies import make_policies
    from specrl.policies.registry import trained_estimate

    if acceptance_estimate is None:
        acceptance_estimate = trained_estimate(specs)

    kwargs = {"peak": max_batch} | ({"n_requests": n_requests} if n_requests else {})
    reports = []
    for workload in workloads:
        env = SurrogateSpecEnv(
            profile=profile,
            workload=workload,
            workload_kwargs=kwargs,
            k_max=k_max,
            max_batch=max_batch,
            max_len=max_len,
            acceptance_estimate=acceptance_estimate,
        )
        policies = make_policies(specs, env=env)
        reports.append(
            compare_policies(
                env,
                policies,
                seed=seed,
                episodes=episodes,
                env_name="surrogate",
                workload=str(workload),
                progress=progress,
            )
        )
    return reports
