"""The warm start: behaviour cloning of a known controller before PPO trains."""

from __future__ import annotations

import numpy as np

from specrl.config import TrainConfig
from specrl.envs.training import RateReference, decode_part, policy_observation
from specrl.errors import SpecrlError
from specrl.policies import make_policy
from specrl.policies.registry import trained_estimate
from specrl.profile import Profile
from specrl.seeds import WARM_START_SEED
from specrl.train.envs import surrogate_env

CLONE_BATCH = 256
"""States per minibatch of the cloning."""


def check_teacher(config: TrainConfig) -> None:
    """Refuse, before a run starts, a warm start from a ``lookup:`` table or ``ppo:`` run
    trained on another acceptance estimate than the run observes: it would read the run's
    figure as its own."""
    if config.warm_start == "none" or config.init:
        return
    theirs = trained_estimate([config.warm_start], default=config.acceptance_estimate)
    if theirs != config.acceptance_estimate:
        raise SpecrlError(
            f"--warm-start {config.warm_start} was trained on the {theirs!r} acceptance "
            f"estimate, and this run observes {config.acceptance_estimate!r}; pass "
            f"--acceptance-estimate {theirs}, or warm-start from a teacher that reads this "
            "run's figure (oracle, a baseline, or a table or run trained on it)"
        )


def warm_start(
    model,
    config: TrainConfig,
    profile: Profile,
    *,
    progress: bool = True,
    reference: RateReference | None = None,
) -> dict:
    """Behaviour cloning: fit the policy network's action distribution to
    ``config.warm_start``'s choices on the states it visits (cross-entropy, Adam, minibatches
    of :data:`CLONE_BATCH`, ``config.warm_start_epochs`` passes). The value network is left to
    PPO. Returns the number of states and the share where the network's most probable K is the
    teacher's. With ``reference`` (per batch size), the tokens/s the teacher reached at each
    batch size becomes its floor (:meth:`RateReference.set_floor`).

    The teacher plays ``config.warm_start_episodes`` episodes of each training workload:
    episode ``j`` of workload ``i`` is reset with ``WARM_START_SEED + i + j * len(workloads)``
    (:data:`specrl.seeds.WARM_START_SEED`: neither training nor evaluation uses these seeds).
    """
    states, actions, decode = _teacher_states(config, profile, progress=progress)
    if reference is not None:
        reference.set_floor(*decode)
    x = policy_observation(np.asarray(states), config.max_batch)
    return {
        "teacher": config.warm_start,
        "states": len(actions),
        "accuracy": _clone(model, x, np.asarray(actions, dtype=np.int64), config, progress),
    }


def _teacher_states(config: TrainConfig, profile: Profile, *, progress: bool):
    """The env observations the teacher visits and the K it chooses there, and per batch size
    ``0..max_batch`` its decode's tokens, seconds and steps (:func:`decode_part`)."""
    from tqdm.auto import tqdm

    states, actions = [], []
    size = config.max_batch + 1
    tokens, seconds, steps = np.zeros(size), np.zeros(size), np.zeros(size, dtype=np.int64)
    n = len(config.workloads)
    episodes = [
        (i, name, j)
        for j in range(config.warm_start_episodes)
        for i, name in enumerate(config.workloads)
    ]
    for i, name, j in tqdm(episodes, desc="warm start: states", disable=not progress):
        env = surrogate_env(config, profile, name)
        teacher = make_policy(config.warm_start, env=env)
        obs, _ = env.reset(seed=WARM_START_SEED + i + j * n)
        start, done = True, False
        while not done:
            k, _ = teacher.predict(obs, episode_start=np.array([start]))
            start = False
            states.append(obs)
            actions.append(int(k))
            obs, _, terminated, truncated, info = env.step(k)
            done = terminated or truncated
            rows = max(info["batch"], 1)
            decoded, decode_s = decode_part(info)
            tokens[rows] += decoded
            seconds[rows] += decode_s
            steps[rows] += 1
    return states, actions, (tokens, seconds, steps)


def _clone(model, x: np.ndarray, y: np.ndarray, config: TrainConfig, progress: bool) -> float:
    """Fit ``model``'s action distribution to ``y`` at ``x`` (``x: [S, 3]``, ``y: [S]``);
    returns the share of states where its most probable K is ``y``'s."""
    import torch
    from tqdm.auto import tqdm

    x, y = torch.as_tensor(x), torch.as_tensor(y)
    policy = model.policy
    params = [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters()]
    if policy.share_features_extractor:
        params += list(policy.features_extractor.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3)
    generator = torch.Generator().manual_seed(config.seed)
    for _ in tqdm(
        range(config.warm_start_epochs), desc="warm start: cloning", disable=not progress
    ):
        for batch in torch.randperm(len(y), generator=generator).split(CLONE_BATCH):
            loss = -policy.get_distribution(x[batch]).log_prob(y[batch]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        chosen = policy.get_distribution(x).distribution.probs.argmax(dim=1)
    return float((chosen == y).float().mean())
