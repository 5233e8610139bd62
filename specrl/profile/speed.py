"""The machine's speed during an episode, read against a profile.

A live comparison plays its policies one after another on the same traces. On a shared
machine the speed moves between episodes (docs/profile.md), and a policy's tokens/s then
moves with it. The profile says what each step should have cost at the speed it was measured
at, so each episode's own steps time the machine: :func:`episode_speed` is the episode's
decode seconds over the profile's for the same steps, 1.0 at the profile's speed and 1.3 when
the machine ran 30% slower. It reads the steps a profile's cells are made of
(:func:`specrl.profile.timing.clean_steps`): those that admitted nothing and caught nothing
up (the profile charges prefill and the draft's catch-up after K=0 steps apart from the
step).

Read one policy's episodes against each other: they serve different traces of one workload
with one rule, so their speeds differ by what the machine did (and by where the profile's
table errs on those steps, which is nearly the same for each). Two policies' speeds also
differ by the table's error on the steps where their K differ, so a ratio between two
policies is never corrected by them here: the speeds say when the machine, not the policy,
moved a run.
"""

from __future__ import annotations

import math

from specrl.profile.costs import StepCosts


def episode_speed(episode, costs: StepCosts) -> float:
    """``episode``'s decode seconds over the profile's (``costs``) for the same steps: each
    step that decoded rows, admitted none and caught nothing up. NaN when no step
    qualifies. ``episode`` is a :class:`specrl.envs.rollout.EpisodeResult` (or anything with
    its per-step lists)."""
    measured = table = 0.0
    steps = zip(
        episode.step_batch,
        episode.step_k,
        episode.step_context,
        episode.step_seconds,
        episode.step_admitted,
        episode.step_caught_up,
        strict=True,
    )
    for batch, k, context, seconds, admitted, caught_up in steps:
        if batch <= 0 or admitted or caught_up:
            continue
        measured += seconds
        table += costs.seconds(batch, k, context)
    return measured / table if table > 0 else math.nan


def speed_spread(speeds: list[float]) -> float:
    """How far apart the finite ``speeds`` are: the largest over the smallest, less 1 (0 for
    fewer than two)."""
    finite = [s for s in speeds if math.isfinite(s) and s > 0]
    if len(finite) < 2:
        return 0.0
    return max(finite) / min(finite) - 1.0
