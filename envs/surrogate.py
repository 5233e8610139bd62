"""``SurrogateSpecEnv``: the live environment's spaces, workloads and reward, driven by a
hardware profile instead of models. The fast place to train."""

from __future__ import annotations

import math
import warnings
from collections import deque
from importlib import resources
from pathlib import Path

import numpy as np

from specrl.envs.base import SpecEnvBase
from specrl.errors import SpecrlError
from specrl.profile.fingerprint import device_name
from specrl.profile.schema import Profile, load_profile
from specrl.workload import DOMAINS

DEFAULT_PROFILE = "default-cpu.json"
CONTEXT_BUCKET = 8
"""Step times are tabulated per 8 tokens of context."""
_warned_default_hardware = False


def default_profile_path() -> Path:
    return Path(str(resources.files("specrl") / "assets" / "profiles" / DEFAULT_PROFILE))


def _interp(x: np.ndarray, xp, fp) -> np.ndarray:
    """Piecewise-linear through (xp, fp), extended linearly past both ends, floored at 0."""
    xp, fp = np.asarray(xp, dtype=np.float64), np.asarray(fp, dtype=np.float64)
    y = np.interp(x, xp, fp)
    if len(xp) > 1:
        lo, hi = x < xp[0], x > xp[-1]
        y[lo] = fp[0] + (x[lo] - xp[0]) * (fp[1] - fp[0]) / (xp[1] - xp[0])
        y[hi] = fp[-1] + (x[hi] - xp[-1]) * (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
    return np.maximum(y, 0.0)


def _points_table(points: dict, n: int) -> list[float]:
    """Seconds for 0..n-1 padded tokens, from measured points (0 tokens cost nothing)."""
    xp = np.concatenate(([0.0], points["tokens"]))
    fp = np.concatenate(([0.0], points["seconds"]))
    keep = np.concatenate(([True], np.diff(xp) > 0))
    return _interp(np.arange(n, dtype=np.float64), xp[keep], fp[keep]).tolist()


class SurrogateSpecEnv(SpecEnvBase):
    """Speculative decoding with a per-step choice of K, simulated from a measured profile.

    Everything the agent sees and is paid is defined as in :class:`LiveSpecEnv`; only the
    server differs.

    ## Action Space

    ``Discrete(k_max + 1)``: K for this step, 0 = speculation off.

    ## Observation Space

    ``Box(0, 1, (7,), float32)``: batch, queue, acceptance, staleness, step_time, context,
    last_k; the table with meanings and scales is in :class:`LiveSpecEnv`.

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
    linearly past the measured grid), with the measured spread ``sigma_B``. Each row drafts
    ``min(K, tokens left - 1)`` tokens and accepts draft token ``i`` with the profile's
    conditional rate for its domain, position and tokens generated so far (the profile's
    ``acceptance_by_output``), stopping at the first rejection; it
    commits the accepted tokens plus one. Admission follows the engine: the prefill commits
    each new request's first token. So does the draft's catch-up: a row falls behind by one
    token per K=0 step and by its prompt and first token on admission, and is caught up
    at the next K>0 step. All randomness comes from ``self.np_random``: a seed and the
    actions fix the trajectory.

    ## Arguments

    * ``profile`` (path or :class:`~specrl.profile.Profile`): default: the profile shipped
      with specrl (the default pair on a 2-core CPU; a warning once when this machine differs).
    * ``workload``, ``workload_kwargs``, ``max_batch``, ``max_len``,
      ``reference_tokens_per_s``: as for :class:`LiveSpecEnv`.
    * ``k_max``: largest K; default: the profile's; larger than the profile's is an error.

    ## Version History

    * v0: initial version.
    """

    def __init__(
        self,
        *,
        profile: str | Path | Profile | None = None,
        workload="ramp",
        workload_kwargs: dict | None = None,
        k_max: int | None = None,
        max_batch: int = 64,
        max_len: int = 384,
        reference_tokens_per_s: float | None = None,
    ):
        self.profile = self._load(profile)
        prof = self.profile
        k_max = prof.k_max if k_max is None else k_max
        if isinstance(k_max, int) and k_max > prof.k_max:
            raise SpecrlError(
                f"k_max={k_max} is larger than the profile's k_max ({prof.k_max}); measure a "
                f"profile with `specrl profile --k-max {k_max}` or lower k_max"
            )
        self._missing_domains = {d for d in DOMAINS if d not in prof.acceptance}
        super().__init__(
            workload=workload,
            workload_kwargs=workload_kwargs,
            k_max=k_max,
            max_batch=max_batch,
            max_len=max_len,
            reference_tokens_per_s=reference_tokens_per_s or prof.plain_decode_tokens_per_s,
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
                stacklevel=3,
            )
        return prof

    def _build_tables(self) -> None:
        prof, kk = self.profile, self.k_max + 1
        batches = np.arange(self.max_batch + 1, dtype=np.float64)
        contexts = np.arange(0, self.max_len + CONTEXT_BUCKET, CONTEXT_BUCKET, dtype=np.float64)
        step = np.empty((len(batches), kk, len(contexts)))
        for k in range(kk):
            per_ctx = np.array(
                [
                    [prof.step_seconds(b, k, c) for c in range(len(prof.contexts))]
                    for b in range(len(prof.batch_sizes))
                ]
            )  # [n_batch_grid, n_ctx_grid]
            by_batch = np.stack(
                [_interp(batches, prof.batch_sizes, column) for column in per_ctx.T],
                axis=1,
            )  # [max_batch + 1, n_ctx_grid]
            for b in range(len(batches)):
                step[b, k] = _interp(contexts, prof.contexts, by_batch[b])
        self._step_s = step.tolist()  # [B][k][context bucket]
        self._sigma = _interp(batches, prof.batch_sizes, prof.time_log_sigma).tolist()
        n_tokens = self.max_batch * self.max_len + 1
        self._prefill_s = _points_table(prof.prefill, n_tokens)
        self._catchup_s = _points_table(prof.catchup, n_tokens)
        # Acceptance by domain and tokens generated so far: [domain, generated, position].
        by_output = prof.acceptance_by_output
        bucket = np.searchsorted(by_output["edges"], np.arange(self.max_len + 1), side="right")
        self._accept = np.zeros((len(DOMAINS), self.max_len + 1, self.k_max))
        for i, d in enumerate(DOMAINS):
            if d in by_output["rates"]:
                self._accept[i] = np.asarray(by_output["rates"][d])[bucket, : self.k_max]
        self._positions = np.arange(self.k_max)
        self._domain_index = {d: i for i, d in enumerate(DOMAINS)}

    def _check_trace(self, trace) -> None:
        super()._check_trace(trace)
        used = {r.domain for r in trace.requests} & self._missing_domains
        if used:
            raise SpecrlError(
                f"trace {trace.name!r} uses domain(s) {sorted(used)} that the profile has no "
                "acceptance for (profile field 'acceptance'); measure them or drop them "
                "from the trace"
            )

    # ------------------------------------------------------------------ the simulated server

    def _start(self) -> None:
        mb = self.max_batch
        self._n = 0
        self._ctx = np.zeros(mb, dtype=np.int64)
        self._left = np.zeros(mb, dtype=np.int64)
        self._domain = np.zeros(mb, dtype=np.int64)
        self._generated = np.zeros(mb, dtype=np.int64)
        self._lag = np.zeros(mb, dtype=np.int64)
        self._maybe_behind = False
        self._waiting: deque = deque()

    def _submit(self, requests) -> None:
        index = self._domain_index
        self._waiting.extend((index[r.domain], r.prompt_len, r.max_new_tokens) for r in requests)

    def _batch_ahead(self) -> int:
        return min(self.max_batch, self._n + len(self._waiting))

    def _queued(self) -> int:
        return max(0, self._n + len(self._waiting) - self.max_batch)

    def _admit(self) -> tuple[float, int, int]:
        """Move waiting requests into free rows, as the engine does: the prefill commits each
        one's first token, and a request with nothing left to generate leaves at once.
        Returns the prefill seconds, the tokens committed and the requests finished."""
        n = first = self._n
        width = 0
        while self._waiting and n < self.max_batch:
            d, p, o = self._waiting.popleft()
            self._ctx[n], self._left[n], self._lag[n] = p + 1, o - 1, p + 1
            self._domain[n], self._generated[n] = d, 1
            width = max(width, p)
            n += 1
        self._n = n
        self._maybe_behind = True
        finished = 0
        if not self._left[first:n].all():
            finished = self._compact()
        return self._prefill_s[(n - first) * width], n - first, finished

    def _compact(self) -> int:
        """Drop the rows with no tokens left; returns how many."""
        n = self._n
        keep = np.flatnonzero(self._left[:n])
        m = len(keep)
        for arr in (self._ctx, self._left, self._lag, self._domain, self._generated):
            arr[:m] = arr[keep]
        self._n = m
        return n - m

    def _serve(self, k: int):
        # Hot path (>= 20,000 steps/s): numpy over the running rows, no per-row Python.
        rng = self.np_random
        extra_s, committed, finished = 0.0, 0, 0
        if self._waiting and self._n < self.max_batch:
            extra_s, committed, finished = self._admit()
        n = self._n
        if n == 0:  # everything admitted finished on its prefill token
            seconds = extra_s * math.exp(self._sigma[1] * rng.standard_normal())
            return committed, seconds, 0, 0, finished, 0.0
        ctx, left, lag, generated = (
            self._ctx[:n],
            self._left[:n],
            self._lag[:n],
            self._generated[:n],
        )
        max_ctx = int(ctx.max())
        if k:
            if self._maybe_behind:
                # The engine catches a row up when it is more than 2 tokens behind.
                behind = lag > 2
                if behind.any():
                    width = int(lag[behind].max()) - 1
                    extra_s += self._catchup_s[int(behind.sum()) * width]
                self._maybe_behind = False
            ok = rng.random((n, k)) < self._accept[self._domain[:n], generated, :k]
            if int(left.min()) <= k:
                k_rows = np.minimum(left - 1, k)
                ok &= self._positions[:k] < k_rows[:, None]
                drafted = int(k_rows.sum())
            else:
                drafted = n * k
            accepted_rows = np.cumprod(ok, axis=1).sum(axis=1)
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
        sigma = self._sigma[n]
        seconds = (self._step_s[n][k][max_ctx // CONTEXT_BUCKET] + extra_s) * math.exp(
            sigma * rng.standard_normal()
        )
        if int(left.min()) == 0:
            finished += self._compact()
        return committed, seconds, drafted, accepted, finished, float(max_ctx)
