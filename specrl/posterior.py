"""Per-request posteriors over acceptance levels: the figure an observation's ``acceptance``
holds under ``acceptance_estimate="requests"`` or ``"usable"``, for the environments and for
the serving controller.

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

Who computes it: the surrogate from the rows it simulates and the live env from the engine's
per-row accepted runs and its queue (both through :class:`RequestAcceptance`, reading the
profile through ``specrl.envs.request_acceptance``), and a serving stack through
:class:`RequestTracker`, keyed by its request ids and built from the ``request_acceptance``
block of an exported table (:mod:`specrl.table.format`). Numpy, unlike the rest of the
controller's path: it is imported only for a table that carries that block.
"""

from __future__ import annotations

import numpy as np

from specrl.errors import SpecrlError
from specrl.features import conditional_acceptance, temperature_band


class RequestAcceptance:
    """Per-request posteriors over acceptance levels, vectorised over the running rows.

    Each candidate's acceptance depends on the tokens its request has generated only through
    the bucket they fall in (the profile's ``acceptance_by_output`` edges), so its rates,
    log-likelihoods of every run and survival curves are tabulated once per bucket here: a
    step gathers from those tables instead of evaluating a sigmoid per row, candidate and
    position.

    :param logits: ``[groups, len(edges) + 1, >= k_max]``: per group, the logit of the
        conditional acceptance of each draft position by bucket of tokens generated
        (``specrl.envs.request_acceptance.bucket_logits``); a candidate adds its level.
    :param edges: the buckets' edges in tokens generated: bucket ``bisect_right(edges, g)``.
    :param k_max: the largest K.
    :param levels: per group, its candidate level offsets (the profile's request levels).
    :param bands: per group, its temperature band: a request's candidates are the levels of
        every group of its band.
    """

    def __init__(
        self,
        logits: np.ndarray,
        edges,
        k_max: int,
        levels: list[np.ndarray],
        bands: list[str],
    ):
        self.k_max = k_max
        self._edges = np.asarray(edges, dtype=np.int64)
        groups = range(len(levels))
        by_band = {b: [h for h in groups if bands[h] == b] for b in set(bands)}
        width = max(sum(len(levels[h]) for h in members) for members in by_band.values())
        cg = np.zeros((len(levels), width), dtype=np.int64)  # candidate's group
        cl = np.zeros((len(levels), width))  # candidate's level
        self._prior = np.full((len(levels), width), -np.inf)  # log prior (-inf: padding)
        for g in groups:
            members = by_band[bands[g]]
            each = [np.full(len(levels[h]), -np.log(len(levels[h]))) for h in members]
            prior = np.concatenate(each)  # each domain alike, its levels alike within it
            prior -= np.logaddexp.reduce(prior)
            n = len(prior)
            cg[g, :n] = np.concatenate([np.full(len(levels[h]), h) for h in members])
            cl[g, :n] = np.concatenate([levels[h] for h in members])
            self._prior[g, :n] = prior
        # [groups, buckets, candidates, k_max]: each candidate's rate of each position.
        logit = np.asarray(logits, dtype=np.float64)[cg][..., :k_max]  # [g, c, buckets, k]
        rates = 1.0 / (1.0 + np.exp(-(logit + cl[:, :, None, None])))
        rates = rates.transpose(0, 2, 1, 3)
        self._survival = np.cumprod(rates, axis=3)
        clipped = np.clip(rates, 1e-12, 1.0 - 1e-12)
        zeros = np.zeros(clipped.shape[:3] + (1,))
        self._log_run = np.concatenate([zeros, np.cumsum(np.log(clipped), axis=3)], axis=3)
        self._log_miss = np.log1p(-clipped)  # position j drafted and rejected
        first = self._survival[np.arange(len(levels)), self._bucket(np.ones(len(levels)))]
        self._prior_curve = np.einsum("gc,gck->gk", np.exp(self._prior), first)
        self._post = np.zeros((0, width))

    def _bucket(self, generated) -> np.ndarray:
        return np.searchsorted(self._edges, generated, side="right")

    def start(self, requests: int) -> None:
        """A new episode of ``requests`` requests (trace indices ``0..requests-1``)."""
        self._post = np.zeros((requests, self._prior.shape[1]))

    @property
    def capacity(self) -> int:
        """Request indices held: ``0..capacity-1``."""
        return self._post.shape[0]

    def reserve(self, requests: int) -> None:
        """Room for request indices ``0..requests-1``, keeping the posteriors held so far."""
        held = self._post.shape[0]
        if requests > held:
            more = np.zeros((requests - held, self._post.shape[1]))
            self._post = np.concatenate([self._post, more])

    def admit(self, index: int, group: int) -> None:
        """Request ``index`` of ``group`` arrives: its posterior is the prior."""
        self._post[index] = self._prior[group]

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
        bucket = self._bucket(generated)
        log_run = self._log_run[group, bucket]  # [n, candidates, k_max + 1]
        seen = np.take_along_axis(log_run, accepted[:, None, None], axis=2)[..., 0]
        rejected = accepted < drafted
        at = np.minimum(accepted, self.k_max - 1)[:, None, None]
        miss = np.take_along_axis(self._log_miss[group, bucket], at, axis=2)[..., 0]
        seen += np.where(rejected[:, None], miss, 0.0)
        self._post[index] += seen

    def curves(self, index: np.ndarray, group: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """``[n, k_max]``: each running row's posterior probability of accepting draft
        positions ``0..j`` at its ``generated`` tokens."""
        post = self._post[index]
        weights = np.exp(post - post.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        survival = self._survival[group, self._bucket(generated)]
        return np.einsum("nc,nck->nk", weights, survival)

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


class RequestTracker:
    """The per-request estimate on a serving stack: a :class:`RequestAcceptance` keyed by the
    stack's request ids, read from a table's ``request_acceptance`` block.

    A request's temperature picks its band (:func:`~specrl.features.temperature_band`); its
    ``max_tokens`` gives its tokens left, which the ``usable`` figure cuts each row's curve
    at. Request ids are any hashable values.

    :param block: the table's ``request_acceptance`` (validated by
        :class:`~specrl.table.KTable`).
    :param k_max: the table's ``k_max``.
    :param usable: cut each row's curve where its tokens left end (``"usable"``).
    """

    def __init__(self, block: dict, k_max: int, *, usable: bool):
        groups = block["groups"]
        logits = np.array([g["logits"] for g in groups], dtype=np.float64)
        levels = [np.asarray(g["levels"], dtype=np.float64) for g in groups]
        bands = [g["band"] for g in groups]
        self._band_group = {}
        for i, band in enumerate(bands):  # a band's groups share its candidates and prior
            self._band_group.setdefault(band, i)
        self._posterior = RequestAcceptance(logits, block["generated_edges"], k_max, levels, bands)
        self.usable = usable
        self._held: dict = {}  # request id -> (slot, group, max_tokens)
        self._free: list[int] = []

    def __len__(self) -> int:
        """Requests added and not finished."""
        return len(self._held)

    def add(self, request_id, *, temperature: float, max_tokens: int) -> None:
        """Request ``request_id`` arrives (queued or admitted): its posterior is its band's
        prior. ``max_tokens``: the most tokens it generates, its prefill's token included."""
        if request_id in self._held:
            raise SpecrlError(
                f"requests.add: request {request_id!r} was added already; call "
                "requests.finish(request_id) when it ends, before its id is reused"
            )
        band = temperature_band(temperature)
        if band not in self._band_group:
            raise SpecrlError(
                f"requests.add: request {request_id!r} has temperature {temperature!r} (band "
                f"{band!r}), and the table's request_acceptance holds only the bands "
                f"{sorted(self._band_group)}; export it from a run on a profile measured in "
                "that band"
            )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
            raise SpecrlError(
                f"requests.add: max_tokens must be an integer >= 1, got {max_tokens!r}"
            )
        if max_tokens < 1:
            raise SpecrlError(f"requests.add: max_tokens must be >= 1, got {max_tokens}")
        if not self._free:
            held = self._posterior.capacity
            self._posterior.reserve(max(8, 2 * held))
            self._free = list(range(self._posterior.capacity - 1, held - 1, -1))
        slot, group = self._free.pop(), self._band_group[band]
        self._posterior.admit(slot, group)
        self._held[request_id] = (slot, group, int(max_tokens))

    def finish(self, request_id) -> None:
        """Request ``request_id`` ended (or was dropped): its slot is freed."""
        slot, _, _ = self._entry(request_id, "finish")
        del self._held[request_id]
        self._free.append(slot)

    def clear(self) -> None:
        """Forget every request."""
        self._free.extend(slot for slot, _, _ in self._held.values())
        self._held.clear()

    def _entry(self, request_id, where: str) -> tuple[int, int, int]:
        try:
            return self._held[request_id]
        except (KeyError, TypeError):
            raise SpecrlError(
                f"requests.{where}: request {request_id!r} is not held; call "
                "requests.add(request_id, temperature=..., max_tokens=...) when it arrives"
            ) from None

    def _rows(self, request_ids, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        entries = [self._entry(r, where) for r in request_ids]
        if not entries:
            return (np.zeros(0, dtype=np.int64),) * 3
        slot, group, budget = (np.array(x, dtype=np.int64) for x in zip(*entries))
        return slot, group, budget

    def observe(self, request_ids, generated, drafted, accepted) -> None:
        """Fold in one step's runs, one entry per row: the row's request, its tokens generated
        before the step, the draft tokens it drafted and how many of them it accepted (0 and
        0 for a row the step did not draft for)."""
        slot, group, _ = self._rows(request_ids, "observe")
        generated, drafted, accepted = (
            np.asarray(x, dtype=np.int64).reshape(-1) for x in (generated, drafted, accepted)
        )
        if not len(slot) == len(generated) == len(drafted) == len(accepted):
            raise SpecrlError(
                "requests.observe: request_ids, generated, drafted and accepted must have one "
                f"entry per row, got {len(slot)}, {len(generated)}, {len(drafted)} and "
                f"{len(accepted)}"
            )
        if ((accepted < 0) | (accepted > drafted)).any():
            raise SpecrlError(
                "requests.observe: every row needs 0 <= accepted <= drafted (its draft tokens "
                "and how many of them were accepted)"
            )
        self._posterior.observe(slot, group, generated, accepted, drafted)

    def decodes(self, running, incoming=()) -> bool:
        """Whether the coming step decodes a row: one of ``running``, or one of ``incoming``
        that does not end on its prefill token (:meth:`estimate` is then not None). Every id
        is checked as :meth:`estimate` checks it."""
        running = list(running)
        slot, _, _ = self._rows([r for r, _ in running], "estimate")
        np.array([g for _, g in running], dtype=np.int64)  # refused as estimate refuses it
        _, _, budget = self._rows(list(incoming), "estimate")
        return len(slot) > 0 or bool((budget > 1).any())

    def estimate(self, running, incoming=()) -> float | None:
        """The per-token acceptance of the coming step: ``running``, its decoding rows as
        ``(request_id, tokens generated)`` pairs, and ``incoming``, the ids of the requests
        it admits (prefilled this step). None when it decodes no row."""
        running = list(running)
        slot, group, budget = self._rows([r for r, _ in running], "estimate")
        generated = np.array([g for _, g in running], dtype=np.int64)
        _, new_group, new_budget = self._rows(list(incoming), "estimate")
        decoded = new_budget > 1  # one that ends on its prefill token is not decoded
        left = None
        if self.usable:
            left = (budget - generated, new_budget[decoded] - 1)
        return self._posterior.estimate(slot, group, generated, new_group[decoded], left)
