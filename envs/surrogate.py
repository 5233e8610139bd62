"""``SurrogateSpecEnv``: the live environment's spaces, workloads and reward, driven by a
hardware profile instead of models. The fast place to train."""

from __future__ import annotations

import math
import warnings
from collections import deque
from importlib import resources
from pathlib import Path

import numpy as np

from specrl.envs.base import ACCEPTANCE, STALENESS, Served, SpecEnvBase
from specrl.envs.request_acceptance import (
    LogitRates,
    acceptance_logits,
    missing_groups,
    profile_groups,
    request_group,
    request_posterior,
)
from specrl.errors import SpecrlError, SpecrlWarning
from specrl.features import checked_estimate
from specrl.profile.costs import CONTEXT_BUCKET, StepCosts
from specrl.profile.fingerprint import device_name
from specrl.profile.levels import FIXED_LEVEL, Z_STEPS, grid_index, level_grid
from specrl.profile.schema import Profile, load_profile
from specrl.workload import profile_workload_kwargs

DEFAULT_PROFILE = "default-cpu.json"
_warned_default_hardware = False
_warned_extrapolation: set[tuple[int, int]] = set()


def default_profile_path() -> Path:
    return Path(str(resources.files("specrl") / "assets" / "profiles" / DEFAULT_PROFILE))


class SurrogateSpecEnv(SpecEnvBase):
    """Speculative decoding with a per-step choice of K, simulated from a measured profile.

    Everything the agent sees and is paid is defined as in :class:`LiveSpecEnv`; only the
    server differs. PPO trains on it through :class:`~specrl.envs.training.TrainingEnv`, whose
    observation, probe rule, reward and episode start are the training MDP's.

    ## Action Space

    ``Discrete(k_max + 1)``: K for this step, 0 = speculation off.

    ## Observation Space

    ``Box(0, 1, (8,), float32)``: batch, queue, acceptance, staleness, step_time, context,
    last_k, last_accept; the table with meanings and scales is in :class:`LiveSpecEnv`.

    ## Rewards

    ``(committed - reference_tokens_per_s * step_seconds) / max_batch``; a complete episode's
    return ranks policies as aggregate tokens/s does (see :class:`LiveSpecEnv`).

    ## Starting State

    A preset workload draws a new trace from ``np_random`` on every reset; a fixed trace (or
    ``options={"trace": ...}``) is replayed as is.

    ## Episode End

    Terminated when every request of the trace has finished; no truncation of its own.

    ## Simulation

    Per step, the time is ``(table(B, K, max context) + prefill(padded prompt tokens) +
    catchup(padded catch-up tokens)) * exp(sigma_B * z)``, ``z ~ N(0, 1)``: a lognormal
    around the profile's medians, interpolated linearly in B and context (and extended
    linearly past the measured grid), with the measured spread ``sigma_B``
    (:class:`~specrl.profile.costs.StepCosts`). Each row drafts ``min(K, tokens left - 1)``
    tokens and accepts draft token ``i`` with probability ``sigmoid(logit(a) + level)``:
    ``a`` the profile's conditional rate for the request's domain, temperature band, position
    and tokens generated so far (``acceptance_by_output``), ``level`` the request's own
    acceptance level, drawn when it arrives from the profile's ``request_levels`` (so the
    acceptance a controller observes rises and falls with the batch's composition, as live)
    and, where the profile has a ``level_drift``, drifting as the request generates
    (:mod:`specrl.profile.levels`; without one it stays fixed);
    it stops at the first rejection and commits the accepted tokens plus one. Admission
    follows the engine: the prefill commits each new request's first token. So does the
    draft's catch-up: a row falls behind by one token per K=0 step and by its prompt and
    first token on admission, and is caught up at the next K>0 step. All randomness comes
    from ``self.np_random``: a seed and the actions fix the trajectory.

    The draws are common random numbers: at reset, each request of the trace gets its level
    at every token it will generate and one uniform per output position that its draft token
    there is accepted against, and the step times' noise has a stream of its own. As in
    greedy serving, where the output, and so whether the draft guesses each token, does not
    depend on K, a token is as easy to draft whatever the steps around it chose; two
    controllers played on one seed differ by their choices, not their draws (a paired
    comparison needs fewer episodes, docs/profile.md).

    ## Arguments

    * ``profile`` (path or :class:`~specrl.profile.Profile`): default: the profile shipped
      with specrl (the default pair on a 2-core CPU; a warning once when this machine differs).
    * ``workload``, ``workload_kwargs``, ``max_batch``, ``max_len``,
      ``reference_tokens_per_s``: as for :class:`LiveSpecEnv`. For a profile measured on a
      prompts file, ``workload_kwargs`` start from
      :func:`~specrl.workload.profile_workload_kwargs` (the file's domains and bands in its
      prompt shares); keys given override them.
    * ``k_max``: largest K; default: the profile's; larger than the profile's is an error.
    * ``acceptance_estimate``: what the observation's ``acceptance`` entry is. ``"steps"``
      (default): the step EMA every controller keeps (:class:`~specrl.features.
      AcceptanceTracker`), as live. ``"requests"``: the batch's acceptance pooled from each
      request's posterior over its own accepted runs
      (:class:`~specrl.posterior.RequestAcceptance`); it is never stale, so
      ``staleness`` reads 0. ``"usable"``: the same with each row's draft positions cut where
      its tokens left end. The live env computes both too, and so does
      :class:`~specrl.controller.LookupController` from a table exported from such a run.

    ## The oracle

    :meth:`oracle_k` reads what no controller can see, the true acceptance of the rows in the
    coming step, and returns the myopic best K (``specrl.policies.Oracle``).

    ## Version History

    * v0: initial version.
    """

    def __init__(
        self,
        *,
        profile: str | Path | Profile | None = None,
        workload="mixed",
        workload_kwargs: dict | None = None,
        k_max: int | None = None,
        max_batch: int = 128,
        max_len: int = 384,
        reference_tokens_per_s: float | None = None,
        acceptance_estimate: str = "steps",
    ):
        self.acceptance_estimate = checked_estimate(acceptance_estimate)
        self.profile = self._load(profile)
        prof = self.profile
        k_max = prof.k_max if k_max is None else k_max
        if isinstance(k_max, int) and k_max > prof.k_max:
            raise SpecrlError(
                f"k_max={k_max} is larger than the profile's k_max ({prof.k_max}); measure a "
                f"profile with `specrl profile --k-max {k_max}` or lower k_max"
            )
        # The profile's domains: the held-out corpus's, or those of the prompts file it was
        # measured on, whose preset workloads then draw those domains and bands.
        self._groups = profile_groups(prof)
        workload_kwargs = {**profile_workload_kwargs(prof.meta), **(workload_kwargs or {})}
        self._group_index = {g: i for i, g in enumerate(self._groups)}
        super().__init__(
            workload=workload,
            workload_kwargs=workload_kwargs,
            k_max=k_max,
            max_batch=max_batch,
            max_len=max_len,
            reference_tokens_per_s=(
                prof.plain_decode_tokens_per_s
                if reference_tokens_per_s is None
                else reference_tokens_per_s
            ),
        )
        self._build_tables()

    @staticmethod
    def _load(profile) -> Profile:
        global _warned_default_hardware
        if isinstance(profile, Profile):
            return profile
        if profile is not None:
            return load_profile(profile)
        path = default_profile_path()
        if not path.exists():
            raise SpecrlError(
                f"the default profile {path} is not installed; pass profile=PATH from "
                "`specrl profile --out PATH`"
            )
        prof = load_profile(path)
        here = device_name("cpu")
        if prof.fingerprint.get("device") != here and not _warned_default_hardware:
            _warned_default_hardware = True
            warnings.warn(
                f"the default profile was measured on {prof.fingerprint.get('device')!r}, "
                f"this machine is {here!r}; simulated times will not match it. Measure your "
                "own with `specrl profile --out PROFILE.json` and pass profile=PROFILE.json",
                category=SpecrlWarning,
                stacklevel=3,
            )
        return prof

    def _build_tables(self) -> None:
        prof = self.profile
        largest = prof.batch_sizes[-1]
        if self.max_batch > largest and (largest, self.max_batch) not in _warned_extrapolation:
            _warned_extrapolation.add((largest, self.max_batch))
            how = "extended linearly from its last two"
            if len(prof.batch_sizes) == 1:
                how = f"held at batch {largest}'s"
            warnings.warn(
                f"the profile measured batch sizes up to {largest}; at max_batch="
                f"{self.max_batch} larger batches' step times are {how}. Measure up to "
                f"{self.max_batch} with `specrl profile --batch-sizes ...,{self.max_batch}`, or "
                "lower max_batch",
                category=SpecrlWarning,
                stacklevel=3,
            )
        self.costs = StepCosts(
            prof, max_batch=self.max_batch, max_len=self.max_len, k_max=self.k_max
        )
        self._step_s, self._sigma = self.costs.step_s, self.costs.sigma
        self._prefill_s, self._catchup_s = self.costs.prefill_s, self.costs.catchup_s
        # Acceptance logits by group (domain, band), tokens generated so far and position.
        self._logits, self._levels = acceptance_logits(prof, self._groups, self.max_len, self.k_max)
        # _rates(group, level, generated, k): each row's true conditional acceptance of draft
        # positions 0..k-1, [*S, k] for arguments that broadcast to S; the per-request
        # estimate reads the same logits by bucket of tokens generated.
        self._rates = LogitRates(self._logits)
        self._positions = np.arange(self.k_max)
        # Drifting levels: a level per grid point of z and group, and phi per group.
        drift = prof.level_drift
        fits = [drift[d][b] for d, b in self._groups] if drift else []
        if any(f != FIXED_LEVEL for f in fits):
            self._level_grid = np.stack(
                [level_grid(self._levels[i], f["scale"]) + f["shift"] for i, f in enumerate(fits)]
            )
            self._grid_flat = self._level_grid.ravel()
            # phi per group: the per-token AR(1) of specrl.profile.levels.drift that each
            # request's level path follows (drawn at reset, _draw_requests).
            self._phi = np.array([f["per_token"] for f in fits])
        else:
            self._level_grid = None
        self._requests = None
        if self.acceptance_estimate != "steps":
            self._requests = request_posterior(prof, self._groups, self.k_max)

    def _get_obs(self) -> np.ndarray:
        obs = super()._get_obs()
        if self._requests is not None:
            n = self._n
            incoming, _, incoming_left, _ = self._incoming()
            left = (self._left[:n], incoming_left) if self.acceptance_estimate == "usable" else None
            a = self._requests.estimate(
                self._index[:n], self._group[:n], self._generated[:n], incoming, left
            )
            if a is not None:
                self._last_estimate = a
            obs[ACCEPTANCE], obs[STALENESS] = self._last_estimate, 0.0
        return obs

    def _group_of(self, request) -> int:
        return request_group(self._group_index, request)

    def _check_trace(self, trace) -> None:
        super()._check_trace(trace)
        missing = missing_groups(trace, self._group_index)
        if missing:
            raise SpecrlError(
                f"trace {trace.name!r} uses (domain, temperature band) {missing} that the "
                "profile has no acceptance for (profile field 'acceptance'); measure them "
                "(a trace of a prompts file: `specrl profile --prompts THAT_FILE.jsonl --out "
                "PROFILE.json`, then pass that profile) or drop them from the trace"
            )

    # ------------------------------------------------------------------ the simulated server

    def _start(self) -> None:
        mb = self.max_batch
        self._n = 0
        self._ctx = np.zeros(mb, dtype=np.int64)
        self._left = np.zeros(mb, dtype=np.int64)
        self._group = np.zeros(mb, dtype=np.int64)
        self._level = np.zeros(mb, dtype=np.float64)
        self._index = np.zeros(mb, dtype=np.int64)
        self._generated = np.zeros(mb, dtype=np.int64)
        self._lag = np.zeros(mb, dtype=np.int64)
        self._maybe_behind = False
        self._waiting: deque = deque()
        self._draw_requests()
        if self._requests is not None:
            self._requests.start(len(self.trace.requests))
            self._last_estimate = 0.0

    def _draw_requests(self) -> None:
        """Draw, once per episode, what each request of the trace is: its acceptance level at
        each token it generates, and a uniform per output position that its draft token there
        is accepted against (common random numbers). A token is then as easy to draft whatever
        K the steps around it chose, as in greedy serving, where the output and so each
        position's acceptance do not depend on K; two controllers on one seed differ by their
        choices, not by their luck. The step times' noise is a stream of its own."""
        requests = self.trace.requests
        entropy = int(self.np_random.integers(2**63))
        request_seed, time_seed = np.random.SeedSequence(entropy).spawn(2)
        self._time_rng = np.random.default_rng(time_seed)
        rng = np.random.default_rng(request_seed)
        n = len(requests)
        groups = np.array([self._group_of(r) for r in requests], dtype=np.int64)
        width = max((r.max_new_tokens for r in requests), default=1) + self.k_max + 1
        self._uniform = rng.random((n, width))
        self._request_group = groups
        if self._level_grid is None:
            picks = rng.random(n)
            self._request_level = np.array(
                [
                    float(self._levels[g][int(u * len(self._levels[g]))])
                    for g, u in zip(groups.tolist(), picks.tolist(), strict=True)
                ]
            )
            self._level_path = None
            return
        # The AR(1) of specrl.profile.levels.drift token by token, from the level it arrives
        # with (at its first token, which the prefill commits).
        keep = self._phi[groups]
        fresh = np.sqrt(1.0 - keep * keep)
        z = np.empty((n, width))
        z[:, 0] = z[:, 1] = rng.standard_normal(n)
        noise = rng.standard_normal((n, width))
        for t in range(2, width):
            z[:, t] = keep * z[:, t - 1] + fresh * noise[:, t]
        rows = groups[:, None] * (Z_STEPS + 1)
        self._level_path = self._grid_flat[rows + grid_index(z.ravel()).reshape(n, width)]
        self._request_level = self._level_path[:, 1].copy()

    def _submit(self, requests, first: int) -> None:
        for index, r in enumerate(requests, start=first):
            group = int(self._request_group[index])
            level = float(self._request_level[index])
            self._waiting.append((group, r.prompt_len, r.max_new_tokens, level, index))
            if self._requests is not None:
                self._requests.admit(index, group)

    def _batch_ahead(self) -> int:
        return min(self.max_batch, self._n + len(self._waiting))

    def _queued(self) -> int:
        return max(0, self._n + len(self._waiting) - self.max_batch)

    @property
    def running_rows(self) -> int:
        """Rows decoding now: admitted and not finished (requests waiting are not counted)."""
        return self._n

    def catchup_owed_s(self) -> float:
        """The median seconds of the catch-up the running rows owe the draft: what the next
        step that drafts pays before it decodes; 0 when no row is more than 2 tokens behind."""
        n = self._n
        if n == 0:
            return 0.0
        lag = self._lag[:n]
        behind = lag > 2
        if not behind.any():
            return 0.0
        tokens = int(behind.sum()) * (int(lag[behind].max()) - 1)
        return float(self._catchup_s[min(tokens, len(self._catchup_s) - 1)])

    def _admit(self) -> tuple[float, int, list[int], int]:
        """Move waiting requests into free rows, as the engine does: the prefill commits each
        one's first token, and a request with nothing left to generate leaves at once.
        Returns the prefill seconds, the tokens committed, the requests finished and the
        requests admitted."""
        n = first = self._n
        width = 0
        while self._waiting and n < self.max_batch:
            g, p, o, level, index = self._waiting.popleft()
            self._ctx[n], self._left[n], self._lag[n] = p + 1, o - 1, p + 1
            self._group[n], self._generated[n] = g, 1
            self._level[n], self._index[n] = level, index
            width = max(width, p)
            n += 1
        self._n = n
        self._maybe_behind = True
        finished: list[int] = []
        if not self._left[first:n].all():
            finished = self._compact()
        return self._prefill_s[(n - first) * width], n - first, finished, n - first

    def _compact(self) -> list[int]:
        """Drop the rows with no tokens left; returns their trace indices."""
        n = self._n
        done = self._left[:n] == 0
        finished = self._index[:n][done].tolist()
        keep = np.flatnonzero(~done)
        m = len(keep)
        for arr in (
            self._ctx,
            self._left,
            self._lag,
            self._group,
            self._generated,
            self._level,
            self._index,
        ):
            arr[:m] = arr[keep]
        self._n = m
        return finished

    def _drift_levels(self) -> None:
        """Bring the running rows' levels up to the tokens they have generated (drifting
        levels only; a K=0 step needs none)."""
        n = self._n
        self._level[:n] = self._level_path[self._index[:n], self._generated[:n]]

    def _serve(self, k: int) -> Served:
        # Hot path (>= 20,000 steps/s): numpy over the running rows, no per-row Python.
        rng = self._time_rng
        extra_s, committed, finished, admitted = 0.0, 0, [], 0
        if self._waiting and self._n < self.max_batch:
            extra_s, committed, finished, admitted = self._admit()
        n = self._n
        if n == 0:  # everything admitted finished on its prefill token
            seconds = extra_s * math.exp(self._sigma[1] * rng.standard_normal())
            return Served(committed, seconds, 0, 0, finished, admitted, seconds, 0, 0.0)
        prefill_s, caught_up = extra_s, False
        ctx, left, lag, generated = (
            self._ctx[:n],
            self._left[:n],
            self._lag[:n],
            self._generated[:n],
        )
        max_ctx = int(ctx.max())
        if k:
            if self._level_grid is not None:
                self._drift_levels()
            if self._maybe_behind:
                # The engine catches a row up when it is more than 2 tokens behind.
                behind = lag > 2
                if behind.any():
                    width = int(lag[behind].max()) - 1
                    extra_s += self._catchup_s[int(behind.sum()) * width]
                    caught_up = True
                self._maybe_behind = False
            drawn = self._uniform[self._index[:n, None], generated[:, None] + self._positions[:k]]
            ok = drawn < self._rates(self._group[:n], self._level[:n], generated, k)
            if int(left.min()) <= k:
                k_rows = np.minimum(left - 1, k)
                ok &= self._positions[:k] < k_rows[:, None]
                drafted = int(k_rows.sum())
            else:
                k_rows = None
                drafted = n * k
            accepted_rows = np.cumprod(ok, axis=1).sum(axis=1)
            if self._requests is not None:
                self._requests.observe(
                    self._index[:n],
                    self._group[:n],
                    generated,
                    accepted_rows,
                    np.full(n, k) if k_rows is None else k_rows,
                )
            committed_rows = accepted_rows + 1
            # The draft has read all but the last committed token, or the last two after a
            # fully accepted block.
            lag[:] = 1 + (accepted_rows == k)
            accepted = int(accepted_rows.sum())
            committed += accepted + n
        else:
            committed_rows = 1
            lag += 1
            self._maybe_behind = True
            drafted = accepted = 0
            committed += n
        ctx += committed_rows
        left -= committed_rows
        generated += committed_rows
        noise = math.exp(self._sigma[n] * rng.standard_normal())
        seconds = (self._step_s[n][k][max_ctx // CONTEXT_BUCKET] + extra_s) * noise
        if int(left.min()) == 0:
            finished += self._compact()
        return Served(
            committed,
            seconds,
            drafted,
            accepted,
            finished,
            admitted,
            prefill_s * noise,
            n,
            float(max_ctx),
            caught_up,
        )

    # ------------------------------------------------------------------ the oracle

    def oracle_k(self) -> int:
        """The myopic best K for the coming step: argmax over K of the decode's expected
        committed tokens over its table (median) seconds, from the true acceptance of every
        row the step will decode (those waiting to be admitted included): the goodput rule
        with the true rates instead of an estimate.

        Left out of the ratio: the admission's prefill and first tokens (the same for every
        K; in the ratio, a long prefill would make any extra token look cheap next to the
        step's low average rate) and the draft's catch-up (paid once for all the speculation
        that follows; charged to one step, it would keep a myopic rule off for good once it
        had been off a while). Myopic: it ignores what K does to later steps, so a learned
        policy may beat it."""
        n0 = self._n
        if n0 and self._level_grid is not None:
            self._drift_levels()
        g, lv, lf, cx = self._incoming()
        group = np.concatenate([self._group[:n0], g])
        level = np.concatenate([self._level[:n0], lv])
        generated = np.concatenate([self._generated[:n0], np.ones(len(g), dtype=np.int64)])
        left = np.concatenate([self._left[:n0], lf])
        ctx = np.concatenate([self._ctx[:n0], cx])
        if len(left) == 0:
            return 0
        survive = np.cumprod(self._rates(group, level, generated, self.k_max), axis=1)
        return self._myopic_k(survive, left, int(ctx.max()))

    def _incoming(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The waiting requests the coming step admits and decodes (a one-token request
        leaves on its prefill token): their group, level, tokens left after the prefill's
        first token, and context, each ``[m]``."""
        incoming = list(self._waiting)[: max(0, self.max_batch - self._n)]
        if not incoming:
            empty = np.zeros(0, dtype=np.int64)
            return empty, np.zeros(0), empty, empty
        g, p, o, lv = (np.array(col) for col in list(zip(*incoming))[:4])
        live = o > 1
        return g[live], lv[live].astype(np.float64), o[live] - 1, p[live] + 1

    def _myopic_k(self, survive: np.ndarray, left: np.ndarray, max_ctx: int) -> int:
        """The K with the most expected committed tokens over the step's table seconds, for
        rows that accept draft positions ``0..j`` with probability ``survive[:, j]``
        (``[n, k_max]``) and have ``left`` tokens to go (each drafts at most ``left - 1``)."""
        bucket = max_ctx // CONTEXT_BUCKET
        best_k, best_rate = 0, -1.0
        for k in range(self.k_max + 1):
            tokens = len(left)
            seconds = self._step_s[len(left)][k][bucket]
            if k:
                k_rows = np.minimum(left - 1, k)
                tokens += float((survive[:, :k] * (self._positions[:k] < k_rows[:, None])).sum())
            rate = tokens / seconds if seconds > 0 else 0.0
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k
