"""The timing procedure of ``specrl profile`` and of its freshness check: what a step costs.

Timing cells: for each context level and batch size an engine is filled with B prompts (the
longest of the context level's length, the others between half of it and it, since served rows
are ragged; rows rotate through the domains); its first step is the admission (prefill), its
second a K=k_max step in which the draft catches up on the prompts. The admission is timed on
a lone engine with the same rows before any cell is built, as a serving engine admits with
only itself in memory (:func:`lone_admissions`). The cells are timed context level by
context level: a level's cells are built, ``reps`` rounds visit every one of them in turn and
step it through ``[0, 0, 0, k_max, 1, 2, ..., k_max]`` (three plain steps, a catch-up step
after them, one clean step per K; per K twice, for the cells above :data:`REPLICA_BATCH` at
the shortest context: :data:`LARGE_BATCH_REPEATS`), and they are dropped before the next
level's are built. Why by level: a step is timed beside the caches of the cells alive with it,
and a batch-1 step read 5% slower with the whole grid's built than with the check's few (a
serving engine has only its own); the freshness check builds the shortest level whole, so it
times those cells beside the same neighbours as the profile did. Each round of the shortest
level also admits a few single requests of workload-like prompt lengths on their own, as
served traffic admits them: the prefill and catch-up costs at the small sizes live traffic
has. Interleaving the cells means a moment when the machine is busy spoils one sample of many
cells, not all samples of one, and the medians absorb it. Cells up to batch
:data:`REPLICA_BATCH` are built :data:`REPLICAS` times over and their samples pooled: there a
step is cheap and the K decision is made. A warm-up cell runs first and is discarded. The
freshness check (:func:`specrl.profile.freshness.check_freshness`) times a profile's shortest
level by the same procedure (:func:`time_cells`), row for row.

The timing cells' rows rotate through the domains and through the sampling settings
(:data:`~specrl.workload.trace.SAMPLING_CONFIGS`), as workload traffic does: sampled rows make
verification build distributions (softmax, top-p sort), which greedy rows skip.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specrl.engine import position_limit
from specrl.profile.engines import build_engine, cut_prompts, engine_max_len
from specrl.workload.trace import DEFAULT_PROMPT_LENGTHS, SAMPLING_CONFIGS

SMALL_ADMISSIONS = 6
"""Single-request admissions timed per round (see :func:`_small_admission`)."""
GROUP_ADMISSIONS = (2, 4, 8, 16)
"""Then one admission of each of these many requests at once per round: the few-row
admissions served traffic has between a single request and a whole cell, timed through the
rounds and not only while the cells are built, so that a slow minute at the start does not
set every prefill."""
PLAIN_STEPS = 3
"""K=0 steps before each catch-up step: the draft falls 3 tokens behind."""
REPLICA_BATCH = 8
"""Timing cells up to this batch size are built :data:`REPLICAS` times (independent engines,
their own ragged rows), all stepped every round, their samples pooled."""
REPLICAS = 3
"""Why: a round steps each K>0 once, so a cell's K>0 medians rest on ``reps`` samples, and at
the small batch sizes, where a step is short and the controller's decision is made, the few
samples of one engine can move a whole row of the table (docs/profile.md: two profiles of one
machine that disagreed). Small cells are cheap: replicas of every cell up to
:data:`REPLICA_BATCH` add a few seconds a round."""
LARGE_BATCH_REPEATS = 2
"""Clean steps per K>0 a round, in the cells above :data:`REPLICA_BATCH` (one engine each) at
the grid's shortest context, the cells a profile records (``cell_s``) and its check compares.
Why: one step per K a round leaves their K>0 medians on ``reps`` steps, and a few slow ones
among five set a cell off by more than the check's tolerance for as long as the profile is
used (docs/profile.md). A profile records the count it used (``meta.large_batch_repeats``)
and its check repeats it."""
SPREAD_STEPS = 10
"""Fewest steps a K's own spread is read from; below, the spread of every K of the cell."""


def _round(k_max: int, repeats: int = 1) -> list[int]:
    return [0] * PLAIN_STEPS + [k_max] + list(range(1, k_max + 1)) * repeats


def cell_new_tokens(k_max: int, reps: int, repeats: int) -> int:
    """Tokens a timing cell's rows may generate: the admission step commits 2 (prefill +
    decode), the catch-up step at most K + 1, every round's steps at most K + 1 each (with
    ``repeats`` steps per K>0 a round)."""
    return 2 + (k_max + 1) + reps * sum(k + 1 for k in _round(k_max, repeats))


def round_repeats(batch: int, context: int, shortest: int, large_batch_repeats: int) -> int:
    """Clean steps per K>0 a round of the cell ``(batch, context)`` when ``shortest`` is the
    shortest context timed (see :data:`LARGE_BATCH_REPEATS`)."""
    return large_batch_repeats if batch > REPLICA_BATCH and context == shortest else 1


def _sample(s) -> dict:
    return {
        "k": s.k,
        "context": s.max_context,
        "verify": s.verify_time,
        "draft": s.draft_time,
        "prefill": s.prefill_time,
        "prefill_tokens": s.prefill_tokens,
        "total": s.total_time,
        "committed": s.committed,
        "catchup_tokens": s.catchup_tokens,
        "catchup_padded": s.catchup_padded_tokens,
        "catchup": s.catchup_time,
    }


class TimingCell:
    """One engine at one batch size and prompt length, stepped round by round. Its rows
    rotate through the domains of ``streams`` and through ``settings``, ``(temperature,
    top_p)`` pairs (default: :data:`SAMPLING_CONFIGS`)."""

    def __init__(
        self,
        pair,
        streams,
        *,
        batch,
        context,
        k_max,
        reps,
        device,
        rng,
        settings=None,
        repeats=1,
        admit_only=False,
    ):
        self.new_tokens = cell_new_tokens(k_max, reps, repeats)
        self.k_max, self.repeats = k_max, repeats
        self.engine = build_engine(
            pair,
            max_batch=batch,
            max_len=engine_max_len(pair, context + self.new_tokens, k_max + 2),
            k_max=k_max,
            device=device,
        )
        configs = list(settings or SAMPLING_CONFIGS.values())
        # Ragged rows, as served traffic is: the longest sets the cell's context, the others
        # draw from [context / 2, context]. Equal-length rows would take the cache's one-copy
        # write path, which a running batch of mixed requests never takes.
        lengths = [context] + rng.integers(max(1, context // 2), context + 1, batch - 1).tolist()
        for i, prompt in enumerate(cut_prompts(streams, lengths, rng, list(streams))):
            temperature, top_p = configs[i % len(configs)]
            self.engine.add(
                prompt,
                max_new_tokens=self.new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=int(rng.integers(2**62)),
            )
        self.admission = _sample(self.engine.step(0))
        if admit_only:  # timed for its admission alone: the engine is dropped at once
            self.engine, self.samples = None, []
            return
        self.samples = [_sample(self.engine.step(k_max))]

    def run_round(self) -> None:
        self.samples += [_sample(self.engine.step(k)) for k in _round(self.k_max, self.repeats)]


def replicas(batch: int) -> int:
    """Engines built for a timing cell of ``batch`` rows (see :data:`REPLICAS`)."""
    return REPLICAS if batch <= REPLICA_BATCH else 1


def cell_rng(seed: int, batch: int, context: int, replica: int) -> np.random.Generator:
    """The generator of one timing cell's rows: a cell is the same whichever other cells are
    timed beside it, so the freshness check rebuilds a profile's cells row for row."""
    return np.random.default_rng([seed, batch, context, replica])


@dataclass
class TimedCells:
    """What :func:`time_cells` measured."""

    cells: dict[tuple[int, int], list[dict]]
    """Per ``(batch, context)``: every replica's decode steps, as :func:`_sample` dicts."""
    cell_admissions: dict[tuple[int, int], list[dict]]
    """Per ``(batch, context)``: each replica's admission (prefill) step, timed on its own
    engine with no other cell built (:func:`lone_admissions`)."""
    admissions: list[tuple[dict, dict]]
    """The admissions between rounds: (prefill step, catch-up step) each; the prefill step
    also records ``prefill_padded``, rows x the widest prompt."""


def time_cells(
    pair,
    streams,
    keys: Sequence[tuple[int, int]],
    *,
    k_max: int,
    reps: int,
    device: str,
    seed: int,
    settings=None,
    warm_up: tuple[int, int] | None = None,
    large_batch_repeats: int = LARGE_BATCH_REPEATS,
    on_built=None,
    on_round=None,
) -> TimedCells:
    """The timing procedure that ``specrl profile`` and its freshness check share.

    A warm-up cell, ``warm_up`` (default: the largest batch of ``keys`` at its smallest
    context; a check passes its profile's), runs one round and is discarded: the largest
    steps leave the allocator and caches as the timed cells then find them. Each cell's
    admission is timed first, on its own engine alone (:func:`lone_admissions`). Then, one
    context level of ``keys`` at a time (in their order), every ``(batch, context)`` of the
    level is built :func:`replicas` times, each replica's rows drawn by :func:`cell_rng` (the
    same rows again), ``reps`` rounds step every cell of the level in turn (each K>0
    :func:`round_repeats` times: ``large_batch_repeats`` in the cells above
    :data:`REPLICA_BATCH` at the shortest context of ``keys``, else once), and the level's
    cells are dropped. After each round of the shortest level, :data:`SMALL_ADMISSIONS`
    single requests, then a group of each size of :data:`GROUP_ADMISSIONS`, are admitted to
    one warm engine (:func:`_small_admission`). ``on_built()`` is called after each
    admission timed and each cell built, ``on_round(r)`` after each round (``r`` counts
    every level's rounds: ``reps`` x levels in all)."""
    kw = {"k_max": k_max, "reps": reps, "device": device, "settings": settings}
    shortest = min(c for _, c in keys)
    warm = warm_up or (max(b for b, _ in keys), shortest)
    TimingCell(
        pair, streams, batch=warm[0], context=warm[1], rng=cell_rng(seed, 0, 0, 0), **kw
    ).run_round()
    build = {
        "seed": seed,
        "shortest": shortest,
        "large_batch_repeats": large_batch_repeats,
        "on_built": on_built,
        **kw,
    }
    admitted = lone_admissions(pair, streams, keys, **build)
    rounds = itertools.count()

    def after_round() -> None:
        r = next(rounds)
        if on_round is not None:
            on_round(r)

    samples: dict[tuple[int, int], list[dict]] = {}
    admissions: list[tuple[dict, dict]] = []
    for level in dict.fromkeys(c for _, c in keys):  # the context levels, in keys' order
        samples |= _time_level(
            pair,
            streams,
            [(b, c) for b, c in keys if c == level],
            admissions if level == shortest else None,
            after_round,
            **build,
        )
    return TimedCells(samples, admitted, admissions)


def _build_cells(
    pair, streams, keys, *, seed, shortest, large_batch_repeats, on_built, **kw
) -> dict[tuple[int, int], list[TimingCell]]:
    """Every ``(batch, context)`` of ``keys`` built :func:`replicas` times, each replica's rows
    drawn by :func:`cell_rng` (so a cell built twice has the same rows), its K>0 steps a
    round by :func:`round_repeats`; ``on_built()`` after each. ``kw`` goes to
    :class:`TimingCell` (``admit_only`` among it)."""
    cells: dict[tuple[int, int], list[TimingCell]] = {}
    for b, c in keys:
        cells[b, c] = []
        repeats = round_repeats(b, c, shortest, large_batch_repeats)
        for r in range(replicas(b)):
            rng = cell_rng(seed, b, c, r)
            cells[b, c].append(
                TimingCell(pair, streams, batch=b, context=c, rng=rng, repeats=repeats, **kw)
            )
            if on_built is not None:
                on_built()
    return cells


def _time_level(
    pair, streams, keys, admissions: list | None, after_round, **build
) -> dict[tuple[int, int], list[dict]]:
    """The decode steps of one context level's ``keys``: its cells built
    (:func:`_build_cells`), stepped through ``reps`` rounds, ``after_round()`` after each,
    and dropped on return. Unless ``admissions`` is None, the small admissions after each
    round are appended to it."""
    cells = _build_cells(pair, streams, keys, **build)
    k_max, device = build["k_max"], build["device"]
    if admissions is not None:
        engine = _admission_engine(pair, k_max=k_max, device=device)
        admission_rng = cell_rng(build["seed"], 0, 0, 1)
    for _ in range(build["reps"]):
        for copies in cells.values():
            for cell in copies:
                cell.run_round()
        if admissions is not None:
            admissions += [
                _small_admission(engine, streams, k_max=k_max, rng=admission_rng, rows=rows)
                for rows in [1] * SMALL_ADMISSIONS + list(GROUP_ADMISSIONS)
            ]
        after_round()
    return {key: [s for cell in copies for s in cell.samples] for key, copies in cells.items()}


def lone_admissions(pair, streams, keys, **build) -> dict[tuple[int, int], list[dict]]:
    """Each timing cell's admission (its prefill step), timed on the cell's own engine with
    its own rows (:func:`_build_cells`, ``admit_only``: the engine is dropped right after
    the step), so that no other cell is built beside it: a serving engine admits with only
    itself in memory. Why not the cells' admissions: the last ones are built beside every
    other cell's cache, and there a large prefill reads 20-40% slower than on a lone engine
    (docs/profile.md)."""
    cells = _build_cells(pair, streams, keys, admit_only=True, **build)
    return {key: [cell.admission for cell in copies] for key, copies in cells.items()}


def clean_steps(decode: Sequence[dict], k: int) -> list[dict]:
    """A cell's decode steps at ``k`` that admitted nothing and caught nothing up: those a
    profile's cell figures and its freshness check both take."""
    return [s for s in decode if s["k"] == k and s["catchup_tokens"] == 0]


def clean_step_seconds(decode: Sequence[dict], k: int) -> list[float]:
    """Seconds of :func:`clean_steps`, without any prefill or catch-up time."""
    return [s["total"] - s["prefill"] - s["catchup"] for s in clean_steps(decode, k)]


def cell_statistics(decode: Sequence[dict], k_max: int) -> tuple[list[float], list[float]]:
    """Per K = 0..k_max: the median of :func:`clean_step_seconds` and its spread, the robust
    standard deviation of ``log(seconds / median)`` over the steps at that K, or over every K
    of the cell (each around its own median) where a K has fewer than :data:`SPREAD_STEPS`
    steps: a K>0 step a round (two in a large cell at the shortest context) is too few to read
    a spread from at a few rounds."""
    medians, logs = [], []
    for k in range(k_max + 1):
        seconds = clean_step_seconds(decode, k)
        medians.append(float(np.median(seconds)))
        logs.append([math.log(t / medians[-1]) for t in seconds])
    pooled = log_spread([x for at_k in logs for x in at_k])
    spreads = [log_spread(at_k) if len(at_k) >= SPREAD_STEPS else pooled for at_k in logs]
    return medians, spreads


def _admission_engine(pair, *, k_max: int, device: str):
    """The one engine that :func:`_small_admission` admits requests to in turn: warm, as a
    serving engine is when requests join it. Sized for the largest group of
    :data:`GROUP_ADMISSIONS` at the presets' longest prompt, or the pair's positions where it
    has fewer."""
    longest = DEFAULT_PROMPT_LENGTHS.hi + k_max + 4
    limit = position_limit(pair.target, pair.draft)
    if limit is not None:
        longest = min(longest, limit.positions)
    return build_engine(
        pair,
        max_batch=max(GROUP_ADMISSIONS),
        max_len=engine_max_len(pair, longest, 4),
        k_max=k_max,
        device=device,
    )


def _small_admission(engine, streams, *, k_max, rng, rows: int = 1) -> tuple[dict, dict]:
    """``rows`` requests of workload-like prompt lengths (each from a random domain) joining
    ``engine`` (:func:`_admission_engine`) together, as in served traffic: their prefill
    (the admission step, with ``prefill_padded``: rows x the widest prompt) and the draft's
    catch-up on them (the next K=k_max step); then they decode to their end, untimed, and
    leave the engine empty. A draw longer than the engine holds takes its longest."""
    lengths = [
        max(1, min(int(n), engine.max_len - k_max - 4))
        for n in DEFAULT_PROMPT_LENGTHS.sample(rng, rows)
    ]
    domains = list(streams)
    # Untimed: one request served to its end first, so that the timed admission follows this
    # engine's own step, as a request joining served traffic does, not the timing cells'.
    warm = cut_prompts(streams, [lengths[0]], rng, [domains[int(rng.integers(len(domains)))]])[0]
    engine.add(warm, max_new_tokens=2)
    _drain(engine)
    for length in lengths:
        prompt = cut_prompts(streams, [length], rng, [domains[int(rng.integers(len(domains)))]])[0]
        engine.add(prompt, max_new_tokens=k_max + 4)
    prefill = {**_sample(engine.step(0)), "prefill_padded": rows * max(lengths)}
    catchup = _sample(engine.step(k_max))
    _drain(engine)
    return prefill, catchup


def _drain(engine) -> None:
    """Serve ``engine``'s requests to their end, untimed, and leave it empty."""
    while engine.has_work:
        engine.step(0)
    engine.pop_finished()


def log_spread(logs: list[float]) -> float:
    """Robust standard deviation of log-ratios: 1.4826 * median absolute deviation."""
    logs = np.asarray(logs)
    return float(1.4826 * np.median(np.abs(logs - np.median(logs))))
