"""A profile from a linear cost model instead of measurements: for tests and what-if studies.

Never ship one as a machine's profile; its fingerprint says ``device: "synthetic"`` so
:func:`~specrl.profile.check_compatible` refuses it for any real engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from specrl.profile.schema import Profile
from specrl.workload.trace import DOMAINS, SAMPLING_CONFIGS


def expected_tokens_per_row(rates: Sequence[float], k: int) -> float:
    """``E(K) = 1 + sum_{i<=K} prod_{j<=i} a_j`` with conditional per-position rates."""
    total, survive = 1.0, 1.0
    for a in rates[:k]:
        survive *= a
        total += survive
    return total


def linear_profile(
    *,
    k_max: int = 4,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
    contexts: Sequence[float] = (64.0, 320.0),
    verify_base_s: float = 4e-3,
    verify_token_s: float = 2e-4,
    verify_kv_s: float = 1e-7,
    draft_base_s: float = 5e-4,
    draft_row_s: float = 2e-5,
    overhead_row_s: float = 5e-5,
    token_s: float = 2e-5,
    time_log_sigma: float = 0.05,
    acceptance: Mapping[str, Sequence[float] | Mapping[str, Sequence[float]]] | None = None,
    level_spread: float = 0.0,
) -> Profile:
    """Step time = verify + draft + overhead with

    * verify = ``verify_base_s + verify_token_s * B * (K + 1) + verify_kv_s * B * context``
    * draft = ``K * (draft_base_s + draft_row_s * B)``
    * overhead = ``overhead_row_s * B``; prefill and catch-up: ``token_s`` per token.

    ``acceptance``: ``{domain: rates}`` (the same for every temperature band) or
    ``{domain: {band: rates}}``. Per-request levels are normal with standard deviation
    ``level_spread`` (logit units; 0: every request accepts at the domain's rates).
    """
    # Long: one Profile literal, every field in the order the schema lists them.
    rates = dict(
        acceptance
        or {
            "code": [0.8, 0.7, 0.6, 0.5],
            "prose": [0.6, 0.5, 0.4, 0.3],
            "hard": [0.2, 0.1, 0.1, 0.1],
        }
    )
    bands = list(SAMPLING_CONFIGS)

    def fit(r):
        return (list(r) + [r[-1]] * k_max)[:k_max]

    rates = {
        d: {b: fit(r[b]) for b in bands} if isinstance(r, Mapping) else {b: fit(r) for b in bands}
        for d, r in rates.items()
    }
    quantiles = [level_spread * float(x) for x in _normal_quantiles(33)]
    ks = range(k_max + 1)

    def verify(b, k, c):
        return verify_base_s + verify_token_s * b * (k + 1) + verify_kv_s * b * c

    def draft(b, k):
        return k * (draft_base_s + draft_row_s * b)

    def tokens_per_s(b, k):
        tables = [r for by_band in rates.values() for r in by_band.values()]
        per_row = sum(expected_tokens_per_row(r, k) for r in tables) / len(tables)
        step = verify(b, k, contexts[0]) + draft(b, k) + overhead_row_s * b
        return b * per_row / step

    points = {"tokens": [64.0, 4096.0], "seconds": [64 * token_s, 4096 * token_s]}
    return Profile(
        fingerprint={
            "device": "synthetic",
            "torch": "",
            "transformers": "",
            "target_sha256": "",
            "draft_sha256": "",
            "k_max": k_max,
        },
        batch_sizes=list(batch_sizes),
        contexts=list(contexts),
        k_max=k_max,
        verify_s=[[[verify(b, k, c) for c in contexts] for k in ks] for b in batch_sizes],
        draft_s=[[[draft(b, k) for _ in contexts] for k in ks] for b in batch_sizes],
        overhead_s=[[overhead_row_s * b for _ in ks] for b in batch_sizes],
        time_log_sigma=[time_log_sigma for _ in batch_sizes],
        prefill=dict(points),
        catchup=dict(points),
        acceptance={d: rates[d] for d in DOMAINS if d in rates},
        acceptance_by_output={
            "edges": [64],
            "rates": {
                d: {b: [rates[d][b], rates[d][b]] for b in bands} for d in DOMAINS if d in rates
            },
        },
        acceptance_counts={},
        request_levels={d: {b: list(quantiles) for b in bands} for d in DOMAINS if d in rates},
        tokens_per_s=[[tokens_per_s(b, k) for k in ks] for b in batch_sizes],
        meta={"synthetic": True},
    )


def _normal_quantiles(n: int) -> list[float]:
    """Standard normal quantiles at ``(i + 0.5) / n`` (inverse CDF by bisection on erf)."""
    out = []
    for i in range(n):
        p, lo, hi = (i + 0.5) / n, -8.0, 8.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
                lo = mid
            else:
                hi = mid
        out.append((lo + hi) / 2)
    return out
