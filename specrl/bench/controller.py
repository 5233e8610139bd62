"""``specrl bench controller``: nanoseconds per :meth:`LookupController.choose_k` call.

The calls cycle through batch sizes (and context lengths, for a table that has context
bins) drawn once with a fixed seed, with a fresh acceptance estimate, so every call takes
the lookup path a serving stack takes on most steps. The figure includes the Python loop
around the call, as a serving stack's own loop would. A table on a per-request estimate also
gets the per-step cost of computing it (:func:`bench_requests`).
"""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

from specrl.controller import LookupController
from specrl.errors import SpecrlError
from specrl.table import KTable, load_table
from specrl.table.build import table_from_policy

TARGET_NS = 2000
"""The controller's budget per call: 2 µs."""


def example_table(max_batch: int = 128, k_max: int = 4) -> KTable:
    """A table of the usual shape: every batch size, five acceptance bins, K falling with
    the batch and rising with acceptance."""

    def decide(batch: int, acceptance: float, context: int) -> int:
        return max(0, min(k_max, round(acceptance * (k_max + 1)) - batch.bit_length() // 2))

    return table_from_policy(
        decide,
        k_max=k_max,
        max_batch=max_batch,
        acceptance_edges=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
        provenance={
            "profile_sha256": "",
            "profile_fingerprint": {},
            "target_id": "",
            "draft_id": "",
            "run_id": "bench",
            "training_steps": 0,
            "specrl_version": "",
            "created": "",
        },
    )


def bench_controller(path: str | Path | None = None, calls: int = 1_000_000) -> float:
    """Nanoseconds per ``choose_k`` call on the table at ``path`` (None: :func:`example_table`)
    over ``calls`` calls."""
    if calls < 1:
        raise SpecrlError(f"calls must be >= 1, got {calls}")
    controller = LookupController.load(path) if path else LookupController(example_table())
    if controller.requests is None:
        controller.observe(8, 6, k=2)
    else:  # the estimate as a per-request table's choose_k(rows=...) leaves it
        controller.tracker.estimate, controller.tracker.since_measured = 0.7, 0
    rng = random.Random(0)
    table = controller.table
    batches = [rng.randint(1, table.max_batch) for _ in range(1024)]
    starts = table.context_starts
    contexts = [rng.randint(1, 2 * starts[-1]) for _ in range(1024)]
    choose_k = controller.choose_k
    args = list(itertools.islice(itertools.cycle(zip(batches, contexts)), min(calls, 1 << 16)))
    done, start = 0, time.perf_counter_ns()
    while done < calls:
        for batch, context in args[: calls - done]:
            choose_k(batch, None, context)
        done += min(len(args), calls - done)
    return (time.perf_counter_ns() - start) / calls


def bench_requests(path: str | Path, batch: int = 64, steps: int = 2000) -> float:
    """Microseconds per step of a table on a per-request estimate at ``batch`` rows: one
    ``choose_k(rows=...)`` and one ``requests.observe`` of every row's run, the serving
    loop's work for that estimate (rows finish and are replaced as they reach their
    ``max_tokens``)."""
    controller = LookupController.load(path)
    requests = controller.requests
    rng = random.Random(0)
    rows, next_id = {}, 0  # id: [generated, max_tokens]
    start = time.perf_counter_ns()
    for _ in range(steps):
        while len(rows) < batch:
            max_tokens = rng.randint(16, 512)
            requests.add(next_id, temperature=rng.choice((0.0, 0.7, 1.0)), max_tokens=max_tokens)
            rows[next_id], next_id = [1, max_tokens], next_id + 1
        k = controller.choose_k(len(rows), rows=[(r, g) for r, (g, _) in rows.items()])
        ids = list(rows)
        drafted = [max(0, min(k, rows[r][1] - rows[r][0] - 1)) for r in ids]
        accepted = [rng.randint(0, d) for d in drafted]
        requests.observe(ids, [rows[r][0] for r in ids], drafted, accepted)
        for r, a in zip(ids, accepted):
            rows[r][0] += a + 1
            if rows[r][0] >= rows[r][1]:
                del rows[r]
                requests.finish(r)
    return (time.perf_counter_ns() - start) / steps / 1000


def run(args) -> int:
    ns = bench_controller(args.table, args.calls)
    what = args.table or "an example table (every batch size 1-128, 5 acceptance bins)"
    print(f"LookupController.choose_k on {what}: {ns:.0f} ns per call over {args.calls:,} calls")
    print(f"budget {TARGET_NS} ns: {ns / TARGET_NS:.2f}x of it")
    if args.table and load_table(args.table).request_acceptance is not None:
        for batch in (8, 64):
            us = bench_requests(args.table, batch=batch)
            print(
                f"per-request estimate at batch {batch}: {us:.0f} us per step "
                "(choose_k with rows, then requests.observe of every row)"
            )
    return 0
