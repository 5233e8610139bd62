"""What a K controller observes, computed the same way everywhere: the environments' observation,
the baselines in ``policies/`` and a serving-side controller reading an exported table.

Pure Python on purpose (no numpy, torch or gymnasium): a serving stack imports it on its hot
path, once per step.

* :class:`AcceptanceTracker`: the acceptance estimate (an EMA over the steps that drafted of
  each step's per-token acceptance, which does not depend on the step's K), its staleness
  (steps since a step last drafted) and the last step's accepted / drafted.
* :func:`conditional_acceptance`: a step's per-token acceptance from its accepted / drafted
  and its K.
* :func:`step_time_feature`: a step's seconds on a log scale in [0, 1].
* :func:`batch_bucket`: the batch-size buckets that comparisons report by.
"""

from __future__ import annotations

import math

from specrl.errors import SpecrlError

ACCEPTANCE_EMA = 0.25
"""Weight of the newest step in the acceptance estimate."""
STALE_STEPS = 32
"""Steps without a drafted token after which the acceptance estimate counts as fully stale."""
NEVER_MEASURED = 2**31 - 1
"""``since_measured`` before any step has drafted: at least every probe rule's
``after_steps`` (:mod:`specrl.table`), so a controller whose table says K=0 at the start
probes on its first step instead of running blind until the probe interval has passed."""
ACCEPTANCE_ESTIMATES = ("steps", "requests", "usable")
"""What an observation's acceptance may be: ``"steps"``, the :class:`AcceptanceTracker`
estimate every controller keeps; ``"requests"``, pooled from each request's own accepted
runs; ``"usable"``, the same with each row's draft positions cut where its tokens left end
(:mod:`specrl.posterior`: both envs compute them, and so does the serving controller of a table
that carries its ``request_acceptance`` block)."""


def checked_estimate(name: str) -> str:
    """``name`` if it is one of :data:`ACCEPTANCE_ESTIMATES`, else a :class:`SpecrlError`
    naming them."""
    if name not in ACCEPTANCE_ESTIMATES:
        raise SpecrlError(
            f"acceptance_estimate must be one of {', '.join(ACCEPTANCE_ESTIMATES)}, got {name!r}"
        )
    return name


TEMPERATURE_BANDS = ("greedy", "chat", "default")
"""The sampling bands a profile measures acceptance in (``specrl.workload.SAMPLING_CONFIGS``'
names); a request belongs to the band of :func:`temperature_band`."""


def temperature_band(temperature: float) -> str:
    """The :data:`TEMPERATURE_BANDS` name whose temperature is nearest (0 only for greedy)."""
    if temperature <= 0:
        return "greedy"
    return "chat" if temperature < 0.85 else "default"


BATCH_BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128))
"""Rows decoded per step, grouped as comparisons report them (inclusive bounds)."""


def range_label(lo: int, hi: int) -> str:
    """``"lo-hi"``, or ``"lo"`` for a range of one batch size (inverse: :func:`bucket_bounds`)."""
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


BUCKET_LABELS = tuple(range_label(lo, hi) for lo, hi in BATCH_BUCKETS)


def drafted_acceptance(a: float, k: int) -> float:
    """Expected accepted / drafted at K draft tokens when each is accepted with conditional
    probability ``a`` (given every earlier one was): ``(a + a^2 + ... + a^K) / K``."""
    total, power = 0.0, 1.0
    for _ in range(k):
        power *= a
        total += power
    return total / k


def conditional_acceptance(rate: float, k: int) -> float:
    """The per-token acceptance ``a`` with ``drafted_acceptance(a, k) == rate``: the ``alpha``
    of Leviathan et al. (2023), which a step's accepted / drafted confounds with its K.

    At the same traffic, accepted / drafted falls as K grows (later draft positions are
    reached less often), while ``a`` moves little (what moves is acceptance that decays with
    position). Exact for K <= 2;
    above, Newton's method on ``a + ... + a^K = K * rate`` from ``a = rate^(1/K)``, which is
    above the root (``rate >= a^K``), so the iterates fall to it monotonically: the left side
    is increasing and convex on [0, 1]."""
    if rate <= 0.0:
        return 0.0
    if rate >= 1.0:
        return 1.0
    if k <= 1:
        return rate
    if k == 2:  # a + a^2 = 2 rate
        return (math.sqrt(1.0 + 8.0 * rate) - 1.0) / 2.0
    target, a = k * rate, rate ** (1.0 / k)
    for _ in range(100):
        total = slope = 0.0
        power = 1.0  # a^(i-1)
        for i in range(1, k + 1):
            slope += i * power
            power *= a
            total += power
        step = (total - target) / slope
        a -= step
        if step < 1e-10:
            break
    return min(1.0, max(0.0, a))


def batch_bucket(batch: int) -> str:
    """The label of the bucket holding ``batch`` rows (``"1"``, ``"2-4"``, ... ``"65-128"``);
    above 128 rows the buckets go on in powers of two (``"129-256"``, ``"257-512"``, ...);
    0 rows: ``"0"``."""
    batch = int(batch)
    for (lo, hi), label in zip(BATCH_BUCKETS, BUCKET_LABELS):
        if lo <= batch <= hi:
            return label
    if batch < 1:
        return "0"
    hi = 1 << (batch - 1).bit_length()
    return range_label(hi // 2 + 1, hi)


def bucket_bounds(label: str) -> tuple[int, int]:
    """``(lo, hi)`` of a :func:`batch_bucket` label (inclusive)."""
    lo, _, hi = label.partition("-")
    return int(lo), int(hi or lo)


def bucket_labels(reached=()) -> list[str]:
    """:data:`BUCKET_LABELS`, then the buckets past 128 rows among ``reached``, in order: the
    columns and keys comparisons report (a GPU's batches go past the CPU's 128)."""
    extra = {label for label in reached if label not in BUCKET_LABELS and label != "0"}
    return [*BUCKET_LABELS, *sorted(extra, key=bucket_bounds)]


def step_time_feature(seconds: float) -> float:
    """``clip(1 + log10(seconds) / 4, 0, 1)``: 0.1 ms -> 0, 10 ms -> 0.5, 1 s -> 1."""
    if seconds <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 + math.log10(seconds) / 4.0))


class AcceptanceTracker:
    """The acceptance a controller knows about, updated after every step.

    * ``estimate``: EMA (weight :data:`ACCEPTANCE_EMA`), over the steps that drafted, of each
      step's per-token acceptance (:func:`conditional_acceptance` of its accepted / drafted
      at its K), started at the first such step's (not at 0, which would read low for the
      first several steps); 0 before it. Not accepted / drafted itself: that falls as K
      grows, so a table indexed by it would read the same traffic in another bin after each
      change of K.
    * ``since_measured``: steps since a step last drafted; :data:`NEVER_MEASURED` until a
      step has drafted (nothing measured yet is fully stale, and due for a probe).
    * ``last_rate``: accepted / drafted of the last step, as measured; 0 when it drafted
      nothing.

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

    def observe(self, drafted: int, accepted: int, k: int) -> None:
        """Count one step run at ``k`` draft tokens per row: ``drafted`` draft tokens proposed
        over the batch, ``accepted`` of them accepted. (Rows near their last token draft fewer
        than ``k``; the step is read as if every row drafted ``k``.)"""
        if drafted > 0:
            rate = accepted / drafted
            a = conditional_acceptance(rate, k)
            if self.measured:
                self.estimate += ACCEPTANCE_EMA * (a - self.estimate)
            else:
                self.estimate, self.measured = a, True
            self.since_measured = 0
            self.last_rate = rate
        else:
            self.since_measured = min(self.since_measured + 1, NEVER_MEASURED)
            self.last_rate = 0.0

    @property
    def staleness(self) -> float:
        """``since_measured / STALE_STEPS`` clipped to 1: 0 fresh, 1 fully stale."""
        return min(1.0, self.since_measured / STALE_STEPS)
