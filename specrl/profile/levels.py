"""A request's acceptance level as it generates: fixed, or drifting (the profile's
``level_drift``).

A level is a logit offset added to every conditional acceptance rate of the request. Live, a
request's level is not fixed: across requests, accepted / drafted in the first and in the
second half of an output correlate less than a fixed level would make them under the same
sampling noise (docs/profile.md: the figures). A fixed level over-states how much the
acceptance a controller observes predicts what comes next, and lets the requests with the
lowest levels linger to the end of a trace alone.

The drifting level is ``scale * Q(Phi(z)) + shift``: ``Q`` the quantile function of the profile's
``request_levels`` (linear between quantiles, flat beyond the outer ones), ``Phi`` the
standard normal CDF, and ``z`` a standard normal AR(1) process in tokens generated: over ``n``
tokens it keeps ``phi ** n`` of its value and draws the rest afresh, so at every moment ``z``
is standard normal and the level has the same distribution (a Gaussian copula). ``scale``
widens that distribution back: a drifting level averages out over a request, and the
per-request spread the profile measured is that of the average; ``shift`` keeps the group's
accepted tokens as measured (a wider spread of logits lowers high rates).
"""

from __future__ import annotations

import math

import numpy as np

FIXED_LEVEL = {"per_token": 1.0, "scale": 1.0, "shift": 0.0}
"""The ``level_drift`` entry of a level that stays as drawn: the profile's ``request_levels``
as they are, never drifting."""
Z_LIMIT = 4.0
"""``z`` is looked up on a grid over [-Z_LIMIT, Z_LIMIT] (beyond: the grid's ends)."""
Z_STEPS = 1600
"""Grid intervals: 0.005 apart in ``z``."""
_Z = np.linspace(-Z_LIMIT, Z_LIMIT, Z_STEPS + 1)
_PHI = np.array([0.5 * (1.0 + math.erf(z / math.sqrt(2.0))) for z in _Z])


def level_grid(quantiles, scale: float = 1.0) -> np.ndarray:
    """The level at each grid point of ``z``: ``scale * Q(Phi(z))``, ``quantiles`` at
    probabilities ``(i + 0.5) / n`` (the profile's ``request_levels``)."""
    q = np.asarray(quantiles, dtype=np.float64)
    probs = (np.arange(len(q)) + 0.5) / len(q)
    return scale * np.interp(_PHI, probs, q)


def grid_index(z: np.ndarray) -> np.ndarray:
    """Index of the grid point nearest to each ``z`` (the ends beyond the grid)."""
    x = z * (Z_STEPS / (2 * Z_LIMIT))
    x += Z_STEPS / 2 + 0.5
    index = x.astype(np.int64)  # floor of x + 0.5 where x >= 0; x < 0 is clipped below
    np.minimum(index, Z_STEPS, out=index)
    return np.maximum(index, 0, out=index)


def drift(z: np.ndarray, phi: np.ndarray | float, tokens, rng: np.random.Generator):
    """``z`` after ``tokens`` more tokens each (AR(1) with ``phi`` per token): keeps
    ``phi ** tokens`` of it and draws the rest so that ``z`` stays standard normal."""
    keep = np.power(phi, tokens)
    return keep * z + np.sqrt(1.0 - keep * keep) * rng.standard_normal(z.shape)
