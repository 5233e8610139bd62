"""The profile's side of the per-request acceptance estimate
(:mod:`specrl.posterior`): which (domain, temperature band) groups the environments index,
the profile's acceptance by position and tokens generated as logits, and the same as the
``request_acceptance`` block of an exported table, which a serving stack's controller reads.
"""

from __future__ import annotations

import numpy as np

from specrl.features import temperature_band
from specrl.posterior import RequestAcceptance
from specrl.workload import DOMAINS

__all__ = [
    "LogitRates",
    "RequestAcceptance",
    "acceptance_logits",
    "bucket_logits",
    "missing_groups",
    "profile_groups",
    "request_group",
    "request_block",
    "request_posterior",
]


def profile_groups(profile) -> list[tuple[str, str]]:
    """The profile's (domain, temperature band) groups, in the order the environments index
    them: the held-out corpus's domains first, then those of a prompts file it was measured
    on."""
    domains = [d for d in DOMAINS if d in profile.acceptance]
    domains += [d for d in profile.acceptance if d not in DOMAINS]
    return [(d, b) for d in domains for b in profile.bands]


def request_group(group_index: dict, request) -> int:
    """The index of ``request``'s (domain, temperature band) group in ``group_index``
    (:func:`profile_groups` numbered), -1 where the profile has no such group."""
    return group_index.get((request.domain, temperature_band(request.temperature)), -1)


def missing_groups(trace, group_index: dict) -> list[tuple[str, str]]:
    """The (domain, temperature band) groups of ``trace``'s requests that ``group_index``
    lacks, sorted: what an env that reads the profile's acceptance per group refuses."""
    groups = {(r.domain, temperature_band(r.temperature)) for r in trace.requests}
    return sorted(groups - set(group_index))


def acceptance_logits(
    profile, groups: list[tuple[str, str]], max_len: int, k_max: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per group: the logit of the profile's acceptance by tokens generated so far (0 ..
    ``max_len``) and draft position (``[groups, max_len + 1, k_max]``, from
    ``acceptance_by_output``), and the request levels (``request_levels``, logit offsets)."""
    by_output = profile.acceptance_by_output
    bucket = np.searchsorted(by_output["edges"], np.arange(max_len + 1), side="right")
    logits = np.zeros((len(groups), max_len + 1, k_max))
    levels = []
    for i, (d, b) in enumerate(groups):
        rates = np.asarray(by_output["rates"][d][b], dtype=np.float64)[bucket, :k_max]
        rates = np.clip(rates, 1e-6, 1 - 1e-6)
        logits[i] = np.log(rates / (1 - rates))
        levels.append(np.asarray(profile.request_levels[d][b], dtype=np.float64))
    return logits, levels


class LogitRates:
    """``rates(group, level, generated, k)`` from :func:`acceptance_logits`' logits: the
    conditional acceptance of draft positions ``0..k-1``, ``[*S, k]`` for arguments that
    broadcast to ``S``: how the surrogate draws acceptance (its ``_rates``). A class, not a
    closure, so that an env holding one pickles (a training run's saved state does)."""

    def __init__(self, logits: np.ndarray):
        self.logits = logits

    def __call__(self, group, level, generated, k: int) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.logits[group, generated, :k] + level[..., None])))


def bucket_logits(
    profile, groups: list[tuple[str, str]], k_max: int
) -> tuple[list[int], np.ndarray, list[np.ndarray]]:
    """:func:`acceptance_logits` once per bucket of tokens generated: the profile's
    ``acceptance_by_output`` edges, the logits ``[groups, len(edges) + 1, k_max]`` and the
    request levels, the same numbers as at every token of each bucket."""
    edges = [int(e) for e in profile.acceptance_by_output["edges"]]
    logits, levels = acceptance_logits(profile, groups, edges[-1] if edges else 0, k_max)
    return edges, logits[:, [0, *edges]], levels  # the first token count of each bucket


def request_posterior(profile, groups: list[tuple[str, str]], k_max: int) -> RequestAcceptance:
    """The per-request estimate's posterior over ``groups`` of ``profile`` (the envs')."""
    edges, logits, levels = bucket_logits(profile, groups, k_max)
    return RequestAcceptance(logits, edges, k_max, levels, [b for _, b in groups])


def request_block(profile, k_max: int) -> dict:
    """The ``request_acceptance`` block of a table exported from a run on a per-request
    estimate (:mod:`specrl.table.format`): per group, the logits of :func:`acceptance_logits`
    once per bucket of tokens generated (``generated_edges``, the profile's
    ``acceptance_by_output`` edges) and its request levels. The controller's
    :class:`~specrl.posterior.RequestTracker` rebuilds the same rates from it."""
    groups = profile_groups(profile)
    edges, logits, levels = bucket_logits(profile, groups, k_max)
    return {
        "generated_edges": edges,
        "groups": [
            {
                "domain": d,
                "band": b,
                "levels": [float(x) for x in levels[i]],
                "logits": [[float(x) for x in row] for row in logits[i]],
            }
            for i, (d, b) in enumerate(groups)
        ],
    }
