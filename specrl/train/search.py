"""The best batch -> K schedule each serving stack's format can express, for the traffic it
will serve.

A stack reads one K per batch size (vLLM's ranges, TensorRT-LLM's upper-bound keys,
SGLang's padded lower-bound keys); the learned table also indexes acceptance. Collapsing it
at one acceptance can lose to an engineer's hand-tuned schedule, so :func:`best_schedule`
searches the format's own class instead, judged in the surrogate:

1. **Starts**, each expressed in the format (written by its writer, read back by
   :class:`~specrl.policies.BatchSchedule` as the stack expands it): the table collapsed at
   the operating acceptance; the table collapsed per batch size at the acceptance bin its
   policy visits most there (visit-weighted); the engineer's threshold and per-bucket sweep
   (:mod:`specrl.policies.engineer`) tuned on the whole mix, for TensorRT-LLM also the sweep
   nudged to its smallest-key rule; each workload's own engineer. The engineer as
   ``specrl compare`` tunes it, held to the format, is the incumbent: of its sweep and its
   threshold, the better by the mean of the scores on the tuning seeds and on the
   confirmation seeds (:data:`specrl.seeds.CONFIRM_SEED`). Another start replaces it only
   where it scores at least :data:`MIN_MOVE_GAIN` higher on both sets, then the best such
   start by the mean of the two.
2. **Local search**: bucket by bucket (:data:`SEARCH_BATCHES`), set the whole bucket to a
   neighbouring K (one up or down, or a neighbour bucket's K) where the format allows it;
   keep the best move if it scores at least :data:`MIN_MOVE_GAIN` higher on the tuning
   seeds and gains as much on the confirmation seeds; repeat until a pass changes nothing.
3. **Smoothing**: a K that rises with batch size stays only where the rise is worth at
   least :data:`MIN_RISE_WORTH` of the score; otherwise the rise is flattened (whichever of
   lowering the higher run or raising the lower one scores better). Each start is smoothed
   so before it is scored, and should smoothing the search's result fall below the best
   start, that start is kept.

The score (:class:`VersusEngineer`) weighs a schedule's tokens/s on each workload against
that workload's own engineer, on :func:`stack_search_episodes` tuning seeds per workload from
:data:`specrl.seeds.TUNE_SEED` (each engineer tuned on the same seeds): half the worst
workload's ratio, half the geometric mean of the ratios. The result is never below the
incumbent on either set of seeds (smoothed) nor below a start that beat it on both; a start
or move that gains on the tuning seeds alone is as likely their luck as the schedule's, and
is not taken. No rise it keeps is worth less than the bar. Without confirmation seeds
(:func:`best_schedule` given none) the best start on the tuning seeds is kept and the moves
are judged there alone: the result is then never worse there than any start.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.policies.engineer import (
    TUNE_EPISODES,
    Scorer,
    best_sweep,
    best_threshold,
    best_trtllm_nudge,
    geometric_rate,
    shared_episodes,
    sweep_dense,
    threshold_dense,
    trtllm_nudges,
    tuning_seeds,
    vllm_entries,
    workload_name,
)
from specrl.policies.schedule import BatchSchedule
from specrl.seeds import CONFIRM_SEED
from specrl.table import KTable
from specrl.table.build import table_from_policy
from specrl.table.sglang import SGLANG_CUDA_GRAPH_BS, check_cuda_graph_bs, to_sglang
from specrl.table.stacks import export_file
from specrl.table.trtllm import to_trtllm
from specrl.table.vllm import to_vllm
from specrl.train.to_table import visited_cells
from specrl.train.trained import as_run

SEARCH_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
"""Upper ends of the buckets the local search sets K in (then doubling past 128): the
concurrencies an engineer benchmarks, and each one an SGLang CUDA-graph size, so a bucket
never splits a padding group."""
MIN_RISE_WORTH = 0.005
"""A K rising with batch size must be worth this share of the score, or it is smoothed."""
MAX_PASSES = 4
"""Local search passes at most (each tries every bucket once)."""
WORST_WEIGHT = 0.5
"""The worst workload's share of the score (:class:`VersusEngineer`); the geometric mean
over the workloads has the rest."""
MIN_MOVE_GAIN = 0.001
"""A move must raise the score by this share to be kept: a few seeds per workload tell
schedules apart only so finely, and a smaller gain is as likely the seeds' as the
schedule's."""
SEARCH_EPISODES = 8
"""Tuning episodes per schedule and workload in the stack schedules' search (from
:data:`specrl.seeds.TUNE_SEED`), at least: the engineer tunes on
:data:`~specrl.policies.engineer.TUNE_EPISODES`, and a schedule chosen on that few fits
their draws of acceptance and arrivals (docs/stacks.md)."""
SEARCH_TOTAL_EPISODES = 32
"""Tuning episodes per schedule over all the workloads a stack search judges, at least
(:func:`stack_search_episodes`): a search for one workload or trace plays 32 of it, one over
the training mix 8 of each. Schedules of one workload differ by tenths of a percent, less
than 8 of its episodes tell apart (docs/stacks.md)."""
NATIVE_EPISODES = SEARCH_EPISODES
"""Tuning episodes per table and workload in the native table's search, and as many again
on the confirmation seeds (:mod:`specrl.train.table_search`): the learned table and the
engineer's sweep are often level on the training mix, and on fewer episodes the search keeps
whichever the seeds' draws favour (docs/stacks.md)."""
STACK_FORMATS = ("vllm", "trtllm", "sglang")
GEOMETRIC = Scorer.objective


def stack_search_episodes(workloads: int) -> int:
    """A stack search's tuning episodes per schedule and workload over ``workloads``
    workloads: :data:`SEARCH_EPISODES`, or more where that many would play fewer than
    :data:`SEARCH_TOTAL_EPISODES` in all."""
    return max(SEARCH_EPISODES, -(-SEARCH_TOTAL_EPISODES // max(1, workloads)))


def relative_objective(worst_weight: float = WORST_WEIGHT) -> str:
    """:class:`VersusEngineer`'s score at ``worst_weight``, in words."""
    return (
        f"over each workload's engineer (tokens/s ratio): {worst_weight:g} x the worst "
        f"workload's + {1 - worst_weight:g} x the geometric mean"
    )


_NO_PROVENANCE = {
    "profile_sha256": "",
    "profile_fingerprint": {},
    "target_id": "",
    "draft_id": "",
    "run_id": "",
    "training_steps": 0,
    "specrl_version": "",
    "created": "",
}
"""The provenance of a schedule written only to be read back (never saved)."""


def search_buckets(max_batch: int) -> list[tuple[int, int]]:
    """``(lo, hi)`` buckets ending at :data:`SEARCH_BATCHES` (doubling past 128), cut at
    ``max_batch``."""
    ends = [b for b in SEARCH_BATCHES if b < max_batch]
    end = SEARCH_BATCHES[-1] * 2
    while end < max_batch:
        ends.append(end)
        end *= 2
    ends.append(max_batch)
    return [(lo + 1, hi) for lo, hi in zip([0, *ends], ends)]


class StackFormat:
    """What one stack's format can express: writing a dense schedule (K per batch size
    ``0..max_batch``) as the stack's config, reading it back as the stack expands it, and
    whether a dense schedule is expressible as it is."""

    def __init__(self, fmt: str, *, k_max: int, max_batch: int, cuda_graph_bs=None):
        if fmt not in STACK_FORMATS:
            raise SpecrlError(f"unknown stack format {fmt!r}; one of {', '.join(STACK_FORMATS)}")
        self.fmt, self.k_max, self.max_batch = fmt, k_max, max_batch
        self.cuda_graph_bs = check_cuda_graph_bs(
            SGLANG_CUDA_GRAPH_BS if cuda_graph_bs is None else cuda_graph_bs
        )

    def table(self, dense, provenance: dict | None = None):
        """``dense`` as a one-acceptance-bin :class:`~specrl.table.KTable`."""
        dense = np.asarray(dense)
        return table_from_policy(
            lambda b, a, c: int(dense[b]),
            k_max=self.k_max,
            max_batch=self.max_batch,
            acceptance_edges=[0.0, 1.0],
            provenance=dict(provenance or _NO_PROVENANCE),
        )

    def write(self, dense) -> dict:
        """The stack's config for ``dense`` (the format's writer; its warnings pass on)."""
        table = self.table(dense)
        if self.fmt == "vllm":
            return to_vllm(table, acceptance=0.5)
        if self.fmt == "trtllm":
            return to_trtllm(table, acceptance=0.5)
        return to_sglang(table, acceptance=0.5, cuda_graph_bs=self.cuda_graph_bs)

    def read(self, config) -> np.ndarray:
        """K per batch size ``0..max_batch`` as the stack expands ``config``."""
        kwargs = {"max_batch": self.max_batch, "k_max": self.k_max}
        if self.fmt == "vllm":
            schedule = BatchSchedule.from_vllm(config, **kwargs)
        elif self.fmt == "trtllm":
            schedule = BatchSchedule.from_trtllm(config, **kwargs)
        else:
            schedule = BatchSchedule.from_sglang(config, cuda_graph_bs=self.cuda_graph_bs, **kwargs)
        return schedule.table[:, 0].copy()

    def express(self, dense) -> np.ndarray | None:
        """What the stack serves when ``dense`` is written in its format (None where the
        format cannot hold it at all: TensorRT-LLM with K=0 at batch 1)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SpecrlWarning)
            try:
                return self.read(self.write(dense))
            except SpecrlError:
                return None

    def feasible(self, dense) -> bool:
        """``dense`` is expressible exactly: the stack serves it as it is."""
        served = self.express(dense)
        return served is not None and np.array_equal(served[1:], np.asarray(dense)[1:])


@dataclass
class SearchResult:
    """The schedule :func:`best_schedule` chose, and how."""

    fmt: str
    dense: np.ndarray
    config: dict
    """The stack's config (what ``speculative_config`` holds in the written file)."""
    score: float
    start: str
    """The start the search began from."""
    starts: dict[str, float]
    """Each start's score (a start the format cannot hold is left out)."""
    workloads: list[str]
    seeds: list[int]
    moves: int = 0
    """Local search moves kept."""
    rises: list[dict] = field(default_factory=list)
    """Each K that still rises with batch size: ``{"batch": first batch of the higher run,
    "from": K, "to": K, "worth": score share lost by smoothing it}``."""
    smoothed: int = 0
    """Rises flattened for being worth less than :data:`MIN_RISE_WORTH`."""
    evaluations: int = 0
    """Surrogate episodes played."""
    surrogate_s: float = 0.0
    wall_s: float = 0.0
    objective: str = GEOMETRIC
    ratios: dict[str, float] = field(default_factory=dict)
    """Per workload, the result's tokens/s over that workload's engineer (with
    :class:`VersusEngineer`; else empty)."""
    engineers: dict[str, str] = field(default_factory=dict)
    """Per workload, the engineer's method it is judged against (with :class:`VersusEngineer`)."""
    incumbent: str | None = None
    """The start kept unless another gains on both sets of seeds: the better of the
    engineer's sweep and threshold (None: no confirmation, or no start holds either)."""
    confirm_seeds: list[int] = field(default_factory=list)
    score_confirm: float | None = None
    """The result's score on the confirmation seeds (None: no confirmation)."""
    starts_confirm: dict[str, float] = field(default_factory=dict)
    """Each start's score on the confirmation seeds."""
    ratios_confirm: dict[str, float] = field(default_factory=dict)
    """Per workload, the result over that workload's engineer on the confirmation seeds."""

    def to_json(self) -> dict:
        confirmed = {}
        if self.score_confirm is not None:
            confirmed = {
                "incumbent": self.incumbent,
                "confirm_seeds": self.confirm_seeds,
                "score_confirm": self.score_confirm,
                "starts_confirm": self.starts_confirm,
                "ratios_confirm": self.ratios_confirm,
                "min_move_gain": MIN_MOVE_GAIN,
            }
        return {
            "method": "search",
            "objective": self.objective,
            "ratios": self.ratios,
            "engineers": self.engineers,
            "workloads": self.workloads,
            "seeds": self.seeds,
            "score": self.score,
            "start": self.start,
            "starts": self.starts,
            "moves": self.moves,
            "rises": self.rises,
            "smoothed": self.smoothed,
            "min_rise_worth": MIN_RISE_WORTH,
            "episodes": self.evaluations,
            "surrogate_s": round(self.surrogate_s, 1),
            "wall_s": round(self.wall_s, 1),
            **confirmed,
        }

    def describe(self) -> str:
        best_start = max(self.starts.values())
        unit = "" if self.ratios else " tokens/s"
        lines = [
            f"{self.fmt}: searched from {self.start} ({self.moves} moves kept, "
            f"{self.smoothed} rises smoothed): score {self.score:.4g}{unit}, "
            f"{self.score / best_start:.4f}x the best start; starts: "
            + ", ".join(f"{name} {s:.4g}" for name, s in self.starts.items()),
            f"  judged on seeds {self.seeds[0]}-{self.seeds[-1]} of "
            f"{', '.join(self.workloads)}: "
            + (
                f"{self.evaluations} episodes, {self.surrogate_s:,.0f} surrogate s "
                f"({self.wall_s:.0f} s wall)"
                if self.evaluations
                else "every schedule it tried was already played for an earlier format"
            ),
        ]
        if self.score_confirm is not None:
            lines.append(
                f"  confirmed on seeds {self.confirm_seeds[0]}-{self.confirm_seeds[-1]}: score "
                f"{self.score_confirm:.4g}; "
                + (
                    f"the incumbent, {self.incumbent}, gives way only to a start or move "
                    f"{MIN_MOVE_GAIN:.1%} better on both sets of seeds"
                    if self.incumbent
                    else "no start holds the engineer's schedules: the best on the tuning "
                    "seeds, "
                    f"moves {MIN_MOVE_GAIN:.1%} better on both sets"
                )
                + "; starts: "
                + ", ".join(f"{name} {s:.4g}" for name, s in self.starts_confirm.items())
            )
        if self.ratios:
            confirm = self.ratios_confirm
            lines.append(
                f"  score: {self.objective}; over each workload's engineer"
                + (" (tuning, confirmation seeds): " if confirm else ": ")
                + ", ".join(
                    f"{w} {r:.4f}"
                    + (f"/{confirm[w]:.4f}" if w in confirm else "")
                    + f" ({self.engineers[w]})"
                    for w, r in self.ratios.items()
                )
            )
        if self.rises:
            lines.append(
                f"  {len(self.rises)} rise(s) in K with batch size left: "
                + "; ".join(
                    f"at batch {r['batch']}: {r['from']} -> {r['to']}, worth {r['worth']:.2%}"
                    for r in self.rises
                )
            )
        else:
            lines.append("  K never rises with batch size")
        return "\n".join(lines)


class VersusEngineer:
    """The search's objective: a schedule's tokens/s over each workload's own engineer, on
    the tuning seeds.

    For each workload of ``scorer`` the engineer tunes ``threshold:tuned`` and ``sweep`` on
    that workload alone (the better of the two is its engineer, as in ``specrl compare``).
    A schedule's ratio on a workload is its aggregate tokens/s there over the engineer's;
    its score is ``worst_weight`` (default :data:`WORST_WEIGHT`) x the worst workload's ratio
    plus the rest x the geometric mean of the ratios. A single schedule for the whole mix
    then cannot buy a gain on most workloads with a loss on one that its own engineer would
    not take.
    Tuning the workloads' engineers plays the schedules the mix's tuning
    (:func:`engineer_starts`) plays, and each workload's own sweep besides. It has
    :class:`~specrl.policies.engineer.Scorer`'s ``score``, ``prefetch`` and counts."""

    def __init__(
        self,
        scorer: Scorer,
        *,
        k_max: int,
        max_batch: int,
        engineers: dict[str, tuple[str, np.ndarray]] | None = None,
        worst_weight: float = WORST_WEIGHT,
    ):
        if not 0.0 <= worst_weight <= 1.0:
            raise SpecrlError(f"worst_weight must be within [0, 1], got {worst_weight}")
        self.scorer, self.worst_weight = scorer, worst_weight
        if engineers is None:
            engineers = {}
            for i, name in enumerate(_labels(scorer.envs)):
                view = scorer.view(i)
                k, b, _ = best_threshold(view, k_max, max_batch)
                bucket_k, _ = best_sweep(view, k_max, max_batch)
                own = {
                    "threshold": threshold_dense(k, b, max_batch),
                    "sweep": sweep_dense(bucket_k, max_batch),
                }
                scorer.prefetch(own.values())
                method = max(own, key=lambda m: view.score(own[m]))
                engineers[name] = (method, own[method])
        self.engineers = engineers
        """Per workload, its engineer's method and schedule; given, they are judged on
        ``scorer``'s seeds as they are (the confirmation seeds of the native table's search
        judge the engineers tuned on the tuning seeds)."""
        scorer.prefetch([dense for _, dense in engineers.values()])
        self.references = [
            scorer.view(i).score(dense) for i, (_, dense) in enumerate(engineers.values())
        ]

    envs = property(lambda self: self.scorer.envs)
    seeds = property(lambda self: self.scorer.seeds)
    episodes = property(lambda self: self.scorer.episodes)
    surrogate_s = property(lambda self: self.scorer.surrogate_s)

    def prefetch(self, denses) -> None:
        self.scorer.prefetch(denses)

    def ratios(self, dense) -> list[float]:
        """Per workload, tokens/s under ``dense`` over that workload's engineer."""
        return self._relative(self.scorer.rates(dense))

    def score(self, dense) -> float:
        return self._combine(self.ratios(dense))

    def prefetch_tables(self, tables) -> None:
        self.scorer.prefetch_tables(tables)

    def play_table(self, table) -> list:
        return self.scorer.play_table(table)

    def table_ratios(self, table) -> list[float]:
        """:meth:`ratios` for a native table, served by its controller."""
        return self._relative(self.scorer.table_rates(table))

    def score_table(self, table) -> float:
        """:meth:`score` for a native table."""
        return self._combine(self.table_ratios(table))

    @property
    def objective(self) -> str:
        """The score, in words (what a search's result records)."""
        return relative_objective(self.worst_weight)

    def engineer_ratios(self, dense) -> dict[str, float]:
        """Per workload, :meth:`ratios` by name."""
        return dict(zip(self.engineers, self.ratios(dense), strict=True))

    def engineer_methods(self) -> dict[str, str]:
        """Per workload, its engineer's method."""
        return {w: m for w, (m, _) in self.engineers.items()}

    def _relative(self, rates: list[float]) -> list[float]:
        return [r / ref for r, ref in zip(rates, self.references, strict=True)]

    def _combine(self, ratios: list[float]) -> float:
        mean = float(np.exp(np.mean(np.log(ratios))))
        return self.worst_weight * min(ratios) + (1 - self.worst_weight) * mean


def own_start_name(workload: str, method: str) -> str:
    """A search start named for the workload whose engineer tuned it: ``"mixed's sweep"``,
    ``"bursts' threshold"``."""
    mark = "'" if workload.endswith("s") else "'s"
    return f"{workload}{mark} {method}"


def _labels(envs) -> list[str]:
    """Each env's workload name, numbered where two share one (two trace files of one name)."""
    names = [workload_name(env) for env in envs]
    return [
        f"{n} ({names[:i].count(n) + 1})" if names.count(n) > 1 else n for i, n in enumerate(names)
    ]


def engineer_starts(scorer: Scorer, fmt: StackFormat) -> dict[str, np.ndarray]:
    """The engineer's schedules tuned on ``scorer``'s objective, as dense schedules:
    the threshold and the sweep, and for TensorRT-LLM the sweep nudged to its smallest-key
    rule (clamped to its batch-1 K, or its batch-1 K raised to its largest)."""
    k_max, max_batch = fmt.k_max, fmt.max_batch
    k, b, _ = best_threshold(scorer, k_max, max_batch)
    bucket_k, _ = best_sweep(scorer, k_max, max_batch)
    sweep = sweep_dense(bucket_k, max_batch)
    starts = {"threshold": threshold_dense(k, b, max_batch)}
    if fmt.fmt == "trtllm":
        for name, dense in trtllm_nudges(sweep).items():
            starts[f"sweep {name}".strip()] = dense
    else:
        starts["sweep"] = sweep
    return starts


def best_schedule(
    fmt: StackFormat,
    scorer: Scorer,
    starts: dict[str, np.ndarray],
    *,
    confirm: Scorer | None = None,
    incumbent: str | list[str] | None = None,
    progress: bool = False,
) -> SearchResult:
    """Search ``fmt``'s class from ``starts`` (see the module); ``scorer`` holds the envs
    (workloads) and seeds it is judged on, ``confirm`` (optional) the same envs on the
    confirmation seeds; ``incumbent``, the start kept unless another gains on both (default:
    the best start on the tuning seeds), or several names: the best of them by the mean of
    its scores on the two sets (ties: the first)."""
    clock = time.perf_counter()
    played = _played(scorer, confirm)
    smoothed_starts = _smoothed_starts(fmt, scorer, starts)
    scores = {name: s for name, (_, s) in smoothed_starts.items()}
    again: dict[str, float] = {}
    start = max(scores, key=lambda n: scores[n])
    if confirm is not None:
        confirm.prefetch([d for d, _ in smoothed_starts.values()])
        again = {name: confirm.score(d) for name, (d, _) in smoothed_starts.items()}
        incumbent = _better(incumbent, scores, again)
        if incumbent in scores:
            start = replacing_start(incumbent, scores, again)
    floor = scores[start]
    dense, score, moves = _local_search(
        fmt, scorer, smoothed_starts[start][0].copy(), floor, progress, confirm
    )
    dense, score, smoothed, rises = _smooth(fmt, scorer, dense, score)
    below = score < floor or (confirm is not None and confirm.score(dense) < again[start])
    if below:  # smoothing what the search added fell below the start (on either set)
        dense, score = smoothed_starts[start][0].copy(), floor
        _, _, _, rises = _smooth(fmt, scorer, dense, score)
    _warn_below_off(fmt, scorer, dense, score)
    with warnings.catch_warnings():  # the file's writer warns, with the operating point
        warnings.simplefilter("ignore", SpecrlWarning)
        config = fmt.write(dense)
    served = fmt.read(config)
    if not np.array_equal(served, dense):  # the writer must hold what was scored
        raise SpecrlError(f"the {fmt.fmt} writer did not hold the searched schedule")
    cost = _played(scorer, confirm)
    confirmed = {}
    if confirm is not None:
        confirmed = {
            "incumbent": incumbent if incumbent in scores else None,
            "confirm_seeds": confirm.seeds,
            "score_confirm": confirm.score(dense),
            "starts_confirm": again,
            "ratios_confirm": confirm.engineer_ratios(dense),
        }
    return SearchResult(
        fmt=fmt.fmt,
        dense=dense,
        config=config,
        score=score,
        start=start,
        starts=scores,
        workloads=[workload_name(env) for env in scorer.envs],
        seeds=scorer.seeds,
        moves=moves,
        rises=rises,
        smoothed=smoothed,
        evaluations=cost[0] - played[0],
        surrogate_s=cost[1] - played[1],
        wall_s=time.perf_counter() - clock,
        objective=scorer.objective,
        ratios=scorer.engineer_ratios(dense),
        engineers=scorer.engineer_methods(),
        **confirmed,
    )


def _played(scorer: Scorer, confirm: Scorer | None) -> tuple[int, float]:
    """Episodes and surrogate seconds ``scorer`` and ``confirm`` have played so far."""
    episodes, seconds = scorer.episodes, scorer.surrogate_s
    if confirm is not None:
        episodes, seconds = episodes + confirm.episodes, seconds + confirm.surrogate_s
    return episodes, seconds


def _better(incumbent, scores: dict, again: dict) -> str | None:
    """``incumbent`` where it is one name; of several, those among the starts, the best by
    the mean of its two scores (ties: the first); None where none is a start."""
    if incumbent is None or isinstance(incumbent, str):
        return incumbent
    named = [name for name in incumbent if name in scores]
    return max(named, key=lambda n: scores[n] + again[n], default=None)


def gains_on_both(new, old) -> bool:
    """Whether ``new`` (scores on the tuning and on the confirmation seeds) is at least
    :data:`MIN_MOVE_GAIN` higher than ``old`` on both sets: what replacing a schedule takes."""
    return all(n >= o * (1 + MIN_MOVE_GAIN) for n, o in zip(new, old, strict=True))


def replacing_start(incumbent: str, scores: dict, again: dict) -> str:
    """The start the search begins from: ``incumbent``, unless another scores at least
    :data:`MIN_MOVE_GAIN` higher on the tuning seeds (``scores``) and on the confirmation
    seeds (``again``); then the best such start by the mean of the two."""
    qualified = [
        name
        for name in scores
        if gains_on_both((scores[name], again[name]), (scores[incumbent], again[incumbent]))
    ]
    if not qualified:
        return incumbent
    return max(qualified, key=lambda n: scores[n] + again[n])


def _smoothed_starts(fmt: StackFormat, scorer: Scorer, starts: dict) -> dict:
    """Each start as the stack serves it, smoothed (a start holds no weak rise either):
    ``{name: (dense, score)}``; the starts the format cannot write are left out."""
    expressed = {}
    for name, dense in starts.items():
        served = fmt.express(dense)
        if served is not None:
            expressed[name] = served
    if not expressed:
        raise SpecrlError(
            f"no start can be written as a {fmt.fmt} schedule: "
            + (
                "TensorRT-LLM needs K >= 1 at batch 1 (serve without speculative decoding, "
                "or export --format vllm)"
                if fmt.fmt == "trtllm"
                else "every start failed"
            )
        )
    scorer.prefetch(expressed.values())
    out = {}
    for name, d in expressed.items():
        d, s, _, _ = _smooth(fmt, scorer, d, scorer.score(d))
        out[name] = (d, s)
    return out


def _local_search(
    fmt: StackFormat, scorer: Scorer, dense, score: float, progress: bool, confirm=None
):
    """Bucket by bucket, the best feasible move worth at least :data:`MIN_MOVE_GAIN` (on the
    tuning seeds, and on ``confirm``'s when given), for up to :data:`MAX_PASSES` passes:
    ``(dense, score, moves kept)``."""
    buckets = search_buckets(fmt.max_batch)
    moves = 0
    bar = tqdm(desc=f"search {fmt.fmt}", total=MAX_PASSES * len(buckets), disable=not progress)
    for _ in range(MAX_PASSES):
        changed = False
        for i, (lo, hi) in enumerate(buckets):
            bar.update()
            best_move = None
            trials = []
            for k in _neighbour_ks(dense, buckets, i, fmt.k_max):
                trial = dense.copy()
                trial[lo : hi + 1] = k
                if not np.array_equal(trial, dense) and fmt.feasible(trial):
                    trials.append(trial)
            scorer.prefetch(trials)
            for trial in trials:
                s = scorer.score(trial)
                if s > score * (1 + MIN_MOVE_GAIN) and (best_move is None or s > best_move[0]):
                    best_move = (s, trial)
            if best_move is None:
                continue
            if confirm is not None:  # the move must hold on other episodes too
                gain = confirm.score(best_move[1]) / confirm.score(dense) - 1
                if gain < MIN_MOVE_GAIN:
                    continue
            score, dense = best_move
            moves += 1
            changed = True
        if not changed:
            break
    bar.close()
    return dense, score, moves


def _warn_below_off(fmt: StackFormat, scorer: Scorer, dense, score: float) -> None:
    """Warn where speculation off, which the format cannot express, beats its best schedule."""
    off = scorer.score(np.zeros_like(dense))
    if not fmt.feasible(np.zeros_like(dense)) and off > score:
        warnings.warn(
            f"the best {fmt.fmt} schedule found (score {score:.4g}) is below speculation off "
            f"({off:.4g}) on this traffic: TensorRT-LLM's draft_len_schedule cannot turn "
            "speculation off at batch 1 (its smallest key's K is max_draft_len >= 1); serve "
            "without speculative decoding, or export --format vllm or sglang",
            category=SpecrlWarning,
            stacklevel=3,
        )


def _neighbour_ks(dense, buckets, i: int, k_max: int) -> list[int]:
    """The Ks a move tries in bucket ``i``: one up and one down from its K at its start,
    and the K of each neighbouring bucket."""
    lo, hi = buckets[i]
    ks = {int(dense[lo]) - 1, int(dense[lo]) + 1, int(dense[hi])}
    if i > 0:
        ks.add(int(dense[buckets[i - 1][1]]))
    if i + 1 < len(buckets):
        ks.add(int(dense[buckets[i + 1][0]]))
    return sorted(k for k in ks if 0 <= k <= k_max)


def _smooth(fmt: StackFormat, scorer: Scorer, dense, score: float):
    """Flatten each rise worth less than :data:`MIN_RISE_WORTH` (see the module), the least
    worth first; returns ``(dense, score, rises smoothed, the rises left with their
    worth)``."""
    smoothed = 0
    while True:
        runs = vllm_entries(dense)
        trials = {}
        for j in range(1, len(runs)):
            if runs[j][2] <= runs[j - 1][2]:
                continue
            trials[j] = []
            for source, target in ((j, j - 1), (j - 1, j)):  # lower the higher, raise the lower
                trial = dense.copy()
                trial[runs[source][0] : runs[source][1] + 1] = runs[target][2]
                if fmt.feasible(trial):
                    trials[j].append(trial)
        scorer.prefetch([t for options in trials.values() for t in options])
        rises = []
        for j, options in trials.items():
            if not options:
                continue
            best = max(((scorer.score(t), t) for t in options), key=lambda o: o[0])
            rises.append((1 - best[0] / score, j, best))
        weak = [r for r in rises if r[0] < MIN_RISE_WORTH]
        if not weak:
            left = [
                {
                    "batch": runs[j][0],
                    "from": runs[j - 1][2],
                    "to": runs[j][2],
                    "worth": round(float(worth), 5),
                }
                for worth, j, _ in rises
            ]
            return dense, score, smoothed, left
        worth, _, (s, trial) = min(weak, key=lambda r: r[0])
        dense, score = trial, s
        smoothed += 1


# ----------------------------------------------------------------------------- from a run


def collapsed(table, acceptance: float) -> np.ndarray:
    """The native table's K per batch size ``0..max_batch`` at one acceptance."""
    column = table.acceptance_bin(acceptance)
    dense = np.zeros(table.max_batch + 1, dtype=np.int64)
    for b, (lo, hi) in enumerate(table.batch_buckets):
        dense[lo : hi + 1] = table.cell(b)[column]
    return dense


def visit_weighted(table, visits: np.ndarray, acceptance: float) -> np.ndarray:
    """Per batch size, the K the table plays most often there, weighting each acceptance
    bin by how often the policy visited it (``visits``: ``[batch, bin]`` counts, as
    :func:`specrl.train.to_table.visited_cells` returns); a batch size never visited takes the
    K at ``acceptance``."""
    dense = collapsed(table, acceptance)
    for b, (lo, hi) in enumerate(table.batch_buckets):
        ks = np.asarray(table.cell(b))
        for batch in range(lo, hi + 1):
            if visits[batch].sum() > 0:
                weight = np.bincount(ks, weights=visits[batch], minlength=table.k_max + 1)
                dense[batch] = int(np.argmax(weight))
    return dense


def search_run(
    run_dir,
    table,
    formats: list[str],
    *,
    acceptance: float,
    workloads: list[str] | None = None,
    cuda_graph_bs=None,
    progress: bool = True,
    errors: dict[str, SpecrlError] | None = None,
    worst_weight: float = WORST_WEIGHT,
    episodes: int | None = None,
) -> dict[str, SearchResult]:
    """:func:`best_schedule` for each of ``formats`` from the run's exported ``table``,
    judged on ``workloads`` (presets or trace files; default: the run's training mix) in the
    surrogate of the run's profile and sizes; the formats share their episodes (each
    schedule is played once). ``acceptance`` is the operating acceptance of the plain
    collapse. With ``errors`` given, a format that cannot hold any start (TensorRT-LLM for a
    table that never drafts at batch 1) is recorded there instead of raised.
    ``worst_weight``: the score's weight on the worst workload (:class:`VersusEngineer`);
    ``episodes``: tuning episodes per schedule and workload (None:
    :func:`stack_search_episodes`), and as many again on the confirmation seeds; the
    incumbent is the better of :func:`engineer_incumbents`. Its scorers share their episodes
    (:func:`~specrl.policies.engineer.shared_episodes`)."""

    with shared_episodes():  # the 2-seed engineer replays none of the tuning's episodes
        run = as_run(run_dir)
        config = run.config
        names = list(workloads or config.workloads)
        if episodes is None:
            episodes = stack_search_episodes(len(names))
        scorer = Scorer([run.env(w) for w in names], tuning_seeds(episodes))
        clock = time.perf_counter()
        objective = VersusEngineer(
            scorer, k_max=config.k_max, max_batch=config.max_batch, worst_weight=worst_weight
        )
        theirs = compare_objective(scorer, k_max=config.k_max, max_batch=config.max_batch)
        confirm = VersusEngineer(
            Scorer(scorer.envs, tuning_seeds(episodes, seed=CONFIRM_SEED)),
            k_max=config.k_max,
            max_batch=config.max_batch,
            engineers=objective.engineers,
            worst_weight=worst_weight,
        )
        tuned = (*_played(scorer, confirm.scorer), time.perf_counter() - clock)
        edges = table.acceptance_edges  # the visits binned as the table's cells
        visits = visited_cells(run, edges, progress=progress, desc="search: visits")
        plain = collapsed(table, acceptance)
        weighted = visit_weighted(table, visits, acceptance)
        out = {}
        for name in formats:
            fmt = StackFormat(
                name, k_max=config.k_max, max_batch=config.max_batch, cuda_graph_bs=cuda_graph_bs
            )
            starts = {f"collapse at {acceptance}": plain, "visit-weighted collapse": weighted}
            clock, played = time.perf_counter(), _played(scorer, confirm.scorer)
            starts.update(engineer_starts(scorer, fmt))
            starts.update(_own_engineers(objective, fmt, starts))
            starts.update(compare_engineers(theirs, fmt, starts))
            incumbent = engineer_incumbents(theirs.scorer if theirs else scorer, fmt, starts)
            try:
                result = best_schedule(
                    fmt,
                    objective,
                    starts,
                    confirm=confirm,
                    incumbent=incumbent,
                    progress=progress,
                )
            except SpecrlError as err:
                if errors is None:
                    raise
                errors[name] = err
                continue
            # The engineer's starts were tuned for this search: their episodes count in its cost
            # (each workload's own engineer once, in the first format's).
            cost = _played(scorer, confirm.scorer)
            result.evaluations = cost[0] - played[0] + tuned[0]
            result.surrogate_s = cost[1] - played[1] + tuned[1]
            result.wall_s = time.perf_counter() - clock + tuned[2]
            tuned = (0, 0.0, 0.0)
            out[name] = result
    return out


def incumbent_start(scorer: Scorer, fmt: StackFormat, starts: dict) -> str | None:
    """The name among ``starts`` of the engineer's sweep as ``specrl compare`` tunes it on
    ``scorer``'s mix and seeds, held to ``fmt`` (for TensorRT-LLM the nudge that
    ``sweep:trtllm`` takes: the better on those seeds), a sweep's name first where another
    start serves the same; None where no start holds it."""
    bucket_k, _ = best_sweep(scorer, fmt.k_max, fmt.max_batch)
    sweep = sweep_dense(bucket_k, fmt.max_batch)
    if fmt.fmt == "trtllm":
        _, sweep, _ = best_trtllm_nudge(scorer, sweep)
    return _holding(fmt, starts, sweep, "sweep")


def engineer_incumbents(scorer: Scorer, fmt: StackFormat, starts: dict) -> list[str]:
    """The names among ``starts`` of the engineer's two schedules as ``specrl compare`` tunes
    them on ``scorer``'s mix and seeds, held to ``fmt``: the sweep (:func:`incumbent_start`),
    then ``threshold:tuned``; those no start holds are left out. :func:`best_schedule` keeps
    the better of them on its two sets of seeds as the incumbent: the engineer is the
    better of the two."""
    k, b, _ = best_threshold(scorer, fmt.k_max, fmt.max_batch)
    found = [
        incumbent_start(scorer, fmt, starts),
        _holding(fmt, starts, threshold_dense(k, b, fmt.max_batch), "threshold"),
    ]
    return [name for i, name in enumerate(found) if name is not None and name not in found[:i]]


def _holding(fmt: StackFormat, starts: dict, dense, prefer: str) -> str | None:
    """The name of a start that ``fmt`` serves as it serves ``dense`` (one whose name holds
    ``prefer`` first, where a collapse equals it); None where none does or ``fmt`` cannot
    hold ``dense``."""
    served = fmt.express(dense)
    if served is None:
        return None
    holding = [
        name
        for name, d in starts.items()
        if (held := fmt.express(d)) is not None and np.array_equal(held[1:], served[1:])
    ]
    named = [name for name in holding if prefer in name]
    return (named or holding or [None])[0]


def _own_engineers(objective: VersusEngineer, fmt: StackFormat, starts: dict) -> dict:
    """Each workload's own engineer as a start (for TensorRT-LLM, as it can hold it), those
    not already among ``starts``."""
    found = {}
    for workload, (method, dense) in objective.engineers.items():
        nudged = trtllm_nudges(dense) if fmt.fmt == "trtllm" and method == "sweep" else {"": dense}
        for how, d in nudged.items():
            found[f"{own_start_name(workload, method)} {how}".strip()] = d
    return _unseen(found, starts)


def _unseen(found: dict, starts: dict) -> dict:
    """The schedules of ``found`` that neither ``starts`` nor an earlier one of ``found``
    holds (compared from batch 1 on)."""
    seen = {np.asarray(d)[1:].tobytes() for d in starts.values()}
    out = {}
    for name, dense in found.items():
        key = np.asarray(dense)[1:].tobytes()
        if key not in seen:
            seen.add(key)
            out[name] = dense
    return out


def compare_objective(scorer: Scorer, *, k_max: int, max_batch: int) -> VersusEngineer | None:
    """Where ``scorer`` tunes on more seeds than the engineer of ``specrl compare``
    (:data:`~specrl.policies.engineer.TUNE_EPISODES`): each workload's engineer tuned as that
    engineer tunes it, on the first of those seeds; else None. Built once per search, so the
    formats share its tuning."""
    if len(scorer.seeds) <= TUNE_EPISODES:
        return None
    fewer = Scorer(scorer.envs, scorer.seeds[:TUNE_EPISODES])
    return VersusEngineer(fewer, k_max=k_max, max_batch=max_batch)


def compare_engineers(theirs: VersusEngineer | None, fmt: StackFormat, starts: dict) -> dict:
    """The engineer's schedules as ``specrl compare`` tunes them (``theirs``, from
    :func:`compare_objective`; None: the search tunes as it does, nothing to add): the mix's
    threshold and sweep, and each workload's own engineer (for TensorRT-LLM as it can hold
    them), those not already among ``starts``; so the search is never below them on its
    tuning seeds either."""
    if theirs is None:
        return {}
    label = f" ({TUNE_EPISODES} seeds)"
    found = {n + label: d for n, d in engineer_starts(theirs.scorer, fmt).items()}
    found.update((n + label, d) for n, d in _own_engineers(theirs, fmt, {}).items())
    return _unseen(found, starts)


def against_engineer(
    run_dir, table, *, workloads: list[str] | None = None, episodes: int = NATIVE_EPISODES
) -> dict:
    """The native ``table`` (played by its controller) against the engineer's sweep, both on
    the tuning seeds of ``workloads`` (default: the run's training mix) in the run's
    surrogate, scored as the search scores: how the learned table stands against what a
    benchmark at each concurrency gives, before it is served; ``episodes`` per workload."""
    from specrl.policies.lookup import LookupPolicy

    run = as_run(run_dir)
    config = run.config
    names = list(workloads or config.workloads)
    scorer = Scorer([run.env(w) for w in names], tuning_seeds(episodes))
    bucket_k, _ = best_sweep(scorer, config.k_max, config.max_batch)
    engineer = scorer.score(sweep_dense(bucket_k, config.max_batch))
    mine = geometric_rate(
        scorer.play_policy(
            lambda env: LookupPolicy(
                table,
                max_batch=config.max_batch,
                k_max=config.k_max,
                acceptance_estimate=config.acceptance_estimate,
            )
        )
    )
    return {
        "table_tokens_per_s": mine,
        "engineer_tokens_per_s": engineer,
        "ratio": mine / engineer,
        "engineer": "sweep",
        "workloads": names,
        "seeds": scorer.seeds,
    }


def searched_export(table: KTable, result, acceptance: float, cuda_graph_bs=None) -> dict:
    """The file ``specrl export --format FMT`` writes for a searched schedule (``result``, a
    :class:`SearchResult`): the stack's config, and under ``specrl`` the
    run's provenance and, as ``chosen_by``, how the search chose it."""
    graphs = {} if cuda_graph_bs is None else {"cuda_graph_bs": cuda_graph_bs}
    fmt = StackFormat(result.fmt, k_max=table.k_max, max_batch=table.max_batch, **graphs)
    obj = export_file(
        fmt.table(result.dense, table.provenance), fmt=result.fmt, acceptance=acceptance, **graphs
    )
    obj["specrl"]["chosen_by"] = result.to_json()
    return obj
