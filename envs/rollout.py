"""Run a policy through one episode and report what the objective cares about."""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def tokens_per_s(self) -> float:
        """The objective: aggregate goodput, sum(tokens) / sum(seconds)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def run_episode(
    env,
    policy,
    *,
    seed: int | None = None,
    options: dict | None = None,
    max_steps: int | None = None,
) -> EpisodeResult:
    """Play ``policy`` (anything with SB3's ``predict``) for one episode of ``env``."""
    obs, _ = env.reset(seed=seed, options=options)
    total_return, rate_sum, steps = 0.0, 0.0, 0
    tokens, seconds = 0, 0.0
    done = False
    while not done and (max_steps is None or steps < max_steps):
        action, _ = policy.predict(obs, deterministic=True)
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        total_return += float(reward)
        tokens += info["committed"]
        seconds += info["step_time_s"]
        rate_sum += info["committed"] / info["step_time_s"] if info["step_time_s"] > 0 else 0.0
        steps += 1
    return EpisodeResult(tokens, seconds, steps, total_return, rate_sum / max(steps, 1))
