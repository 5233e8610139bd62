"""Measure a hardware profile with the real engine (``specrl profile --out PROFILE.json``).

Timing cells: for each context level and batch size an engine is filled with B prompts (the
longest of the context level's length, the others between half of it and it, since served
rows are ragged; rows rotate through the domains); its first step is the admission (prefill),
its second a K=k_max step in which the draft catches up on the prompts. Then ``reps`` rounds
visit every cell in turn and step it through ``[0, 0, 0, k_max, 1, 2, ..., k_max]``: three
plain steps, a catch-up step after them, one clean step per K. Each round also admits a few
single requests of workload-like prompt lengths on their own, as served traffic admits them:
the prefill and catch-up costs at the small sizes live traffic has. Interleaving the cells means a
moment when the machine is busy spoils one sample of many cells, not all samples of one, and
the medians absorb it. Cells up to batch :data:`REPLICA_BATCH` are built :data:`REPLICAS`
times over and their samples pooled: there a step is cheap and the K decision is made. Tables
are then made non-decreasing in context (more context never makes a step cheaper; what says
otherwise is noise), not in batch size. A warm-up cell runs first and is discarded. The
freshness check times a profile's cells at the shortest context by the same procedure
(:func:`time_cells`), row for row.

The timing cells' rows rotate through the domains and through the sampling settings
(:data:`~specrl.workload.trace.SAMPLING_CONFIGS`), as workload traffic does: sampled rows make
verification build distributions (softmax, top-p sort), which greedy rows skip.

Acceptance: per domain and temperature band (each of ``SAMPLING_CONFIGS``), requests with
prompt and output lengths drawn like the preset workloads' are decoded at K=k_max, 128 at a
time; per-position accepted / drafted counts give the conditional rates, pooled and by how
many tokens the row had generated (``OUTPUT_EDGES``): the default pair's target drifts into
repetition as it generates, which its draft predicts well, so acceptance climbs with output
length. Sparse buckets are shrunk toward the pooled rates.

With a prompts file (``specrl profile --prompts P.jsonl``, :mod:`specrl.workload.user_prompts`)
acceptance is measured on the file's prompts instead, per domain of the file and per
temperature band that any of its prompts falls in (every domain at every such band, as the
profile format has it). A domain's prompts of the band run with their own temperature, top_p
and max_new_tokens; a domain with no prompt in a band runs its prompts at the band's
setting. Sampled bands cycle through their prompts until ``acceptance_rows`` requests
(greedy ones decode each prompt once: a repeat would be the same request). The timing cells
then cut their rows from the prompts (joined per domain and repeated to reach a cell's
length) and take the prompts' sampling settings in turn. The profile's ``meta.prompts`` names
the file and its domains; ``meta.prompt_counts[domain][band]`` counts the file's prompts per
group (0: the group ran at the band's setting). ``meta.prompt_lengths_dist`` summarises the
file's prompt lengths (target tokens) and ``meta.output_lengths_dist`` its output lengths
where any line gives ``max_new_tokens`` (lines without one count at the presets' lengths, as
in a trace of the file: :func:`~specrl.workload.user_prompts.file_output_lengths`): the
surrogate's preset workloads draw their requests' lengths from them.

Acceptance is strongly per request (a request whose greedy continuation loops accepts about
0.95 throughout). Each request's level is recorded as the logit offset that makes the group's
rates reproduce its accepted count, shrunk toward 0 by its sampling noise (empirical Bayes);
the profile keeps their quantiles (``request_levels``), and the surrogate gives each request a
level drawn from them, which drifts as the request decodes where the profile records how
levels drift (``level_drift``: :func:`specrl.profile.levels.drift`).
"""

from __future__ import annotations

import bisect
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

import numpy as np

from specrl.errors import SpecrlError
from specrl.profile.fingerprint import pair_fingerprint
from specrl.profile.levels import FIXED_LEVEL, drift, grid_index, level_grid
from specrl.profile.schema import Profile
from specrl.profile.synthetic import expected_tokens_per_row
from specrl.workload.trace import (
    DEFAULT_OUTPUT_LENGTHS,
    DEFAULT_PROMPT_LENGTHS,
    DOMAINS,
    SAMPLING_CONFIGS,
    stream_window,
)
from specrl.workload.user_prompts import (
    PromptFile,
    file_output_lengths,
    fitted_lengths,
    tokenize_prompts,
)

OUTPUT_EDGES = (16, 32, 64, 128)
"""Acceptance buckets by tokens generated so far: [0, 16), [16, 32), ..., [128, inf)."""
SHRINK_TOKENS = 32
"""Prior weight, in drafted tokens, pulling a bucket's rate toward the pooled rate."""
ACCEPTANCE_ROWS = 384
"""Requests decoded per domain and temperature band to measure acceptance. Acceptance is
strongly per request, so the sample must hold many requests: with 128 requests per domain the
surrogate read the live engine's acceptance 0.04-0.09 low, with 512 within 0.04."""
LEVEL_QUANTILES = 33
"""Quantiles of the per-request logit offsets kept in the profile."""
LEVEL_BOUND = 6.0
"""Per-request logit offsets are fitted within +-6 (a rate of 0.5 moves to 0.0025 or 0.9975)."""
ACCEPTANCE_BATCH = 128
"""How many of them run at once (continuous batching serves the rest as rows free up)."""
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
the small batch sizes, where a step takes 10-30 ms and the controller's decision is made,
one engine's few samples moved a whole row of the table. Two profiles of this VM two hours
apart read T(K=1) / T(K=0) at batch 2 as 1.95 and 1.61 (1.38 and 1.35 at batches 1 and 4 in
the first), and at batch 1 as 1.30 where eight rounds of timing alone read 1.60. Small cells
are cheap: three replicas of every cell up to batch 8 add a few seconds a round."""


SPREAD_STEPS = 10
"""Fewest steps a K's own spread is read from; below, the spread of every K of the cell."""


ACCEPTANCE_FIELDS = (
    "acceptance",
    "acceptance_by_output",
    "acceptance_counts",
    "request_levels",
    "level_drift",
)
"""The profile's fields that hold what the pair accepts, not what the machine costs."""


def _round(k_max: int) -> list[int]:
    return [0] * PLAIN_STEPS + [k_max] + list(range(1, k_max + 1))


def _prompts(streams, lengths: Sequence[int], rng: np.random.Generator, domains) -> list:
    """One prompt per entry of ``lengths``, cut at a random start of its domain's stream
    (repeated when shorter, as a prompts file's stream may be); the rows rotate through
    ``domains``."""
    out = []
    for i, length in enumerate(lengths):
        length = int(length)
        stream = streams[domains[i % len(domains)]]
        start = int(rng.integers(0, max(1, len(stream) - length)))
        out.append(stream_window(stream, start, length))
    return out


def _engine(pair, *, max_batch: int, max_len: int, k_max: int, device: str):
    from specrl.engine import SpecEngine

    return SpecEngine(
        pair.target,
        pair.draft,
        max_batch=max_batch,
        max_len=max_len,
        k_max=k_max,
        device=device,
        vocab_padding=pair.vocab_padding,
    )


def _max_len(pair, needed: int, room: int) -> int:
    """The ``max_len`` of an engine whose requests need up to ``needed`` positions (prompt
    and output): ``room`` more where the pair has them, else as many as it has. The profile's
    engines have always been sized with that room, so a pair of many positions measures as
    before; without it nothing changes but the cache's width, since the engine stops a
    request's K at its token budget before its ``max_len``."""
    from specrl.engine import position_limit

    limit = position_limit(pair.target, pair.draft)
    if limit is None:
        return needed + room
    if needed > limit.positions:
        raise SpecrlError(
            f"a profile run needs {needed} positions (prompt + output) but {limit.has}: "
            "use shorter --contexts, or shorter prompts or max_new_tokens in --prompts"
        )
    return min(needed + room, limit.positions)


def _cell_new_tokens(k_max: int, reps: int) -> int:
    """Tokens a timing cell's rows may generate: the admission step commits 2 (prefill +
    decode), the catch-up step at most K + 1, every round's steps at most K + 1 each."""
    return 2 + (k_max + 1) + reps * sum(k + 1 for k in _round(k_max))


def _check_positions(
    pair,
    *,
    contexts: Sequence[int],
    k_max: int,
    reps: int,
    acceptance_tokens: int | None,
    prompts: PromptFile | None = None,
    tokens=None,
) -> None:
    """Refuse, before anything is timed, a run that needs more positions than the pair has
    (:func:`~specrl.engine.position_limit`): the largest timing cell, the single admissions, and the
    acceptance pass at its longest prompt and output (a prompts file's line without
    ``max_new_tokens`` may draw the presets' longest output)."""
    from specrl.engine import position_limit

    limit = position_limit(pair.target, pair.draft)
    if limit is None:
        return
    positions, has = limit.positions, limit.has
    cell_extra = _cell_new_tokens(k_max, reps)
    if max(contexts) + cell_extra > positions:
        raise SpecrlError(
            f"a profile run needs {max(contexts) + cell_extra} positions (prompt + output) "
            f"but {has}: use shorter --contexts (at most {positions - cell_extra} "
            f"at --k-max {k_max} --reps {reps}), or a lower --k-max or --reps"
        )
    longest_output = acceptance_tokens or DEFAULT_OUTPUT_LENGTHS.hi
    if prompts is None:
        needed = DEFAULT_PROMPT_LENGTHS.hi + longest_output
        if needed > positions:
            raise SpecrlError(
                f"measuring acceptance on the held-out corpus needs {needed} positions "
                f"(prompts up to {DEFAULT_PROMPT_LENGTHS.hi} tokens, outputs up to "
                f"{longest_output}) but {has}: measure on your own prompts "
                "(--prompts, with max_new_tokens on each line)"
            )
        return
    for p, ids in zip(prompts.prompts, tokens.ids):
        n_out = p.max_new_tokens or longest_output
        needed = len(ids) + n_out
        if needed > positions:
            given = (
                f"max_new_tokens {n_out}"
                if p.max_new_tokens
                else f"no max_new_tokens (outputs up to {n_out} tokens are drawn)"
            )
            raise SpecrlError(
                f"{prompts.path}, line {p.line}: the prompt ({len(ids)} tokens) with "
                f"{given} needs {needed} positions, and {has}; shorten the "
                "prompt or give a lower max_new_tokens"
            )


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


class _Cell:
    """One engine at one batch size and prompt length, stepped round by round. Its rows
    rotate through the domains of ``streams`` and through ``settings``, ``(temperature,
    top_p)`` pairs (default: :data:`SAMPLING_CONFIGS`)."""

    def __init__(self, pair, streams, *, batch, context, k_max, reps, device, rng, settings=None):
        self.new_tokens = _cell_new_tokens(k_max, reps)
        self.k_max = k_max
        self.engine = _engine(
            pair,
            max_batch=batch,
            max_len=_max_len(pair, context + self.new_tokens, k_max + 2),
            k_max=k_max,
            device=device,
        )
        configs = list(settings or SAMPLING_CONFIGS.values())
        # Ragged rows, as served traffic is: the longest sets the cell's context, the others
        # draw from [context / 2, context]. Equal-length rows would take the cache's one-copy
        # write path, which a running batch of mixed requests never takes.
        lengths = [context] + rng.integers(max(1, context // 2), context + 1, batch - 1).tolist()
        for i, prompt in enumerate(_prompts(streams, lengths, rng, list(streams))):
            temperature, top_p = configs[i % len(configs)]
            self.engine.add(
                prompt,
                max_new_tokens=self.new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=int(rng.integers(2**62)),
            )
        self.admission = _sample(self.engine.step(0))
        self.samples = [_sample(self.engine.step(k_max))]

    def run_round(self) -> None:
        self.samples += [_sample(self.engine.step(k)) for k in _round(self.k_max)]


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
    """Per ``(batch, context)``: the first replica's admission (prefill) step, then every
    replica's decode steps, as :func:`_sample` dicts."""
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
    on_built=None,
    on_round=None,
) -> TimedCells:
    """The timing procedure that ``specrl profile`` and its freshness check share.

    A warm-up cell, ``warm_up`` (default: the largest batch of ``keys`` at its smallest
    context; a check passes its profile's), runs one round and is discarded: the largest
    steps leave the allocator and caches as the timed cells then find them. Then every
    ``(batch, context)`` of ``keys`` is built :func:`replicas` times, each replica's rows
    drawn by :func:`cell_rng`, and ``reps`` rounds step every cell in turn, with
    :data:`SMALL_ADMISSIONS` single requests, then a group of each size of
    :data:`GROUP_ADMISSIONS`, admitted to one warm engine after each round
    (:func:`_small_admission`). ``on_built()`` is called after each cell is built,
    ``on_round(r)`` after each round."""
    kw = {"k_max": k_max, "reps": reps, "device": device, "settings": settings}
    warm = warm_up or (max(b for b, _ in keys), min(c for _, c in keys))
    _Cell(
        pair, streams, batch=warm[0], context=warm[1], rng=cell_rng(seed, 0, 0, 0), **kw
    ).run_round()
    cells: dict[tuple[int, int], list[_Cell]] = {}
    for b, c in keys:
        cells[b, c] = []
        for r in range(replicas(b)):
            rng = cell_rng(seed, b, c, r)
            cells[b, c].append(_Cell(pair, streams, batch=b, context=c, rng=rng, **kw))
            if on_built is not None:
                on_built()
    engine = _admission_engine(pair, k_max=k_max, device=device)
    admission_rng = cell_rng(seed, 0, 0, 1)
    admissions = []
    for r in range(reps):
        for copies in cells.values():
            for cell in copies:
                cell.run_round()
        admissions += [
            _small_admission(engine, streams, k_max=k_max, rng=admission_rng, rows=rows)
            for rows in [1] * SMALL_ADMISSIONS + list(GROUP_ADMISSIONS)
        ]
        if on_round is not None:
            on_round(r)
    return TimedCells(
        {
            key: [copies[0].admission, *(s for cell in copies for s in cell.samples)]
            for key, copies in cells.items()
        },
        admissions,
    )


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
    steps: a large batch's K>0 has one step a round, too few to read a spread from."""
    medians, logs = [], []
    for k in range(k_max + 1):
        seconds = clean_step_seconds(decode, k)
        medians.append(float(np.median(seconds)))
        logs.append([math.log(t / medians[-1]) for t in seconds])
    pooled = _log_spread([x for at_k in logs for x in at_k])
    spreads = [_log_spread(at_k) if len(at_k) >= SPREAD_STEPS else pooled for at_k in logs]
    return medians, spreads


def _acceptance(
    pair,
    streams,
    *,
    k_max,
    device,
    rng,
    rows: int,
    new_tokens: int | None,
    domains: Sequence[str],
    bands: Sequence[str] = tuple(SAMPLING_CONFIGS),
    edges: Sequence[int] = OUTPUT_EDGES,
    max_batch: int = ACCEPTANCE_BATCH,
    progress=None,
) -> tuple[dict, dict]:
    """Per domain and band: decoding at K=k_max of ``rows`` requests (the band's temperature
    and top-p) whose prompt and output lengths are drawn like the preset workloads' (or
    ``new_tokens`` each, when given), served ``max_batch`` at a time. Returns per-position
    accepted and drafted counts, pooled and per bucket of tokens generated so far (``edges``),
    and every request's steps as ``(bucket, drafted, accepted)`` arrays."""
    counts: dict = {d: {} for d in domains}
    steps: dict = {d: {} for d in domains}
    for domain in domains:
        for band in bands:
            temperature, top_p = SAMPLING_CONFIGS[band]
            lengths = DEFAULT_PROMPT_LENGTHS.sample(rng, rows)
            if new_tokens is None:
                outputs = DEFAULT_OUTPUT_LENGTHS.sample(rng, rows)
            else:
                outputs = np.full(rows, new_tokens)
            prompts = _prompts(streams, lengths, rng, [domain])
            jobs = [
                (prompt, int(n_out), temperature, top_p, int(rng.integers(2**62)))
                for prompt, n_out in zip(prompts, outputs, strict=True)
            ]
            counts[domain][band], steps[domain][band] = _decode(
                pair, jobs, k_max=k_max, device=device, edges=edges, max_batch=max_batch
            )
            if progress is not None:
                progress()
    return counts, steps


def _prompt_acceptance(
    pair,
    prompts: PromptFile,
    ids: Sequence[Sequence[int]],
    *,
    k_max,
    device,
    rng,
    rows: int,
    new_tokens: int | None,
    edges: Sequence[int] = OUTPUT_EDGES,
    max_batch: int = ACCEPTANCE_BATCH,
    progress=None,
) -> tuple[dict, dict]:
    """As :func:`_acceptance`, on a prompts file's prompts (``ids``: each one's token ids);
    the groups are the file's domains at every band it uses (the module docstring says how a
    group is filled). A request's output length: its line's ``max_new_tokens``, else
    ``new_tokens``, else drawn like the preset workloads'."""
    counts: dict = {d: {} for d in prompts.domains}
    steps: dict = {d: {} for d in prompts.domains}
    for domain in prompts.domains:
        own = [i for i, p in enumerate(prompts.prompts) if p.domain == domain]
        for band in prompts.bands:
            chosen = [i for i in own if prompts.prompts[i].band == band]
            settings = {
                i: (prompts.prompts[i].temperature, prompts.prompts[i].top_p) for i in chosen
            }
            if not chosen:
                chosen = own
                settings = dict.fromkeys(own, SAMPLING_CONFIGS[band])
            repeats = 1 if band == "greedy" else math.ceil(rows / len(chosen))
            jobs = []
            for i in chosen * repeats:
                n_out = prompts.prompts[i].max_new_tokens or new_tokens
                if n_out is None:
                    n_out = int(DEFAULT_OUTPUT_LENGTHS.sample(rng, 1)[0])
                jobs.append((list(ids[i]), n_out, *settings[i], int(rng.integers(2**62))))
            counts[domain][band], steps[domain][band] = _decode(
                pair, jobs, k_max=k_max, device=device, edges=edges, max_batch=max_batch
            )
            if progress is not None:
                progress()
    return counts, steps


def _decode(pair, jobs, *, k_max, device, edges, max_batch) -> tuple[dict, np.ndarray]:
    """Decode ``jobs``, ``(prompt ids, max_new_tokens, temperature, top_p, seed)`` each, at
    K=k_max, ``max_batch`` at a time. Returns per-position accepted and drafted counts, pooled
    and per bucket of tokens generated so far (``edges``), and every request's steps as
    ``(request, bucket, drafted, accepted)`` rows."""
    n_buckets = len(edges) + 1
    engine = _engine(
        pair,
        max_batch=min(len(jobs), max_batch),
        max_len=_max_len(pair, max(len(j[0]) + j[1] for j in jobs), k_max + 2),
        k_max=k_max,
        device=device,
    )
    for prompt, n_out, temperature, top_p, seed in jobs:
        engine.add(prompt, max_new_tokens=n_out, temperature=temperature, top_p=top_p, seed=seed)
    acc = [[0] * k_max for _ in range(n_buckets)]
    drafted = [[0] * k_max for _ in range(n_buckets)]
    per_request: list[tuple[int, int, int, int]] = []  # request, bucket, drafted, acc
    while engine.has_work:
        s = engine.step(k_max)
        for rid, g, d, a in zip(
            s.row_request_ids, s.row_generated, s.row_drafted, s.row_accepted, strict=True
        ):
            bucket = bisect.bisect_right(edges, g)
            for i in range(d):
                drafted[bucket][i] += 1
            for i in range(a):
                acc[bucket][i] += 1
            if d:
                per_request.append((rid, bucket, d, a))
    counts = {
        "accepted_per_position": [sum(col) for col in zip(*acc)],
        "drafted_per_position": [sum(col) for col in zip(*drafted)],
        "accepted_by_output": acc,
        "drafted_by_output": drafted,
    }
    return counts, np.array(per_request, dtype=np.int64).reshape(-1, 4)


def _expected_accepted(logits: np.ndarray, drafted: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Per step: expected accepted draft tokens with conditional rates
    ``sigmoid(logits + offset)`` over the first ``drafted`` positions.

    logits: [S, K]; drafted: [S]; offset: [S]. Returns [S]."""
    rates = 1.0 / (1.0 + np.exp(-(logits + offset[:, None])))
    allowed = np.arange(logits.shape[1])[None, :] < drafted[:, None]
    return (np.cumprod(rates, axis=1) * allowed).sum(axis=1)


def _logit(p) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def request_offsets(steps: np.ndarray, rates: Sequence[Sequence[float]]) -> np.ndarray:
    """Each request's acceptance level as a logit offset from the group's ``rates`` (conditional,
    [bucket][position]), shrunk toward 0 by its sampling noise.

    ``steps``: [S, 4] rows of (request, bucket, drafted, accepted). The raw offset makes the
    request's expected accepted count equal its observed one (bisection within
    :data:`LEVEL_BOUND`). A request with few drafted tokens has a noisy raw offset, and the
    surrogate's own per-token draws add that noise again, so each offset is shrunk by
    ``tau^2 / (tau^2 + v_r)``: ``v_r`` is the offset's sampling variance (1 / Fisher
    information of the accepted count), ``tau^2`` the spread between requests net of it.
    Last, one shift for the whole group makes its expected accepted tokens equal the observed
    ones again."""
    if len(steps) == 0:
        return np.zeros(0)
    ids, inverse = np.unique(steps[:, 0], return_inverse=True)
    logits = _logit(rates)[steps[:, 1]]  # [S, K]
    drafted, accepted = steps[:, 2], steps[:, 3].astype(np.float64)
    observed = np.bincount(inverse, weights=accepted)
    lo = np.full(len(ids), -LEVEL_BOUND)
    hi = np.full(len(ids), LEVEL_BOUND)
    for _ in range(40):
        mid = (lo + hi) / 2
        expected = np.bincount(inverse, weights=_expected_accepted(logits, drafted, mid[inverse]))
        below = expected < observed
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    raw = (lo + hi) / 2
    # Fisher information of the offset, numerically: d expected / d offset.
    h = 1e-3
    slope = (
        np.bincount(inverse, weights=_expected_accepted(logits, drafted, raw[inverse] + h))
        - np.bincount(inverse, weights=_expected_accepted(logits, drafted, raw[inverse] - h))
    ) / (2 * h)
    noise = 1.0 / np.maximum(slope, 1e-3)
    tau2 = max(0.0, float(np.var(raw) - np.mean(np.minimum(noise, LEVEL_BOUND**2))))
    shrunk = raw * tau2 / (tau2 + noise)
    # Shrinking moves high rates down more than low ones up (the sigmoid bends), so the
    # group would accept less than it did; one shift restores its accepted total.
    total = accepted.sum()
    lo_s, hi_s = -LEVEL_BOUND, LEVEL_BOUND
    for _ in range(40):
        mid = (lo_s + hi_s) / 2
        expected = _expected_accepted(logits, drafted, shrunk[inverse] + mid).sum()
        lo_s, hi_s = (mid, hi_s) if expected < total else (lo_s, mid)
    return shrunk + (lo_s + hi_s) / 2


DRIFT_PER_TOKEN = (1.0, 0.995, 0.99, 0.985, 0.98, 0.975, 0.97, 0.96, 0.95, 0.93, 0.9, 0.85)
"""Candidate ``phi`` of :func:`fit_level_drift` (1: a fixed level)."""
DRIFT_SCALE = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.65, 1.8, 2.0, 2.25, 2.5, 2.75, 3.0)
"""Candidate ``scale`` of :func:`fit_level_drift`."""
DRIFT_MIN_REQUESTS = 24
"""Fewer requests with tokens drafted in both halves than this: too few to fit a drift; the
level stays fixed (``phi = 1``, ``scale = 1``)."""
DRIFT_REPLICAS = 4
"""Simulated replicas of every measured request per candidate."""


def _request_tokens(steps: np.ndarray) -> np.ndarray:
    """Each measured request's tokens committed by its drafting steps (accepted + 1 each), in
    the order of ``np.unique`` of the request ids."""
    ids, inverse = np.unique(steps[:, 0], return_inverse=True)
    return np.bincount(inverse, weights=steps[:, 3] + 1, minlength=len(ids)).astype(np.int64)


def _drift_statistics(steps: np.ndarray):
    """Across requests (``steps``: rows of (request, bucket, drafted, accepted) in the order
    they ran): the standard deviation of accepted / drafted over requests with at least 24
    drafted, and the correlation of accepted / drafted between each request's first and second
    half of steps (both halves with at least 8 drafted); then their counts and the pooled
    accepted / drafted."""
    ids, inverse = np.unique(steps[:, 0], return_inverse=True)
    n = len(ids)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(steps), dtype=np.int64)
    rank[order] = np.arange(len(steps)) - np.repeat(starts, counts)
    first = rank < ((counts + 1) // 2)[inverse]
    drafted, accepted = steps[:, 2].astype(np.float64), steps[:, 3].astype(np.float64)
    d1 = np.bincount(inverse, weights=drafted * first, minlength=n)
    a1 = np.bincount(inverse, weights=accepted * first, minlength=n)
    d2 = np.bincount(inverse, weights=drafted, minlength=n) - d1
    a2 = np.bincount(inverse, weights=accepted, minlength=n) - a1
    whole = (d1 + d2) >= 24
    both = (d1 >= 8) & (d2 >= 8)
    rate = (a1 + a2)[whole] / (d1 + d2)[whole]
    r1, r2 = a1[both] / d1[both], a2[both] / d2[both]
    sd = float(rate.std()) if whole.sum() > 1 else 0.0
    corr = float(np.corrcoef(r1, r2)[0, 1]) if both.sum() > 2 and r1.std() and r2.std() else 0.0
    pooled = float(accepted.sum() / max(1.0, drafted.sum()))
    return sd, corr, int(whole.sum()), int(both.sum()), pooled


def simulate_requests(
    tokens: np.ndarray,
    logits: np.ndarray,
    edges: Sequence[int],
    grid: np.ndarray,
    phi: float,
    shift: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Requests served as the engine (and the surrogate) serves them at K = ``logits.shape[1]``
    every step, until each has committed its ``tokens``: a row drafts ``min(K, left - 1)``,
    accepts draft token ``i`` with ``sigmoid(logits[bucket, i] + level)`` (``bucket`` by
    tokens generated so far, ``edges``), stops at the first rejection and commits the accepted
    tokens plus one; its level follows ``grid`` (a level per grid point of ``z``,
    :func:`~specrl.profile.levels.level_grid`) plus ``shift``, ``z`` drifting with ``phi`` per
    token. Returns the drafting steps as rows of (request, bucket, drafted, accepted)."""
    k = logits.shape[1]
    left = np.asarray(tokens, dtype=np.int64).copy()
    generated = np.ones(len(left), dtype=np.int64)  # the prefill's token
    z = rng.standard_normal(len(left))
    positions = np.arange(k)[None, :]
    rows = []
    while (live := np.flatnonzero(left > 0)).size:
        drafted = np.minimum(left[live] - 1, k)
        bucket = np.searchsorted(edges, generated[live], side="right")
        level = grid[grid_index(z[live])] + shift
        rates = 1.0 / (1.0 + np.exp(-(logits[bucket] + level[:, None])))
        ok = (rng.random((live.size, k)) < rates) & (positions < drafted[:, None])
        accepted = np.cumprod(ok, axis=1).sum(1)
        drafting = drafted > 0
        rows.append(np.stack([live, bucket, drafted, accepted], axis=1)[drafting])
        committed = accepted + 1
        left[live] -= np.minimum(committed, left[live])
        generated[live] += committed
        z[live] = drift(z[live], phi, committed, rng)
    return np.concatenate(rows) if rows else np.zeros((0, 4), dtype=np.int64)


def fit_level_drift(
    steps: np.ndarray,
    rates: Sequence[Sequence[float]],
    quantiles: Sequence[float],
    edges: Sequence[int] = OUTPUT_EDGES,
    seed: int = 0,
) -> dict:
    """How a group's request levels drift as requests generate: ``{"per_token": phi, "scale":
    s, "shift": c}`` of :mod:`specrl.profile.levels`.

    Indirect inference: the measured requests (``steps``: rows of (request, bucket, drafted,
    accepted) in the order they ran; ``rates``: the group's conditional rates per bucket of
    ``edges`` and position; ``quantiles``: its ``request_levels``) are served again in
    simulation (:func:`simulate_requests`, :data:`DRIFT_REPLICAS` times each, every request
    committing as many tokens as measured) for every candidate of :data:`DRIFT_PER_TOKEN` x
    :data:`DRIFT_SCALE`. The candidate kept is the one whose two statistics
    (:func:`_drift_statistics`: the spread of per-request accepted / drafted, and its
    correlation between each request's two halves) lie nearest to the measured ones, in units
    of their sampling error: computed the same way on measured and simulated requests, both
    carry the same sampling noise. Then ``shift`` makes the simulated requests accept as many
    of their drafted tokens as the measured ones did. Too few requests
    (:data:`DRIFT_MIN_REQUESTS`): a fixed level."""
    fixed = dict(FIXED_LEVEL)
    steps = np.asarray(steps, dtype=np.int64).reshape(-1, 4)
    if len(steps) == 0:
        return fixed
    sd, corr, n_whole, n_both, pooled = _drift_statistics(steps)
    if n_both < DRIFT_MIN_REQUESTS or sd <= 0:
        return fixed
    logits = _logit(rates)
    tokens = np.tile(_request_tokens(steps), DRIFT_REPLICAS)
    se_sd = sd / math.sqrt(2 * n_whole)
    se_corr = max(1e-3, (1 - corr * corr) / math.sqrt(n_both))

    def simulate(phi, scale, shift):
        grid = level_grid(quantiles, scale)
        rng = np.random.default_rng(seed)
        return _drift_statistics(simulate_requests(tokens, logits, edges, grid, phi, shift, rng))

    best, best_loss = (1.0, 1.0), math.inf
    for phi in DRIFT_PER_TOKEN:
        for scale in DRIFT_SCALE:
            s_sd, s_corr, *_ = simulate(phi, scale, 0.0)
            loss = ((s_sd - sd) / se_sd) ** 2 + ((s_corr - corr) / se_corr) ** 2
            if loss < best_loss:
                best, best_loss = (phi, scale), loss
    phi, scale = best
    lo, hi = -1.0, 1.0
    for _ in range(12):  # the shift that accepts as many drafted tokens as measured
        mid = (lo + hi) / 2
        if simulate(phi, scale, mid)[4] < pooled:
            lo = mid
        else:
            hi = mid
    return {"per_token": phi, "scale": scale, "shift": round((lo + hi) / 2, 4)}


def _quantiles(values: np.ndarray, n: int = LEVEL_QUANTILES) -> list[float]:
    if len(values) == 0:
        return [0.0] * n
    return [round(float(q), 4) for q in np.quantile(values, (np.arange(n) + 0.5) / n)]


def conditional_rates(accepted: Sequence[int], drafted: Sequence[int]) -> list[float]:
    """P(token i accepted | tokens < i accepted) from per-position counts (each position's
    accepted count already requires all earlier ones)."""
    rates, prev = [], 1.0
    for a, d in zip(accepted, drafted, strict=True):
        p = a / d if d else 0.0
        rates.append(min(1.0, p / prev) if prev > 0 else 0.0)
        prev = p
    return rates


def _bucket_rates(counts: dict) -> list[list[float]]:
    """Conditional rates per output bucket, each position's counts shrunk toward the pooled
    rate with a prior of ``SHRINK_TOKENS`` drafted tokens."""
    pooled = [
        a / d if d else 0.0
        for a, d in zip(counts["accepted_per_position"], counts["drafted_per_position"])
    ]
    out = []
    for acc, drafted in zip(counts["accepted_by_output"], counts["drafted_by_output"]):
        acc = [a + SHRINK_TOKENS * p for a, p in zip(acc, pooled)]
        drafted = [d + SHRINK_TOKENS for d in drafted]
        out.append(conditional_rates(acc, drafted))
    return out


def _monotone_points(pairs: list[tuple[float, float]]) -> dict:
    """Seconds by padded tokens: the median at each measured token count, made
    non-decreasing (pool adjacent violators, weighted by samples). No line through
    everything: served traffic's small admissions (one request joining a batch) cost a
    forward's fixed time that a line fitted to large prefills underestimates."""
    by_x: dict[float, list[float]] = defaultdict(list)
    for x, y in pairs:
        by_x[float(x)].append(float(y))
    xs = sorted(by_x)
    medians = [float(np.median(by_x[x])) for x in xs]
    fitted = _pava(np.array(medians), np.array([len(by_x[x]) for x in xs])).tolist()
    return {"tokens": xs, "seconds": fitted}


def _admission_engine(pair, *, k_max: int, device: str):
    """The one engine that :func:`_small_admission` admits requests to in turn: warm, as a
    serving engine is when requests join it. Sized for the largest group of
    :data:`GROUP_ADMISSIONS` at the presets' longest prompt, or the pair's positions where it
    has fewer."""
    from specrl.engine import position_limit

    longest = DEFAULT_PROMPT_LENGTHS.hi + k_max + 4
    limit = position_limit(pair.target, pair.draft)
    if limit is not None:
        longest = min(longest, limit.positions)
    return _engine(
        pair,
        max_batch=max(GROUP_ADMISSIONS),
        max_len=_max_len(pair, longest, 4),
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
    for length in lengths:
        prompt = _prompts(streams, [length], rng, [domains[int(rng.integers(len(domains)))]])[0]
        engine.add(prompt, max_new_tokens=k_max + 4)
    prefill = {**_sample(engine.step(0)), "prefill_padded": rows * max(lengths)}
    catchup = _sample(engine.step(k_max))
    while engine.has_work:
        engine.step(0)
    engine.pop_finished()
    return prefill, catchup


def _log_spread(logs: list[float]) -> float:
    """Robust standard deviation of log-ratios: 1.4826 * median absolute deviation."""
    logs = np.asarray(logs)
    return float(1.4826 * np.median(np.abs(logs - np.median(logs))))


def check_acceptance_source(
    source: Profile,
    fingerprint: dict,
    *,
    k_max: int,
    prompts: PromptFile | None,
    acceptance_rows: int,
    acceptance_tokens: int | None,
    where: str = "acceptance_from",
) -> None:
    """Refuse ``source`` as the acceptance of a profile of the pair with ``fingerprint``
    unless it was measured as that profile would measure it: the same target and draft
    weights, ``k_max``, kind of device (a GPU's fp16 numerics are not a CPU's), on the
    held-out corpus, with the same ``acceptance_rows`` and ``acceptance_tokens``."""
    theirs = source.fingerprint
    other = [
        r for r in ("target", "draft") if theirs.get(f"{r}_sha256") != fingerprint[f"{r}_sha256"]
    ]
    if other:
        raise SpecrlError(
            f"{where}: measured on another {' and '.join(other)} (target "
            f"{theirs.get('target_id')}, draft {theirs.get('draft_id')}, whose weights differ "
            "from this pair's); acceptance belongs to the pair: measure it (leave "
            "--acceptance-from out)"
        )
    kind = str(theirs.get("device", "")).split(":")[0]
    here = fingerprint["device"].split(":")[0]
    wanted = {
        "k_max": (source.k_max, k_max),
        "device kind": (kind, here),
        "prompts file (sha256)": (
            (source.meta.get("prompts") or {}).get("sha256"),
            prompts and prompts.sha256,
        ),
        "acceptance_rows": (source.meta.get("acceptance_rows"), acceptance_rows),
        "acceptance_tokens": (source.meta.get("acceptance_tokens"), acceptance_tokens),
    }
    for name, (got, want) in wanted.items():
        if got != want:
            raise SpecrlError(
                f"{where}: its {name} is {got!r}, this profile's is {want!r}; only acceptance "
                "measured as this profile would measure it can stand in: measure it (leave "
                "--acceptance-from out)"
            )


def measure_profile(
    pair,
    *,
    k_max: int = 4,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
    contexts: Sequence[int] = (16, 128, 256),
    reps: int = 5,
    streams: dict[str, list[int]] | None = None,
    device: str = "cpu",
    seed: int = 0,
    acceptance_rows: int = ACCEPTANCE_ROWS,
    acceptance_tokens: int | None = None,
    progress: bool = True,
    preset: str | None = None,
    prompts: PromptFile | None = None,
    acceptance_from: Profile | None = None,
    acceptance_source: str = "acceptance_from",
) -> Profile:
    """Measure ``pair`` on this machine; see the module docstring for what runs.

    ``prompts``: a prompts file (:func:`~specrl.workload.user_prompts.load_prompts`) to
    measure acceptance on, and to cut the timing cells' rows from unless ``streams`` is given;
    default: the held-out corpus's domains.

    ``acceptance_from``: a profile of the same weights whose acceptance fields
    (:data:`ACCEPTANCE_FIELDS`) are taken instead of measuring them again (see
    :func:`check_acceptance_source`, whose errors name it ``acceptance_source``): what a pair
    accepts does not depend on the machine, and measuring it is most of a profile's time.
    Only the step times are measured then."""
    from tqdm.auto import tqdm

    if pair.draft is None:
        raise SpecrlError("profiling needs a draft model; this pair has none")
    if k_max < 1:
        raise SpecrlError(f"k_max must be >= 1 to profile speculation, got {k_max}")
    if list(batch_sizes) != sorted(set(batch_sizes)) or batch_sizes[0] != 1:
        raise SpecrlError(f"batch sizes must increase from 1, got {list(batch_sizes)}")
    if list(contexts) != sorted(set(contexts)) or contexts[0] < 2:
        raise SpecrlError(f"contexts must increase from at least 2, got {list(contexts)}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise SpecrlError(f"reps must be an integer >= 1 (timings per K and cell), got {reps!r}")
    if acceptance_rows < 1:
        raise SpecrlError(f"acceptance_rows must be >= 1, got {acceptance_rows}")
    started = time.perf_counter()
    fingerprint = pair_fingerprint(pair, k_max=k_max, device=device)
    if acceptance_from is not None:
        check_acceptance_source(
            acceptance_from,
            fingerprint,
            k_max=k_max,
            prompts=prompts,
            acceptance_rows=acceptance_rows,
            acceptance_tokens=acceptance_tokens,
            where=acceptance_source,
        )
    settings = tokens = None
    if prompts is not None:
        tokens = tokenize_prompts(prompts, pair.tokenizer)
        streams = streams or tokens.streams
        settings = [(p.temperature, p.top_p) for p in prompts.prompts]
        groups = len(prompts.domains) * len(prompts.bands)
    else:
        groups = len(DOMAINS) * len(SAMPLING_CONFIGS)
    if acceptance_from is not None:
        groups = 0
    _check_positions(  # before the timing, not after it
        pair,
        contexts=contexts,
        k_max=k_max,
        reps=reps,
        acceptance_tokens=acceptance_tokens,
        prompts=prompts,
        tokens=tokens,
    )
    # Rows cut from the held-out corpus are rows a check can rebuild (from the tokenizer
    # alone); a prompts file's streams were set above.
    by_cell = streams is None
    if streams is None:
        from specrl.workload.prompts import token_streams

        streams = token_streams(pair.tokenizer)
    rng = np.random.default_rng(seed)
    keys = [(b, c) for c in contexts for b in batch_sizes]
    n_cells = sum(replicas(b) for b, _ in keys)
    bar = tqdm(total=n_cells + reps + groups, desc="profile", disable=not progress)
    bar.set_postfix_str("timing cells")

    def after_round(r: int) -> None:
        bar.set_postfix_str(f"round {r + 1}/{reps}")
        bar.update()

    timed = time_cells(
        pair,
        streams,
        keys,
        k_max=k_max,
        reps=reps,
        device=device,
        seed=seed,
        settings=settings,
        on_built=bar.update,
        on_round=after_round,
    )
    if acceptance_from is not None:
        accepted = {name: getattr(acceptance_from, name) for name in ACCEPTANCE_FIELDS}
    else:
        bar.set_postfix_str("acceptance")
        common = {
            "k_max": k_max,
            "device": device,
            "rng": rng,
            "rows": acceptance_rows,
            "new_tokens": acceptance_tokens,
            "progress": bar.update,
        }
        if prompts is not None:
            counts, steps = _prompt_acceptance(pair, prompts, tokens.ids, **common)
        else:
            counts, steps = _acceptance(pair, streams, domains=DOMAINS, **common)
        accepted = acceptance_fields(counts, steps)
    bar.close()
    profile = _tabulate(timed, batch_sizes, contexts, k_max, accepted, by_cell=by_cell)
    profile.fingerprint = fingerprint
    profile.meta = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - started, 1),
        "preset": preset,
        "reps": reps,
        "prompt_lengths": list(contexts),
        "acceptance_rows": acceptance_rows,
        "acceptance_tokens": acceptance_tokens,
        "seed": seed,
    }
    if acceptance_from is not None:
        profile.meta["acceptance_from"] = {
            "file": acceptance_source,
            "created": acceptance_from.meta.get("created"),
            "device": acceptance_from.fingerprint.get("device"),
        }
    if prompts is not None:
        profile.meta["prompts"] = prompts.record()
        profile.meta["prompt_lengths_dist"] = asdict(fitted_lengths([len(t) for t in tokens.ids]))
        outputs = file_output_lengths(prompts)
        if outputs is not None:
            profile.meta["output_lengths_dist"] = asdict(outputs)
        profile.meta["prompt_counts"] = {
            d: {
                b: sum(p.domain == d and p.band == b for p in prompts.prompts)
                for b in prompts.bands
            }
            for d in prompts.domains
        }
    return profile


def _pava(y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    blocks: list[list[float]] = []  # [mean, weight, values pooled]
    for v, wv in zip(y, w):
        blocks.append([float(v), float(wv), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, n2), (m1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, _, n in blocks])


def _monotone(table: np.ndarray, axis: int) -> np.ndarray:
    return np.apply_along_axis(_pava, axis, table)


def rest_of_step(sample: dict) -> float:
    """A timed step's seconds outside the tables' verify and draft columns (and outside
    prefill and catch-up, charged apart): its ``overhead_s``. At K=0 the engine's "draft"
    interval is the step's setup before the target forward (sampling settings, uniforms,
    input tensors: 0.3 ms at 8 rows, 1 ms at 64 here), and ``draft_s`` is 0 there, so it
    stays in the rest; subtracting it, as the profile once did, left it out of every K=0
    step, 1-2% cheaper than served."""
    part = sample["draft"] if sample["k"] else 0.0
    return sample["total"] - part - sample["verify"] - sample["prefill"]


def acceptance_fields(counts: dict, request_steps: dict) -> dict:
    """The profile's :data:`ACCEPTANCE_FIELDS` from the acceptance pass: per-position
    ``counts`` and every request's steps, per domain and band."""
    acceptance = {
        d: {
            band: conditional_rates(c["accepted_per_position"], c["drafted_per_position"])
            for band, c in by_band.items()
        }
        for d, by_band in counts.items()
    }
    by_output = {
        "edges": list(OUTPUT_EDGES),
        "rates": {
            d: {band: _bucket_rates(c) for band, c in by_band.items()}
            for d, by_band in counts.items()
        },
    }
    levels = {
        d: {
            band: _quantiles(request_offsets(request_steps[d][band], by_output["rates"][d][band]))
            for band in by_band
        }
        for d, by_band in counts.items()
    }
    drift = {
        d: {
            band: fit_level_drift(
                request_steps[d][band],
                by_output["rates"][d][band],
                levels[d][band],
                by_output["edges"],
            )
            for band in by_band
        }
        for d, by_band in counts.items()
    }
    return {
        "acceptance": acceptance,
        "acceptance_by_output": by_output,
        "acceptance_counts": counts,
        "request_levels": levels,
        "level_drift": drift,
    }


def _tabulate(
    timed: TimedCells, batch_sizes, contexts, k_max, acceptance: dict, *, by_cell: bool
) -> Profile:
    """The profile from the :func:`time_cells` measurements and the
    :func:`acceptance_fields`; with ``by_cell``, the cells' medians and spreads for the
    freshness check (rows it can rebuild: cut from the held-out corpus)."""
    samples, small = timed.cells, timed.admissions
    nb, nk, nc = len(batch_sizes), k_max + 1, len(contexts)
    verify = np.zeros((nb, nk, nc))
    draft = np.zeros((nb, nk, nc))
    overhead = np.zeros((nb, nk))
    sigma = np.zeros(nb)
    ctx_seen = np.zeros(nc)
    prefill, catchup = [], []
    for bi, b in enumerate(batch_sizes):
        rest = defaultdict(list)
        for ci, c in enumerate(contexts):
            steps = samples[b, c]
            admission, decode = steps[0], steps[1:]
            prefill.append((b * c, admission["prefill"]))
            ctx_seen[ci] += np.mean([s["context"] for s in decode]) / nb
            for k in range(nk):
                at_k = [s for s in decode if s["k"] == k]
                verify[bi, k, ci] = np.median([s["verify"] for s in at_k])
                if k:
                    draft[bi, k, ci] = np.median([s["draft"] - s["catchup"] for s in at_k])
                rest[k] += [rest_of_step(s) for s in at_k]
            catchup += [(s["catchup_padded"], s["catchup"]) for s in decode if s["catchup_tokens"]]
        for k in range(nk):
            overhead[bi, k] = max(0.0, float(np.median(rest[k])))
        logs = []
        for ci, c in enumerate(contexts):
            for s in samples[b, c][1:]:
                if s["catchup_tokens"] == 0:
                    table = verify[bi, s["k"], ci] + draft[bi, s["k"], ci] + overhead[bi, s["k"]]
                    logs.append(math.log(s["total"] / table))
        sigma[bi] = _log_spread(logs)
    for table in (verify, draft):
        # Non-decreasing in context only: more context never makes a step cheaper, but a
        # larger batch can (a CPU's kernels change with the shape), and pooling such a pair
        # would make both cells wrong.
        table[:] = _monotone(table, axis=2)
    cells = [cell_statistics(samples[b, contexts[0]][1:], k_max) for b in batch_sizes]
    if not by_cell:
        cells = None
    if np.any(np.diff(ctx_seen) <= 0):
        raise SpecrlError(
            f"measured contexts {ctx_seen.tolist()} do not increase; space the "
            "--contexts further apart"
        )
    per_row = [
        np.mean(
            [
                expected_tokens_per_row(rates, k)
                for by_band in acceptance["acceptance"].values()
                for rates in by_band.values()
            ]
        )
        for k in range(nk)
    ]
    step = verify[:, :, 0] + draft[:, :, 0] + overhead  # [batch, k]
    tokens_per_s = np.array(batch_sizes)[:, None] * np.array(per_row)[None, :] / step
    return Profile(
        fingerprint={},
        batch_sizes=list(batch_sizes),
        contexts=[round(float(c), 1) for c in ctx_seen],
        k_max=k_max,
        verify_s=verify.tolist(),
        draft_s=draft.tolist(),
        overhead_s=overhead.tolist(),
        time_log_sigma=sigma.tolist(),
        prefill=_monotone_points(prefill + [(s["prefill_padded"], s["prefill"]) for s, _ in small]),
        catchup=_monotone_points(catchup + [(s["catchup_padded"], s["catchup"]) for _, s in small]),
        acceptance=acceptance["acceptance"],
        acceptance_by_output=acceptance["acceptance_by_output"],
        acceptance_counts=acceptance["acceptance_counts"],
        request_levels=acceptance["request_levels"],
        tokens_per_s=tokens_per_s.tolist(),
        level_drift=acceptance["level_drift"],
        cell_s=cells and [medians for medians, _ in cells],
        cell_spread=cells and [spreads for _, spreads in cells],
    )


def format_table(profile: Profile) -> str:
    """Measured tokens/s by batch size (rows) and K (columns), as a Markdown table."""
    ks = range(profile.k_max + 1)
    head = "| batch | " + " | ".join("off" if k == 0 else f"K={k}" for k in ks) + " |"
    lines = [head, "|" + "---|" * (profile.k_max + 2)]
    for b, row in zip(profile.batch_sizes, profile.tokens_per_s, strict=True):
        best = int(np.argmax(row))
        cells = [f"**{v:.0f}**" if k == best else f"{v:.0f}" for k, v in enumerate(row)]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
