"""A short SB3 PPO run on the surrogate starts and finishes."""

from __future__ import annotations

import numpy as np

from specrl.envs import SurrogateSpecEnv
from specrl.profile.synthetic import linear_profile


def test_short_ppo_run_on_the_surrogate():
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger

    env = SurrogateSpecEnv(
        profile=linear_profile(), workload_kwargs={"n_requests": 32, "peak": 8}, max_batch=8
    )
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=512,
        batch_size=128,
        n_epochs=2,
        policy_kwargs={"net_arch": [8]},
        seed=0,
        device="cpu",
    )
    # SB3's default logger makes an SB3-<time> folder in the temp directory on each learn().
    model.set_logger(Logger(folder=None, output_formats=[]))
    model.learn(total_timesteps=2048)
    assert model.num_timesteps == 2048
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert env.action_space.contains(int(action))
    assert np.isfinite(model.logger.name_to_value["train/loss"])
