"""What the live and the surrogate environment share: spaces, observation, reward, episode.

Subclasses provide the server: ``_start()`` (fresh state for an episode),
``_submit(requests, first)`` (requests ``first, first + 1, ...`` of the trace, in order),
``_serve(k)`` (one step; returns a :class:`Served`), ``_batch_ahead()`` (rows the next step
will decode) and ``_queued()``. Requests are admitted in submission order in both servers.
"""

from __future__ import annotations

import operator
from collections import deque
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from specrl.errors import SpecrlError
from specrl.features import AcceptanceTracker, step_time_feature
from specrl.workload import PRESETS, Trace, TraceDriver, is_preset, load_trace, preset_trace

OBS_NAMES = (
    "batch",
    "queue",
    "acceptance",
    "staleness",
    "step_time",
    "context",
    "last_k",
    "last_accept",
)
"""Observation entries, in order; computed with :mod:`specrl.features` (see ``LiveSpecEnv``)."""
BATCH = OBS_NAMES.index("batch")
ACCEPTANCE = OBS_NAMES.index("acceptance")
STALENESS = OBS_NAMES.index("staleness")
CONTEXT = OBS_NAMES.index("context")
LAST_K = OBS_NAMES.index("last_k")
LAST_ACCEPT = OBS_NAMES.index("last_accept")
"""The index of each entry the controllers read."""


class Served(NamedTuple):
    """What one server step did."""

    committed: int
    seconds: float
    drafted: int
    accepted: int
    finished: list[int]
    """Trace indices of the requests that finished in this step."""
    admitted: int
    """Requests admitted (prefilled, first token committed) in this step."""
    prefill_seconds: float
    """The part of ``seconds`` spent prefilling them (their first token is out then)."""
    batch: int
    """Rows decoded in this step."""
    context: float
    """Longest row (prompt + committed) at the start of the decode."""
    caught_up: bool = False
    """Whether the draft read tokens it had skipped (after K=0 steps) in this step: a cost
    the profile charges apart from the step's."""


def resolve_workload(workload, *, peak: int, workload_kwargs: dict | None) -> Trace | str:
    """A fixed trace (a Trace or a JSON path) or a preset name drawn afresh on every reset."""
    if isinstance(workload, Trace):
        return workload
    if isinstance(workload, (str, Path)):
        if is_preset(str(workload)):
            preset_trace(str(workload), seed=0, peak=peak, **(workload_kwargs or {}))
            return str(workload)
        if str(workload).endswith(".json") or Path(workload).exists():
            return load_trace(workload)
    raise SpecrlError(
        f"workload {workload!r} is neither a preset ({', '.join(PRESETS)}, or steady-N for "
        "any N) nor a trace file (.json, from `specrl workload`)"
    )


def _action_k(action) -> int | None:
    """K from an action: an integer, or a one-element integer array (as a VecEnv's slice
    gives); None for anything else (a float K is refused rather than truncated)."""
    try:
        return operator.index(action)
    except TypeError:
        arr = np.asarray(action)
        if arr.size == 1 and np.issubdtype(arr.dtype, np.integer):
            return int(arr.reshape(()))
        return None


class SpecEnvBase(gym.Env):
    """Shared by :class:`LiveSpecEnv` and :class:`SurrogateSpecEnv`; see their docstrings."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        *,
        workload,
        workload_kwargs: dict | None,
        k_max: int,
        max_batch: int,
        max_len: int,
        reference_tokens_per_s: float,
    ):
        if not isinstance(k_max, int) or k_max < 0:
            raise SpecrlError(f"k_max must be an integer >= 0, got {k_max!r}")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise SpecrlError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not reference_tokens_per_s > 0:
            raise SpecrlError(f"reference_tokens_per_s must be > 0, got {reference_tokens_per_s!r}")
        self.k_max, self.max_batch, self.max_len = k_max, max_batch, max_len
        self.reference_tokens_per_s = float(reference_tokens_per_s)
        self._workload_kwargs = dict(workload_kwargs or {})
        self._workload_kwargs.setdefault("peak", max_batch)
        self.workload = resolve_workload(
            workload, peak=self._workload_kwargs["peak"], workload_kwargs=self._kwargs_no_peak()
        )
        if isinstance(self.workload, Trace):
            self._check_trace(self.workload)
        self.action_space = spaces.Discrete(k_max + 1)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(len(OBS_NAMES),), dtype=np.float32)
        self.trace: Trace | None = None
        self._driver: TraceDriver | None = None

    def _kwargs_no_peak(self) -> dict:
        return {k: v for k, v in self._workload_kwargs.items() if k != "peak"}

    def _check_trace(self, trace: Trace) -> None:
        longest = trace.max_request_len
        if longest > self.max_len:
            i = next(
                i
                for i, r in enumerate(trace.requests)
                if r.prompt_len + r.max_new_tokens == longest
            )
            raise SpecrlError(
                f"trace {trace.name!r}: requests[{i}] needs {longest} tokens (prompt_len + "
                f"max_new_tokens) but max_len is {self.max_len}; raise max_len (--max-len), or "
                "shorten that request (a preset draws its requests within prompt_lengths and "
                "output_lengths)"
            )

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "trace" in options:
            self.trace = options["trace"]
            self._check_trace(self.trace)
        elif isinstance(self.workload, Trace):
            self.trace = self.workload
        else:
            self.trace = preset_trace(
                self.workload,
                seed=int(self.np_random.integers(2**31)),
                peak=self._workload_kwargs["peak"],
                **self._kwargs_no_peak(),
            )
            self._check_trace(self.trace)
        self._driver = TraceDriver(self.trace)
        self._start()
        self._tracker = AcceptanceTracker()
        self._last_seconds = 0.0
        self._last_context = 0.0
        self._last_k = 0
        self._awaiting_first: deque[int] = deque()
        self._first_token_s: dict[int, float] = {}
        self.request_tpot_s: list[float] = []
        """Per finished request with >= 2 tokens: time per output token after the first (the
        serving clock from the end of its prefill to the end of its last step, over its
        tokens but the first)."""
        self.episode_tokens = 0
        self.episode_seconds = 0.0
        self.episode_steps = 0
        self._submit_due()
        return self._get_obs(), self._get_info(None, 0)

    def _submit_due(self) -> None:
        first = self._driver.next_index
        due = self._driver.due()
        if due:
            self._awaiting_first.extend(range(first, first + len(due)))
            self._submit(due, first)

    def step(self, action):
        if self._driver is None:
            raise SpecrlError("call reset() before step()")
        k = _action_k(action)
        if k is None or not 0 <= k <= self.k_max:
            shown = repr(action) if k is None else k
            raise SpecrlError(f"action {shown}: K must be an integer in 0..{self.k_max} (k_max)")
        served = self._serve(k)
        driver = self._driver
        first_token_s = driver.clock_s + served.prefill_seconds
        driver.advance(served.seconds, len(served.finished))
        self._track_latency(served, first_token_s, driver.clock_s)
        self._tracker.observe(served.drafted, served.accepted, k)
        self._last_seconds, self._last_context, self._last_k = served.seconds, served.context, k
        self.episode_tokens += served.committed
        self.episode_seconds += served.seconds
        self.episode_steps += 1
        if not driver.done:
            self._submit_due()
        reward = (served.committed - self.reference_tokens_per_s * served.seconds) / self.max_batch
        return self._get_obs(), reward, driver.done, False, self._get_info(served, k)

    def _track_latency(self, served: Served, first_token_s: float, clock_s: float) -> None:
        for _ in range(served.admitted):
            self._first_token_s[self._awaiting_first.popleft()] = first_token_s
        requests = self.trace.requests
        for index in served.finished:
            first = self._first_token_s.pop(index)
            n = requests[index].max_new_tokens
            if n > 1:
                self.request_tpot_s.append((clock_s - first) / (n - 1))

    # ------------------------------------------------------------------ shared views

    @property
    def acceptance(self) -> AcceptanceTracker:
        """The acceptance estimate behind the observation (read-only use)."""
        return self._tracker

    def _get_obs(self) -> np.ndarray:
        mb, tracker = self.max_batch, self._tracker
        return np.array(
            (
                self._batch_ahead() / mb,
                min(1.0, self._queued() / mb),
                tracker.estimate,
                tracker.staleness,
                step_time_feature(self._last_seconds),
                min(1.0, self._last_context / self.max_len),
                self._last_k / self.k_max if self.k_max else 0.0,
                tracker.last_rate,
            ),
            dtype=np.float32,
        )

    def _get_info(self, served: Served | None, k: int) -> dict:
        return {
            "committed": served.committed if served else 0,
            "step_time_s": served.seconds if served else 0.0,
            "k": k,
            "batch": served.batch if served else 0,
            "drafted": served.drafted if served else 0,
            "accepted": served.accepted if served else 0,
            "admitted": served.admitted if served else 0,
            "prefill_s": served.prefill_seconds if served else 0.0,
            "caught_up": served.caught_up if served else False,
            "context": served.context if served else 0.0,
            "episode_tokens": self.episode_tokens,
            "episode_time_s": self.episode_seconds,
        }

    # ------------------------------------------------------------------ the server

    def _start(self) -> None:
        raise NotImplementedError

    def _submit(self, requests, first: int) -> None:
        raise NotImplementedError

    def _serve(self, k: int) -> Served:
        raise NotImplementedError

    def _batch_ahead(self) -> int:
        raise NotImplementedError

    def _queued(self) -> int:
        raise NotImplementedError


def observation_rows(obs) -> tuple[np.ndarray, bool]:
    """``obs`` as ``[n_envs, 8]`` float64, and whether it was a single observation."""
    arr = np.asarray(obs, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.shape[-1] != len(OBS_NAMES):
        raise SpecrlError(
            f"expected an observation of shape ({len(OBS_NAMES)},) or (n_envs, "
            f"{len(OBS_NAMES)}) with entries {', '.join(OBS_NAMES)}; got shape {arr.shape}"
        )
    return arr.reshape(-1, len(OBS_NAMES)), arr.ndim == 1
