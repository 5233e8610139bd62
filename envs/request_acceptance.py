"""The batch's acceptance from each running request's own accepted runs: the observation's
``acceptance`` entry under ``acceptance_estimate="requests"`` or ``"usable"``.

The default estimate (:class:`~specrl.features.AcceptanceTracker`) is an EMA over steps of the
batch's accepted / drafted: one figure that lags a change of the batch's make-up and is
noisy at small batch. Here every request keeps a posterior over acceptance levels instead:

* the candidates are the profile's request levels (``request_levels``) of every domain in the
  request's temperature band, each domain alike (a server knows a request's temperature, not
  its domain);
* each step that drafted for the request multiplies in the probability of the run it
  accepted: positions ``0..a-1`` accepted and, unless all were, position ``a`` rejected, with
  the profile's acceptance by position and tokens generated (``acceptance_by_output``) offset
  by the candidate level, as the surrogate draws them;
* the estimate for the coming step is the mean, over the rows it decodes (those it admits
  included, at their prior), of each row's posterior survival curve (the probability of
  accepting draft positions ``0..j``), squeezed to one per-token acceptance ``a`` with the
  same accepted / drafted at ``k_max`` (:func:`~specrl.features.conditional_acceptance`):
  the form the observation's axis and a table's acceptance bins have;
* ``"usable"`` cuts each row's curve first where the row can draft no further (a row with
  ``t`` tokens left drafts at most ``t - 1``): the figure then falls as rows near their end,
  which a table indexed by batch size and one figure cannot see otherwise.

Why: on the ramp workload the myopic oracle gains about 2% over the engineer's tuned
schedule, and run from this estimate the same rule keeps more than half of that, from the
step EMA none (docs/results.md, "What each request's own accepted runs are worth").

A request's level is taken as fixed; the surrogate's levels drift as a request generates.

Both environments compute it: the surrogate from the rows it simulates, the live env from the
engine's per-row accepted runs and its queue, each reading the profile's acceptance through
:func:`acceptance_logits`.
"""

from __future__ import annotations

import numpy as np

from specrl.features import conditional_acceptance
from specrl.workload import DOMAINS


def profile_groups(profile) -> list[tuple[str, str]]:
    """The profile's (domain, temperature band) groups, in the order the environments index
    them: the held-out corpus's domains first, then those of a prompts file it was measured
    on."""
    domains = [d for d in DOMAINS if d in profile.acceptance]
    domains += [d for d in profile.acceptance if d not in DOMAINS]
    return [(d, b) for d in domains for b in profile.bands]


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
    broadcast to ``S``: how the surrogate draws acceptance (its ``_rates``) and how both
    envs' per-request estimates read it. A class, not a closure, so that an env holding one
    pickles (a training run's saved state does)."""

    def __init__(self, logits: np.ndarray):
        self.logits = logits

    def __call__(self, group, level, generated, k: int) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.logits[group, generated, :k] + level[..., None])))


class RequestAcceptance:
    """Per-request posteriors over acceptance levels, vectorised over the running rows.

    :param rates: ``rates(group, level, generated, k)``: the conditional acceptance of draft
        positions ``0..k-1`` of requests of ``group`` at ``level`` with ``generated`` tokens,
        ``[*S, k]`` for arguments that broadcast to ``S`` (``SurrogateSpecEnv._rates``: the
        estimate reads acceptance as the surrogate draws it).
    :param k_max: the largest K.
    :param levels: per group, its candidate level offsets (the profile's request levels).
    :param bands: per group, its temperature band: a request's candidates are the levels of
        every group of its band.
    """

    def __init__(self, rates, k_max: int, levels: list[np.ndarray], bands: list[str]):
        self._candidate_rates = rates
        self.k_max = k_max
        groups = range(len(levels))
        by_band = {b: [h for h in groups if bands[h] == b] for b in set(bands)}
        width = max(sum(len(levels[h]) for h in members) for members in by_band.values())
        self._cg = np.zeros((len(levels), width), dtype=np.int64)  # candidate's group
        self._cl = np.zeros((len(levels), width))  # candidate's level
        self._prior = np.full((len(levels), width), -np.inf)  # log prior (-inf: padding)
        for g in groups:
            members = by_band[bands[g]]
            cg = np.concatenate([np.full(len(levels[h]), h) for h in members])
            cl = np.concatenate([levels[h] for h in members])
            each = [np.full(len(levels[h]), -np.log(len(levels[h]))) for h in members]
            prior = np.concatenate(each)  # each domain alike, its levels alike within it
            prior -= np.logaddexp.reduce(prior)
            width_g = len(cg)
            self._cg[g, :width_g], self._cl[g, :width_g], self._prior[g, :width_g] = cg, cl, prior
        first = self._survival(np.arange(len(levels)), np.ones(len(levels), dtype=np.int64))
        weights = np.exp(self._prior)
        self._prior_curve = np.einsum("gc,gck->gk", weights, first)  # [groups, k_max]
        self._post = np.zeros((0, width))

    def start(self, requests: int) -> None:
        """A new episode of ``requests`` requests (trace indices ``0..requests-1``)."""
        self._post = np.zeros((requests, self._prior.shape[1]))

    def admit(self, index: int, group: int) -> None:
        """Request ``index`` of ``group`` arrives: its posterior is the prior."""
        self._post[index] = self._prior[group]

    def _rates(self, group: np.ndarray, generated: np.ndarray, k: int) -> np.ndarray:
        """``[n, candidates, k]``: each row's candidates' conditional acceptance of draft
        positions ``0..k-1`` at ``generated`` tokens."""
        return self._candidate_rates(self._cg[group], self._cl[group], generated[:, None], k)

    def _survival(self, group: np.ndarray, generated: np.ndarray) -> np.ndarray:
        return np.cumprod(self._rates(group, generated, self.k_max), axis=2)

    def observe(
        self,
        index: np.ndarray,
        group: np.ndarray,
        generated: np.ndarray,
        accepted: np.ndarray,
        drafted: np.ndarray,
    ) -> None:
        """Fold in one step's runs: row ``i`` (request ``index[i]`` of ``group[i]``, with
        ``generated[i]`` tokens before the step) drafted ``drafted[i]`` tokens and accepted
        the first ``accepted[i]`` of them. Rows that drafted nothing learn nothing."""
        on = drafted > 0
        if not on.any():
            return
        index, group, generated = index[on], group[on], generated[on]
        accepted, drafted = accepted[on], drafted[on]
        k = int(drafted.max())
        rates = np.clip(self._rates(group, generated, k), 1e-12, 1.0 - 1e-12)
        log_run = np.concatenate(
            [np.zeros(rates.shape[:2] + (1,)), np.cumsum(np.log(rates), axis=2)], axis=2
        )
        seen = np.take_along_axis(log_run, accepted[:, None, None], axis=2)[..., 0]
        rejected = accepted < drafted
        at = np.minimum(accepted, k - 1)[:, None, None]
        miss = np.log1p(-np.take_along_axis(rates, at, axis=2)[..., 0])
        seen += np.where(rejected[:, None], miss, 0.0)
        self._post[index] += seen

    def curves(self, index: np.ndarray, group: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """``[n, k_max]``: each running row's posterior probability of accepting draft
        positions ``0..j`` at its ``generated`` tokens."""
        post = self._post[index]
        weights = np.exp(post - post.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        return np.einsum("nc,nck->nk", weights, self._survival(group, generated))

    def estimate(
        self,
        index: np.ndarray,
        group: np.ndarray,
        generated: np.ndarray,
        incoming: np.ndarray,
        left: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> float | None:
        """The per-token acceptance of the coming step's batch: its running rows (``index``,
        ``group``, ``generated``) at their posteriors and the requests it admits (their
        groups, ``incoming``) at their priors, pooled (see the module). With ``left`` (the
        running rows' tokens left, the admitted rows'), each row's curve is cut past the
        positions it can still draft (``"usable"``). None when it decodes no row."""
        if len(index) + len(incoming) == 0:
            return None
        running, admitted = self.curves(index, group, generated), self._prior_curve[incoming]
        if left is not None:
            positions = np.arange(self.k_max)
            running = running * (positions < (np.asarray(left[0]) - 1)[:, None])
            admitted = admitted * (positions < (np.asarray(left[1]) - 1)[:, None])
        total = running.sum() + admitted.sum()
        rate = float(total) / ((len(index) + len(incoming)) * self.k_max)
        return conditional_acceptance(rate, self.k_max)
