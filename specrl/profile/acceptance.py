"""The acceptance pass of ``specrl profile``: what the pair accepts, decoded with the engine.

Per domain and temperature band (each of ``SAMPLING_CONFIGS``), requests with prompt and
output lengths drawn like the preset workloads' are decoded at K=k_max, 128 at a time;
per-position accepted / drafted counts give the conditional rates, pooled and by how many
tokens the row had generated (``OUTPUT_EDGES``): the default pair's target drifts into
repetition as it generates, which its draft predicts well, so acceptance climbs with output
length. Sparse buckets are shrunk toward the pooled rates.

With a prompts file (``specrl profile --prompts P.jsonl``, :mod:`specrl.workload.user_prompts`)
acceptance is measured on the file's prompts instead, per domain of the file and per
temperature band that any of its prompts falls in (every domain at every such band, as the
profile format has it). A domain's prompts of the band run with their own temperature, top_p
and max_new_tokens; a domain with no prompt in a band runs its prompts at the band's
setting. Sampled bands cycle through their prompts until ``acceptance_rows`` requests
(greedy ones decode each prompt once: a repeat would be the same request).

Every request's steps are kept as well: :mod:`specrl.profile.level_fit` reads each request's
acceptance level, and how levels drift, from them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from specrl.profile.engines import build_engine, cut_prompts, engine_max_len
from specrl.workload.trace import DEFAULT_OUTPUT_LENGTHS, DEFAULT_PROMPT_LENGTHS, SAMPLING_CONFIGS
from specrl.workload.user_prompts import PromptFile

OUTPUT_EDGES = (16, 32, 64, 128)
"""Acceptance buckets by tokens generated so far: [0, 16), [16, 32), ..., [128, inf)."""
SHRINK_TOKENS = 32
"""Prior weight, in drafted tokens, pulling a bucket's rate toward the pooled rate."""
ACCEPTANCE_ROWS = 384
"""Requests decoded per domain and temperature band to measure acceptance. Acceptance is
strongly per request, so the sample must hold many requests: too few, and the surrogate reads
the live engine's acceptance low (docs/profile.md: how low, by sample size)."""
ACCEPTANCE_BATCH = 128
"""How many of them run at once (continuous batching serves the rest as rows free up)."""


def corpus_acceptance(
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
            prompts = cut_prompts(streams, lengths, rng, [domain])
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


def prompt_acceptance(
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
    """As :func:`corpus_acceptance`, on a prompts file's prompts (``ids``: each one's token ids);
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
    engine = build_engine(
        pair,
        max_batch=min(len(jobs), max_batch),
        max_len=engine_max_len(pair, max(len(j[0]) + j[1] for j in jobs), k_max + 2),
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


def conditional_rates(accepted: Sequence[int], drafted: Sequence[int]) -> list[float]:
    """P(token i accepted | tokens < i accepted) from per-position counts (each position's
    accepted count already requires all earlier ones)."""
    rates, prev = [], 1.0
    for a, d in zip(accepted, drafted, strict=True):
        p = a / d if d else 0.0
        rates.append(min(1.0, p / prev) if prev > 0 else 0.0)
        prev = p
    return rates


def bucket_rates(counts: dict) -> list[list[float]]:
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
