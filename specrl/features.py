"""What a K controller observes, computed the same way everywhere: the environments' observation,
the baselines in ``policies/`` and a serving-side controller reading an exported table.

Pure Python on purpose (no numpy, torch or gymnasium): a serving stack imports it on its hot
path, once per step.

* :class:`AcceptanceTracker`: the acceptance estimate (an EMA of accepted / drafted over steps
  that drafted), its staleness (steps since a step last drafted) and the last step's rate.
* :func:`step_time_feature`: a step's seconds on a log scale in [0, 1].
* :func:`batch_bucket`: the batch-size buckets that comparisons report by.
"""

from __future__ import annotations

import math

ACCEPTANCE_EMA = 0.25
"""Weight of the newest step in the acceptance estimate."""
STALE_STEPS = 32
"""Steps without a drafted token after which the acceptance estimate counts as fully stale."""
NEVER_MEASURED = 2**31 - 1
"""``since_measured`` before any step has drafted: at least every probe rule's
``after_steps`` (:mod:`specrl.table`), so a controller whose table says K=0 at the start
probes on its first step instead of running blind until the probe interval has passed."""
BATCH_BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128))
"""Rows decoded per step, grouped as comparisons report them (inclusive bounds)."""
BUCKET_LABELS = tuple(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in BATCH_BUCKETS)


def batch_bucket(batch: int) -> str:
    """The label of the bucket holding ``batch`` rows (``"1"``, ``"2-4"``, ... ``"65-128"``);
    above 128 rows, ``">128"``."""
    for (lo, hi), label in zip(BATCH_BUCKETS, BUCKET_LABELS):
        if lo <= batch <= hi:
            return label
    return ">128" if batch > BATCH_BUCKETS[-1][1] else "0"


def step_time_feature(seconds: float) -> float:
    """``clip(1 + log10(seconds) / 4, 0, 1)``: 0.1 ms -> 0, 10 ms -> 0.5, 1 s -> 1."""
    if seconds <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 + math.log10(seconds) / 4.0))


class AcceptanceTracker:
    """The acceptance a controller knows about, updated after every step.

    * ``estimate``: EMA (weight :data:`ACCEPTANCE_EMA`) of accepted / drafted over the steps
      that drafted, started at the first such step's rate (not at 0, which would read low
      for the first several steps); 0 before it.
    * ``since_measured``: steps since a step last drafted; :data:`NEVER_MEASURED` until a
      step has drafted (nothing measured yet is fully stale, and due for a probe).
    * ``last_rate``: accepted / drafted of the last step; 0 when it drafted nothing.

    A step with K=0 drafts nothing, so the estimate is not updated but ages: ``staleness``
    says how much, rather than the estimate being guessed.
    """

    __slots__ = ("estimate", "since_measured", "last_rate", "measured")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.estimate = 0.0
        self.since_measured = NEVER_MEASURED
        self.last_rate = 0.0
        self.measured = False

    def observe(self, drafted: int, accepted: int) -> None:
        """Count one step: ``drafted`` draft tokens proposed over the batch, ``accepted`` of
        them accepted."""
        if drafted > 0:
            rate = accepted / drafted
            if self.measured:
                self.estimate += ACCEPTANCE_EMA * (rate - self.estimate)
            else:
                self.estimate, self.measured = rate, True
            self.since_measured = 0
            self.last_rate = rate
        else:
            self.since_measured = min(self.since_measured + 1, NEVER_MEASURED)
            self.last_rate = 0.0

    @property
    def staleness(self) -> float:
        """``since_measured / STALE_STEPS`` clipped to 1: 0 fresh, 1 fully stale."""
        return min(1.0, self.since_measured / STALE_STEPS)
