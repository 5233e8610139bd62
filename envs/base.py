"""What the live and the surrogate environment share: spaces, observation, reward, episode.

Subclasses provide the server: ``_start()`` (fresh state for an episode), ``_submit(requests)``,
``_serve(k)`` (one step; returns committed, seconds, drafted, accepted, finished,
max context), ``_batch_ahead()`` (rows the next step will decode) and ``_queued()``.
"""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from specrl.errors import SpecrlError
from specrl.workload import PRESETS, Trace, TraceDriver, is_preset, load_trace, preset_trace

OBS_NAMES = ("batch", "queue", "acceptance", "staleness", "step_time", "context", "last_k")
ACCEPTANCE_EMA = 0.25
"""Weight of the newest step in the acceptance estimate."""
STALE_STEPS = 32
"""Steps without a drafted token after which the acceptance estimate counts as fully stale."""


def step_time_feature(seconds: float) -> float:
    """``clip(1 + log10(seconds) / 4, 0, 1)``: 0.1 ms -> 0, 10 ms -> 0.5, 1 s -> 1."""
    if seconds <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 + math.log10(seconds) / 4.0))


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
        f"workload {workload!r} is neither a Trace, a trace file (.json), nor a preset "
        f"({', '.join(PRESETS)})"
    )


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
            raise SpecrlError(
                f"trace {trace.name!r}: a request needs {longest} tokens (prompt_len + "
                f"max_new_tokens) but max_len is {self.max_len}; raise max_len or shorten "
                "prompt_lengths/output_lengths"
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
        self._submit(self._driver.due())
        self._acceptance = 0.0
        self._since_measured = STALE_STEPS
        self._last_seconds = 0.0
        self._last_context = 0.0
        self._last_k = 0
        self.episode_tokens = 0
        self.episode_seconds = 0.0
        self.episode_steps = 0
        return self._get_obs(), self._get_info(0, 0.0, 0)

    def step(self, action):
        if self._driver is None:
            raise SpecrlError("call reset() before step()")
        k = int(action)
        if not 0 <= k <= self.k_max:
            raise SpecrlError(f"action {action!r} is outside 0..{self.k_max} (k_max)")
        committed, seconds, drafted, accepted, finished, context = self._serve(k)
        driver = self._driver
        driver.advance(seconds, finished)
        if drafted:
            self._acceptance += ACCEPTANCE_EMA * (accepted / drafted - self._acceptance)
            self._since_measured = 0
        else:
            self._since_measured += 1
        self._last_seconds, self._last_context, self._last_k = seconds, context, k
        self.episode_tokens += committed
        self.episode_seconds += seconds
        self.episode_steps += 1
        if not driver.done:
            due = driver.due()
            if due:
                self._submit(due)
        reward = (committed - self.reference_tokens_per_s * seconds) / self.max_batch
        return self._get_obs(), reward, driver.done, False, self._get_info(committed, seconds, k)

    # ------------------------------------------------------------------ shared views

    def _get_obs(self) -> np.ndarray:
        mb = self.max_batch
        return np.array(
            (
                self._batch_ahead() / mb,
                min(1.0, self._queued() / mb),
                self._acceptance,
                min(1.0, self._since_measured / STALE_STEPS),
                step_time_feature(self._last_seconds),
                min(1.0, self._last_context / self.max_len),
                self._last_k / self.k_max if self.k_max else 0.0,
            ),
            dtype=np.float32,
        )

    def _get_info(self, committed: int, seconds: float, k: int) -> dict:
        return {
            "committed": committed,
            "step_time_s": seconds,
            "k": k,
            "episode_tokens": self.episode_tokens,
            "episode_time_s": self.episode_seconds,
        }

    # ------------------------------------------------------------------ the server

    def _start(self) -> None:
        raise NotImplementedError

    def _submit(self, requests) -> None:
        raise NotImplementedError

    def _serve(self, k: int) -> tuple[int, float, int, int, int, float]:
        raise NotImplementedError

    def _batch_ahead(self) -> int:
        raise NotImplementedError

    def _queued(self) -> int:
        raise NotImplementedError
