"""Run a policy through one episode and report what the objective cares about."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specrl.envs.base import ACCEPTANCE
from specrl.errors import SpecrlError

LIVE_WARMUP_STEPS = 30
"""Steps a live comparison plays and discards before its first measured episode
(:func:`warm_up`): a fresh process's first steps are slow."""


@dataclass
class EpisodeResult:
    tokens: int
    """Committed tokens of the episode."""
    seconds: float
    """Serving time: the sum of step times."""
    steps: int
    episode_return: float
    mean_step_tokens_per_s: float
    """The mean of per-step rates: not the objective, reported to show the difference."""
    step_batch: list[int] = field(default_factory=list)
    """Per step: rows decoded."""
    step_k: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    step_acceptance: list[float] = field(default_factory=list)
    """Per step: the acceptance estimate the controller observed after the step."""
    step_context: list[float] = field(default_factory=list)
    """Per step: the longest row's context at the start of the decode."""
    step_admitted: list[int] = field(default_factory=list)
    """Per step: requests admitted (prefilled) in it."""
    step_caught_up: list[bool] = field(default_factory=list)
    """Per step: whether the draft caught up on tokens it skipped during K=0 steps."""
    request_tpot_s: list[float] = field(default_factory=list)
    """Per finished request: time per output token after the first (serving clock)."""
    prefill_seconds: float = 0.0
    """Of ``seconds``, the admissions' prefill (the rest is decoding and the draft's
    catch-up)."""

    @property
    def tokens_per_s(self) -> float:
        """The objective: aggregate goodput, sum(tokens) / sum(seconds)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class EpisodePlay:
    """One episode of ``policy`` (anything with SB3's ``predict``) on ``env``, played a step at
    a time: :func:`run_episode` plays it to the end, :func:`run_interleaved` plays several side
    by side. ``env`` is reset with ``seed`` and ``options`` on construction.

    ``episode_start`` is passed as in SB3's ``evaluate_policy`` (True on the first step), so
    stateful policies reset."""

    def __init__(self, env, policy, *, seed: int | None = None, options: dict | None = None):
        self.env, self.policy = env, policy
        self.obs, _ = env.reset(seed=seed, options=options)
        self.result = EpisodeResult(0, 0.0, 0, 0.0, 0.0)
        self.done = False
        self._rate_sum = 0.0
        self._start = np.ones(1, dtype=bool)

    def step(self) -> None:
        """Play one env step: the policy's K for the current observation."""
        result = self.result
        action, _ = self.policy.predict(self.obs, episode_start=self._start, deterministic=True)
        self._start = np.zeros(1, dtype=bool)
        try:
            self.obs, reward, terminated, truncated, info = self.env.step(action)
        except SpecrlError as err:
            name = getattr(self.policy, "name", type(self.policy).__name__)
            raise SpecrlError(f"policy {name} at step {result.steps}: {err}") from None
        self.done = terminated or truncated
        result.episode_return += float(reward)
        result.tokens += info["committed"]
        result.seconds += info["step_time_s"]
        result.prefill_seconds += info["prefill_s"]
        if info["step_time_s"] > 0:
            self._rate_sum += info["committed"] / info["step_time_s"]
        result.steps += 1
        result.step_batch.append(info["batch"])
        result.step_k.append(info["k"])
        result.step_tokens.append(info["committed"])
        result.step_seconds.append(info["step_time_s"])
        result.step_acceptance.append(float(self.obs[ACCEPTANCE]))
        result.step_context.append(info["context"])
        result.step_admitted.append(info["admitted"])
        result.step_caught_up.append(info["caught_up"])

    def finish(self) -> EpisodeResult:
        """The episode's result as played so far (all of it once ``done``)."""
        self.result.mean_step_tokens_per_s = self._rate_sum / max(self.result.steps, 1)
        self.result.request_tpot_s = list(self.env.unwrapped.request_tpot_s)
        return self.result


def run_episode(
    env,
    policy,
    *,
    seed: int | None = None,
    options: dict | None = None,
    max_steps: int | None = None,
) -> EpisodeResult:
    """Play ``policy`` (anything with SB3's ``predict``) for one episode of ``env``
    (:class:`EpisodePlay`), or for its first ``max_steps`` steps."""
    play = EpisodePlay(env, policy, seed=seed, options=options)
    while not play.done and (max_steps is None or play.result.steps < max_steps):
        play.step()
    return play.finish()


def run_interleaved(envs: list, policies: list, *, seed: int | None = None) -> list[EpisodeResult]:
    """One episode of each policy, each on its own env (reset with ``seed``), played side by
    side: at every turn the episode that has served the least time (the sum of its step times)
    plays its next step; on a tie, the first listed.

    Why: live, a shared machine's speed drifts within minutes (docs/profile.md), and one
    policy's episode played after another's meets another machine. Played side by side, the
    policies' episodes reach each point of their serving time at almost the same moment, so
    whatever the machine does then it does to all of them alike. Each env's clock is the
    time it measured, so an episode's steps, tokens and (closed loop) batches are those it
    would serve alone; what changes is only when, by the wall clock, each step runs."""
    if len(envs) != len(policies):
        raise SpecrlError(f"run_interleaved: {len(envs)} envs for {len(policies)} policies")
    if len({id(e) for e in envs}) != len(envs):
        raise SpecrlError("run_interleaved: each policy needs an env of its own")
    plays = [
        EpisodePlay(env, policy, seed=seed) for env, policy in zip(envs, policies, strict=True)
    ]
    while playing := [p for p in plays if not p.done]:
        min(playing, key=lambda p: p.result.seconds).step()
    return [p.finish() for p in plays]


def warm_up(env, policy, *, seed: int | None, steps: int) -> None:
    """Play ``steps`` steps of ``policy`` on ``env`` (reset with ``seed``) and discard them:
    live, a fresh process's first steps are slow. Nothing is played for ``steps=0``."""
    if steps < 0:
        raise SpecrlError(f"warmup_steps must be >= 0, got {steps}")
    if steps:
        run_episode(env, policy, seed=seed, max_steps=steps)


def round_order(items: list, round_index: int) -> list:
    """The order in which ``items`` (policies) play round ``round_index`` of a side-by-side
    comparison: as given in even rounds, reversed in odd ones (an ABBA design).

    Why: live, a shared machine's speed drifts within an hour, often one way within a run
    (docs/profile.md). In one fixed order, the policy played last meets the slowest machine in
    every round. Over an even number of rounds every item's mean place is the same, so a
    linear drift charges all of them alike."""
    return list(items) if round_index % 2 == 0 else list(reversed(items))


def odd_rounds_note(rounds: int, flag: str) -> str | None:
    """A note for a live comparison of an odd number of rounds (None when even): the play
    order of :func:`round_order` then cancels no drift. ``flag`` names the option to change."""
    if rounds % 2 == 0:
        return None
    return (
        f"note: {rounds} round{'s' * (rounds != 1)} of live episodes: with an odd number the "
        "policies' mean places in the play order differ, and a drift in this machine's speed "
        f"favours the first; use an even {flag}"
    )
