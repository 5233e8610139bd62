"""``specrl bench surrogate``: env steps per second of the surrogate, in one process."""

from __future__ import annotations

import time

import gymnasium as gym

import specrl  # noqa: F401  (registers the ids)


def run(*, steps: int, max_batch: int, profile: str | None = None) -> int:
    """Step ``SurrogateSpec-v0`` ``steps`` times, cycling K, and print env steps per second."""
    kwargs = {"max_batch": max_batch}
    if profile:
        kwargs["profile"] = profile
    env = gym.make("specrl/SurrogateSpec-v0", disable_env_checker=True, **kwargs)
    k_cycle = list(range(env.action_space.n)) * 7
    env.reset(seed=0)
    done, episodes = 0, 0
    started = time.perf_counter()
    while done < steps:
        _, _, terminated, truncated, _ = env.step(k_cycle[done % len(k_cycle)])
        done += 1
        if terminated or truncated:
            episodes += 1
            env.reset()
    elapsed = time.perf_counter() - started
    print(
        f"{done / elapsed:,.0f} env steps/s ({done} steps, {episodes} episodes incl. "
        f"resets, {elapsed:.1f} s, K cycling 0..{env.action_space.n - 1}, one process)"
    )
    return 0
