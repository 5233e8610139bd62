"""``specrl bench controller``: nanoseconds per :meth:`LookupController.choose_k` call.

The calls cycle through batch sizes (and context lengths, for a table that has context
bins) drawn once with a fixed seed, with a fresh acceptance estimate, so every call takes
the lookup path a serving stack takes on most steps. The figure includes the Python loop
around the call, as a serving stack's own loop would.
"""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

from specrl.controller import LookupController
from specrl.errors import SpecrlError
from specrl.table import KTable
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
    controller.observe(8, 6, k=2)
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


def run(args) -> int:
    ns = bench_controller(args.table, args.calls)
    what = args.table or "an example table (every batch size 1-128, 5 acceptance bins)"
    print(f"LookupController.choose_k on {what}: {ns:.0f} ns per call over {args.calls:,} calls")
    print(f"budget {TARGET_NS} ns: {ns / TARGET_NS:.2f}x of it")
    return 0
