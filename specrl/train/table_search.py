"""The best native table for the traffic it will serve: the learned table, refined by a local
search in the surrogate, as each stack's schedule is chosen (:mod:`specrl.train.search`).

PPO learns the table, and its level against the engineer's hand-tuned schedules depends on the
training seed. :func:`best_table` searches batch x acceptance tables from it:

1. **Starts**: the learned table (fidelity-checked), and the engineer's per-bucket sweep and
   threshold tuned on the same objective, each as a table that holds its K at every
   acceptance. The sweep is the incumbent: another start replaces it only if it scores at
   least :data:`~specrl.train.search.MIN_MOVE_GAIN` higher on the tuning seeds and on the
   confirmation seeds (then the best such start by the score on both).
2. **Local search**, bucket by bucket (:data:`~specrl.train.search.SEARCH_BATCHES`), over the
   buckets the episodes reach. The moves on a bucket's rows: every K one up, or one down
   (``stale_k`` too); the acceptance at which K changes moved by :data:`SHIFT`
   either way (draft more or less eagerly); the neighbouring bucket's rows; the learned
   table's rows; the engineer's sweep K at every acceptance. The best move is kept if it
   scores at least :data:`~specrl.train.search.MIN_MOVE_GAIN` higher on the tuning seeds
   and gains as much on the confirmation seeds (:data:`specrl.seeds.CONFIRM_SEED`): the
   best of a bucket's moves on two seeds is partly the seeds' luck, and a move that does
   not hold on other episodes is not kept. Up to :data:`MAX_PASSES` passes.
3. **The learned table searched too.** When the search started from an engineer's schedule,
   a second local search starts from the learned table: one that gains on some workloads
   and loses on others has its losing rows replaced there. PPO is the learner: its result
   replaces the first's wherever it is at least the engineer's sweep on both sets of seeds
   and the first's does not score :data:`~specrl.train.search.MIN_MOVE_GAIN` higher on
   both. Two searches level on a few seeds per workload differ held-out by more than the
   seeds tell apart, and of the two the learned table's is the one the learner chose.

The score is the stack search's (:class:`~specrl.train.search.VersusEngineer`: tokens/s over
each workload's own engineer, the worst workload weighing half), here the mean of its values on
the tuning and on the confirmation seeds; the engineers are tuned on the tuning seeds and
judged as they are on the confirmation seeds. Each move kept gains on both, and the second
search replaces the first only where it is at least the sweep on both, so the result is never
below the engineer's sweep on either set of seeds; a start within the seeds' noise of the
sweep (the learned table, as often as not) contributes the rows that gain, bucket by bucket,
through the moves. The table keeps the learned table's acceptance bins and probe rule; its
batch buckets are the runs of equal rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from specrl.errors import SpecrlError
from specrl.policies.engineer import (
    Scorer,
    best_sweep,
    best_threshold,
    sweep_dense,
    threshold_dense,
    tuning_seeds,
    workload_name,
)
from specrl.seeds import CONFIRM_SEED
from specrl.table import KTable, table_from_json
from specrl.train.search import (
    MIN_MOVE_GAIN,
    NATIVE_EPISODES,
    WORST_WEIGHT,
    VersusEngineer,
    gains_on_both,
    own_start_name,
    relative_objective,
    replacing_start,
    search_buckets,
)
from specrl.train.trained import as_run

SHIFT = 0.05
"""A boundary move shifts each row's Ks by this much acceptance (5 of the export's 0.01-wide
bins, 10 of its 0.005-wide ones)."""
INCUMBENT = "engineer's sweep"
"""The start the search keeps unless another gains on both sets of seeds."""
MAX_PASSES = 3
"""Local search passes at most (each tries every reached bucket once)."""


@dataclass
class TableGrid:
    """A native table as arrays: K per batch size (rows ``0..max_batch``; row 0 is never
    served) and acceptance bin, and ``stale_k`` per batch size; the rest (bins, probe rule,
    provenance) from ``template``."""

    k: np.ndarray
    stale: np.ndarray
    template: KTable

    @classmethod
    def of(cls, table: KTable) -> TableGrid:
        if table.context_bins is not None:
            raise SpecrlError(
                "the native table search handles tables without context bins; export this "
                "one with --no-search"
            )
        bins = len(table.acceptance_edges) - 1
        k = np.zeros((table.max_batch + 1, bins), dtype=np.int64)
        stale = np.zeros(table.max_batch + 1, dtype=np.int64)
        for b, (lo, hi) in enumerate(table.batch_buckets):
            k[lo : hi + 1] = table.cell(b)
            stale[lo : hi + 1] = table.stale(b)
        k[0], stale[0] = k[1], stale[1]
        return cls(k, stale, table)

    @classmethod
    def constant(cls, dense, template: KTable) -> TableGrid:
        """The schedule ``dense`` (K per batch size ``0..max_batch``) at every acceptance."""
        dense = np.asarray(dense, dtype=np.int64)
        bins = len(template.acceptance_edges) - 1
        return cls(np.repeat(dense[:, None], bins, axis=1), dense.copy(), template)

    def same(self, other: TableGrid) -> bool:
        """Whether ``other`` serves the same K everywhere (row 0 is never served)."""
        return np.array_equal(self.k[1:], other.k[1:]) and np.array_equal(
            self.stale[1:], other.stale[1:]
        )

    def copy(self) -> TableGrid:
        return TableGrid(self.k.copy(), self.stale.copy(), self.template)

    def table(self) -> KTable:
        """As a :class:`~specrl.table.KTable`: one bucket per run of batch sizes with equal
        rows and ``stale_k``."""
        buckets, cells, stale = [], [], []
        for batch in range(1, self.template.max_batch + 1):
            row, s = self.k[batch].tolist(), int(self.stale[batch])
            if cells and cells[-1] == row and stale[-1] == s:
                buckets[-1][1] = batch
            else:
                buckets.append([batch, batch])
                cells.append(row)
                stale.append(s)
        obj = self.template.to_json()
        obj.update(batch_buckets=buckets, k=cells, stale_k=stale)
        return table_from_json(obj, source="the searched table")


@dataclass
class TableSearchResult:
    """The table :func:`best_table` chose, and how."""

    table: KTable
    score: float
    start: str
    starts: dict[str, float]
    """Each start's score."""
    starts_by_seeds: dict[str, tuple[float, float]]
    """Each start's score on the tuning seeds, and on the confirmation seeds."""
    engineer: dict[str, str]
    """The engineer's schedules the starts hold, in words."""
    workloads: list[str]
    seeds: list[int]
    confirm_seeds: list[int]
    moves: list[dict] = field(default_factory=list)
    """Each move kept: ``{"batch": [lo, hi], "move": what, "gain": score share on both sets of
    seeds, "gain_tuning": on the tuning seeds, "gain_confirm": on the confirmation seeds}``."""
    evaluations: int = 0
    """Surrogate episodes played."""
    surrogate_s: float = 0.0
    wall_s: float = 0.0
    ratios: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per workload, the table's tokens/s over that workload's engineer on the tuning seeds,
    and on the confirmation seeds."""
    engineers: dict[str, str] = field(default_factory=dict)
    """Per workload, its engineer's method (tuned on that workload's tuning seeds)."""
    objective: str = field(default_factory=relative_objective)
    """The score on either set of seeds, in words (``VersusEngineer.objective``)."""
    rival: dict | None = None
    """The local search from the learned table, run beside the one from an engineer's start:
    ``{"score", "by_seeds": [tuning, confirmation], "moves", "kept", "other_by_seeds"}``
    (``other_by_seeds``: the other search's result on both sets); None when the search
    started from the learned table."""

    def to_json(self) -> dict:
        return {
            "method": "search",
            "objective": self.objective + ", the mean of its values on both sets of seeds",
            "ratios": {w: list(r) for w, r in self.ratios.items()},
            "engineers": self.engineers,
            "workloads": self.workloads,
            "seeds": self.seeds,
            "confirm_seeds": self.confirm_seeds,
            "min_move_gain": MIN_MOVE_GAIN,
            "score": self.score,
            "start": self.start,
            "starts": self.starts,
            "starts_by_seeds": {k: list(v) for k, v in self.starts_by_seeds.items()},
            "engineer": self.engineer,
            "moves": self.moves,
            "rival": self.rival,
            "episodes": self.evaluations,
            "surrogate_s": round(self.surrogate_s, 1),
            "wall_s": round(self.wall_s, 1),
        }

    def describe(self) -> str:
        learned = self.starts.get("learned table")
        lines = [
            f"native: searched from the {self.start} ({len(self.moves)} moves kept): score "
            f"{self.score:.4f}; starts: "
            + ", ".join(f"{name} {s:.4f}" for name, s in self.starts.items()),
            f"  judged on seeds {self.seeds[0]}-{self.seeds[-1]}, confirmed on "
            f"{self.confirm_seeds[0]}-{self.confirm_seeds[-1]}, of {', '.join(self.workloads)}:"
            f" {self.evaluations} episodes, {self.surrogate_s:,.0f} surrogate s "
            f"({self.wall_s:.0f} s wall)",
        ]
        if learned:
            lines.append(f"  {self.score / learned:.4f}x the learned table's score")
        if self.rival:
            r = self.rival
            lines.append(
                f"  searched from the learned table too ({r['moves']} moves kept): score "
                f"{r['score']:.4f} ({r['by_seeds'][0]:.4f} tuning, {r['by_seeds'][1]:.4f} "
                f"confirmation; the engineer's start's search {r['other_by_seeds'][0]:.4f}, "
                f"{r['other_by_seeds'][1]:.4f}): {'kept' if r['kept'] else 'not kept'}"
            )
        if self.ratios:
            lines.append(
                f"  score: {self.objective}; over each workload's engineer "
                "(tuning, confirmation seeds): "
                + ", ".join(
                    f"{w} {a:.4f}/{b:.4f} ({self.engineers[w]})"
                    for w, (a, b) in self.ratios.items()
                )
            )
        for m in self.moves:
            lines.append(
                f"  batch {m['batch'][0]}-{m['batch'][1]}: {m['move']} (+{m['gain_tuning']:.2%} "
                f"on the tuning seeds, +{m['gain_confirm']:.2%} on the confirmation seeds)"
            )
        return "\n".join(lines)


def best_table(
    table: KTable,
    scorer: Scorer,
    confirm: Scorer,
    *,
    progress: bool = False,
    worst_weight: float = WORST_WEIGHT,
) -> TableSearchResult:
    """Search batch x acceptance tables from ``table`` and the engineer's schedules (see the
    module); ``scorer`` holds the envs (workloads) and the tuning seeds, ``confirm`` the same
    envs on the confirmation seeds; ``worst_weight``, the score's weight on the worst
    workload (:class:`~specrl.train.search.VersusEngineer`)."""
    clock = time.perf_counter()
    k_max, max_batch = table.k_max, table.max_batch
    played = (scorer.episodes + confirm.episodes, scorer.surrogate_s + confirm.surrogate_s)
    tune = VersusEngineer(scorer, k_max=k_max, max_batch=max_batch, worst_weight=worst_weight)
    again = VersusEngineer(
        confirm,
        k_max=k_max,
        max_batch=max_batch,
        engineers=tune.engineers,
        worst_weight=worst_weight,
    )
    both = _Both(tune, again)
    k, b, _ = best_threshold(scorer, k_max, max_batch)
    bucket_k, _ = best_sweep(scorer, k_max, max_batch)
    sweep = sweep_dense(bucket_k, max_batch)
    starts = {
        "learned table": TableGrid.of(table),
        "engineer's sweep": TableGrid.constant(sweep, table),
        "engineer's threshold": TableGrid.constant(threshold_dense(k, b, max_batch), table),
    }
    for workload, (method, dense) in tune.engineers.items():  # each workload's own
        grid = TableGrid.constant(dense, table)
        if not any(grid.same(g) for g in starts.values()):
            starts[own_start_name(workload, method)] = grid
    tables = {name: g.table() for name, g in starts.items()}
    both.prefetch(list(tables.values()))
    scores = {name: both.score(t) for name, t in tables.items()}
    by_seeds = {name: both.split(t) for name, t in tables.items()}
    # The engineer's sweep is the incumbent; another start replaces it only where it gains
    # on both sets of seeds, as a move must.
    sweep_scores = by_seeds[INCUMBENT]
    start = replacing_start(
        INCUMBENT,
        {name: pair[0] for name, pair in by_seeds.items()},
        {name: pair[1] for name, pair in by_seeds.items()},
    )
    learned = starts["learned table"]
    grid, score, moves = _local_search(starts[start].copy(), both, sweep, learned, progress)
    rival = None
    if start != "learned table":
        # The learned table may lose to the sweep on a few workloads and gain on others:
        # searched from, its losing rows are replaced where they lose. PPO is the learner:
        # its search is kept wherever it is at least the engineer's sweep on both sets of
        # seeds and the other search's result does not beat it by a move's gain on both.
        grid_l, score_l, moves_l = _local_search(learned.copy(), both, sweep, learned, progress)
        ours, theirs = both.split(grid_l.table()), both.split(grid.table())
        kept = learner_kept(ours, theirs, sweep_scores)
        rival = {
            "score": score_l,
            "by_seeds": list(ours),
            "moves": len(moves_l),
            "kept": kept,
            "other_by_seeds": list(theirs),
        }
        if kept:
            grid, score, moves, start = grid_l, score_l, moves_l, "learned table"
    chosen = grid.table()
    return TableSearchResult(
        table=chosen,
        score=score,
        start=start,
        starts=scores,
        starts_by_seeds=by_seeds,
        engineer={
            "sweep": ", ".join(f"{lo}-{hi}: {kk}" for (lo, hi), kk in bucket_k.items()),
            "threshold": f"K={k} up to B={b}, off above",
        },
        workloads=[workload_name(env) for env in scorer.envs],
        seeds=scorer.seeds,
        confirm_seeds=confirm.seeds,
        moves=moves,
        evaluations=both.cost()[0] - played[0],
        surrogate_s=both.cost()[1] - played[1],
        wall_s=time.perf_counter() - clock,
        ratios=dict(
            zip(
                tune.engineers,
                zip(both.tune.table_ratios(chosen), both.confirm.table_ratios(chosen)),
                strict=True,
            )
        ),
        engineers=tune.engineer_methods(),
        objective=tune.objective,
        rival=rival,
    )


def learner_kept(ours, theirs, sweep) -> bool:
    """Whether the search from the learned table (``ours``: its scores on the tuning and the
    confirmation seeds) is kept over the search from an engineer's start (``theirs``): it is
    at least the engineer's sweep (``sweep``) on both sets, and ``theirs`` does not score
    :data:`~specrl.train.search.MIN_MOVE_GAIN` higher on both."""
    return all(o >= s for o, s in zip(ours, sweep, strict=True)) and not gains_on_both(theirs, ours)


class _Both:
    """The objective on the tuning and on the confirmation seeds: a table's score on both
    (the mean of the two)."""

    def __init__(self, tune: VersusEngineer, confirm: VersusEngineer):
        self.tune, self.confirm = tune, confirm

    def prefetch(self, tables) -> None:
        self.tune.prefetch_tables(tables)
        self.confirm.prefetch_tables(tables)

    def score(self, table) -> float:
        return (self.tune.score_table(table) + self.confirm.score_table(table)) / 2

    def split(self, table) -> tuple[float, float]:
        """The table's score on the tuning seeds, and on the confirmation seeds."""
        return self.tune.score_table(table), self.confirm.score_table(table)

    def cost(self) -> tuple[int, float]:
        return (
            self.tune.episodes + self.confirm.episodes,
            self.tune.surrogate_s + self.confirm.surrogate_s,
        )


def _local_search(grid: TableGrid, both: _Both, sweep, learned: TableGrid, progress: bool):
    """Bucket by bucket, the best move on the tuning seeds, kept where it gains at least
    ``MIN_MOVE_GAIN`` there and on the confirmation seeds, for up to :data:`MAX_PASSES`
    passes: ``(grid, score on both, moves kept)``."""
    tune, confirm = both.tune, both.confirm
    current = grid.table()
    current_tune = tune.score_table(current)
    buckets = search_buckets(grid.template.max_batch)
    kept: list[dict] = []
    bar = tqdm(desc="search native", total=MAX_PASSES * len(buckets), disable=not progress)
    for _ in range(MAX_PASSES):
        changed = False
        reached = _reached(tune.play_table(current))
        for i, (lo, hi) in enumerate(buckets):
            bar.update()
            if not reached[lo : hi + 1].any():
                continue  # no step of the tuning episodes has this many rows: nothing to judge
            trials = {
                name: (trial, trial.table())
                for name, trial in _moves(grid, buckets, i, sweep, learned).items()
                if not trial.same(grid)
            }
            tune.prefetch_tables([t for _, t in trials.values()])
            floor = current_tune * (1 + MIN_MOVE_GAIN)
            best = None
            for name, (trial, table) in trials.items():
                s = tune.score_table(table)
                if s > floor and (best is None or s > best[0]):
                    best = (s, name, trial, table)
            if best is None:
                continue
            best_tune, name, trial, table = best
            gain = confirm.score_table(table) / confirm.score_table(current) - 1
            if gain < MIN_MOVE_GAIN:
                continue
            kept.append(
                {
                    "batch": [lo, hi],
                    "move": name,
                    "gain": both.score(table) / both.score(current) - 1,
                    "gain_tuning": best_tune / current_tune - 1,
                    "gain_confirm": gain,
                }
            )
            grid, current, current_tune, changed = trial, table, best_tune, True
        if not changed:
            break
    bar.close()
    return grid, both.score(current), kept


def _reached(played: list) -> np.ndarray:
    """Per batch size, whether any step of ``played``'s episodes decoded that many rows."""
    sizes = [b for runs in played for r in runs for b in r.step_batch]
    return np.bincount(np.asarray(sizes, dtype=np.int64), minlength=2) > 0


def _moves(grid: TableGrid, buckets, i: int, sweep, learned: TableGrid) -> dict[str, TableGrid]:
    """The moves :func:`_local_search` tries on bucket ``i``'s rows, by name."""
    lo, hi = buckets[i]
    k_max = grid.template.k_max
    rows, stale = grid.k[lo : hi + 1], grid.stale[lo : hi + 1]
    n = rows.shape[1]
    shift = max(1, round(SHIFT * n))  # bins: the export's are of equal width
    options = {
        "K one up": (np.minimum(rows + 1, k_max), np.minimum(stale + 1, k_max)),
        "K one down": (np.maximum(rows - 1, 0), np.maximum(stale - 1, 0)),
        "draft more eagerly": (rows[:, np.minimum(np.arange(n) + shift, n - 1)], stale),
        "draft less eagerly": (rows[:, np.maximum(np.arange(n) - shift, 0)], stale),
        f"the engineer's K={int(sweep[hi])}": (
            np.full_like(rows, int(sweep[hi])),
            np.full_like(stale, int(sweep[hi])),
        ),
    }
    options["the learned table's rows"] = (learned.k[lo : hi + 1], learned.stale[lo : hi + 1])
    if i > 0:
        below = buckets[i - 1][1]
        options["the rows below"] = (
            np.repeat(grid.k[below][None], len(rows), 0),
            np.full_like(stale, grid.stale[below]),
        )
    if i + 1 < len(buckets):
        above = buckets[i + 1][0]
        options["the rows above"] = (
            np.repeat(grid.k[above][None], len(rows), 0),
            np.full_like(stale, grid.stale[above]),
        )
    out = {}
    for name, (k, s) in options.items():
        trial = grid.copy()
        trial.k[lo : hi + 1], trial.stale[lo : hi + 1] = k, s
        out[name] = trial
    return out


def search_native(
    run_dir,
    table: KTable,
    *,
    workloads: list[str] | None = None,
    progress: bool = True,
    worst_weight: float = WORST_WEIGHT,
    episodes: int = NATIVE_EPISODES,
) -> TableSearchResult:
    """:func:`best_table` from the run's exported ``table``, judged on ``workloads`` (presets or
    trace files; default: the run's training mix) in the surrogate of the run's profile and
    sizes, scored with ``worst_weight`` on the worst workload, ``episodes`` per workload on
    the tuning seeds and as many on the confirmation seeds."""
    run = as_run(run_dir)
    names = list(workloads or run.config.workloads)
    envs = [run.env(w) for w in names]
    confirm = Scorer(envs, tuning_seeds(episodes, seed=CONFIRM_SEED))
    return best_table(
        table,
        Scorer(envs, tuning_seeds(episodes)),
        confirm,
        progress=progress,
        worst_weight=worst_weight,
    )


def native_file(table: KTable, result: TableSearchResult) -> KTable:
    """The table ``specrl export --format native`` writes for a search ``result`` from the
    learned ``table``: the searched cells, with the learned table's provenance (its
    fidelity check is the learned table's) and, as ``chosen_by``, how the search chose them."""
    obj = result.table.to_json()
    obj["provenance"] = dict(table.provenance, chosen_by=result.to_json())
    if table.request_acceptance is not None:  # read with the learned table's estimate
        obj["request_acceptance"] = table.request_acceptance
    return table_from_json(obj, source="the searched table")
