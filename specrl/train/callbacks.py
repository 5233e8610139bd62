"""The training session's shared state (:class:`RunState`) and the SB3 callbacks that
evaluate, checkpoint and show progress as PPO trains."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrl.config import BEST_MODEL_FILE, TrainConfig
from specrl.envs.training import RateReference
from specrl.files import write_atomic
from specrl.policies.ppo import PPOPolicy
from specrl.train.checkpoint import model_bytes, save_checkpoint
from specrl.train.evaluate import EvalResult, Evaluation
from specrl.train.logs import log_to_wandb
from specrl.train.state import (
    SurrogateEpisodes,
    env_streams,
    rng_state,
    vec_normalize_state,
)


@dataclass
class RunState:
    """What the callbacks share and the summary reports."""

    run_dir: Path
    config: TrainConfig
    profile_sha256: str
    """Of the profile file the run trains on, checkpointed: a resume on a changed one is
    refused."""
    evaluation: Evaluation
    reference: RateReference
    episodes: SurrogateEpisodes | None
    """The surrogate's training envs to checkpoint; None live."""
    wandb_id: str | None
    eval_history: list[dict]
    next_eval: int
    next_checkpoint: int
    eval_s: float = 0.0
    checkpoint_s: float = 0.0
    update_s: float = 0.0
    """Seconds in PPO updates (rollout end to the next rollout start)."""
    rollout_end: float | None = None
    last_eval: EvalResult | None = None
    warm_start: dict | None = None
    """What :func:`~specrl.train.warm_start.warm_start` returned, with its seconds; None without
    one."""
    best: dict | None = None
    """The best evaluation so far (:meth:`EvalResult.to_json`); its model is
    ``BEST_MODEL_FILE``."""

    def save_checkpoint(self, model, vec_env) -> Path:
        state = {
            "config": self.config.to_json(),
            "profile_sha256": self.profile_sha256,
            "rng": rng_state(),
            "vec_normalize": vec_normalize_state(vec_env),
            "reference": self.reference.to_json(),
            "wandb_id": self.wandb_id,
            "eval_history": self.eval_history,
            "warm_start": self.warm_start,
            "best": self.best,
        }
        if self.episodes is None:
            state["env_streams"] = env_streams(vec_env)
            return save_checkpoint(model, self.run_dir, state)
        return save_checkpoint(model, self.run_dir, state, self.episodes.dumps())

    def evaluate(self, model, logger) -> EvalResult:
        start = time.perf_counter()
        policy = PPOPolicy(model, max_batch=self.config.max_batch)
        result = self.evaluation.run(policy, model.num_timesteps)
        self.eval_s += time.perf_counter() - start
        self.last_eval = result
        self.eval_history.append(result.to_json())
        if self.best is None or result.ratio_best_static > self.best["ratio_best_static"]:
            write_atomic(self.run_dir / BEST_MODEL_FILE, model_bytes(model))
            self.best = result.to_json()
        logger.record("eval/tokens_per_s", result.tokens_per_s)
        logger.record("eval/ratio_best_static", result.ratio_best_static)
        logger.record("eval/ratio_oracle", result.ratio_oracle)
        for name, figures in result.by_workload.items():
            logger.record(f"eval/{name}/ratio_best_static", figures["ratio_best_static"])
            logger.record(f"eval/{name}/ratio_oracle", figures["ratio_oracle"])
        for k, share in result.k_share.items():
            logger.record(f"eval/k_share_{k}", share)
        logger.record("eval/k", np.asarray(result.step_k), exclude=("stdout", "log", "json", "csv"))
        logger.dump(model.num_timesteps)
        log_to_wandb(result)
        return result

    def timing(self, vec_env, *, steps: int, wall_s: float) -> dict:
        """Where this session's training time went: env steps and resets, PPO updates,
        held-out evaluation, checkpoints, and the rest (mostly the policy's forward passes in
        rollouts)."""
        env_s = float(sum(vec_env.get_attr("env_seconds")))
        return {
            "steps": steps,
            "wall_s": wall_s,
            "steps_per_s": steps / wall_s if wall_s > 0 else 0.0,
            "env_s": env_s,
            "env_share": env_s / wall_s if wall_s > 0 else 0.0,
            "update_s": self.update_s,
            "eval_s": self.eval_s,
            "checkpoint_s": self.checkpoint_s,
            "rest_s": wall_s - env_s - self.update_s - self.eval_s - self.checkpoint_s,
        }


def make_callbacks(run: RunState, *, progress: bool) -> list:
    """SB3 callbacks: evaluation and checkpoints at rollout starts (the policy has just been
    updated and ``num_timesteps`` counts exactly the steps it learned from), and a progress
    bar."""
    from stable_baselines3.common.callbacks import BaseCallback

    class EvalAndCheckpoint(BaseCallback):
        def _on_rollout_end(self) -> None:
            run.rollout_end = time.perf_counter()

        def _on_rollout_start(self) -> None:
            if run.rollout_end is not None:
                run.update_s += time.perf_counter() - run.rollout_end
                run.rollout_end = None
            steps = self.model.num_timesteps
            if run.config.eval_every and steps >= run.next_eval:
                run.evaluate(self.model, self.logger)
                run.next_eval = next_multiple(steps, run.config.eval_every)
            if steps >= run.next_checkpoint:
                start = time.perf_counter()
                run.save_checkpoint(self.model, self.training_env)
                run.checkpoint_s += time.perf_counter() - start
                run.next_checkpoint = next_multiple(steps, run.config.checkpoint_every)

        def _on_step(self) -> bool:
            return True

    class ProgressBar(BaseCallback):
        def _on_training_start(self) -> None:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=run.config.total_timesteps,
                initial=self.model.num_timesteps,
                unit="step",
                desc="train",
                disable=not progress,
            )
            self.shown_eval = None

        def _on_step(self) -> bool:
            self.bar.update(self.training_env.num_envs)
            if run.last_eval is not None and run.last_eval is not self.shown_eval:
                self.shown_eval = run.last_eval
                self.bar.set_postfix_str(
                    f"eval {run.last_eval.ratio_best_static:.3f}x best static, "
                    f"{run.last_eval.ratio_oracle:.3f}x oracle"
                )
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    return [EvalAndCheckpoint(), ProgressBar()]


def next_multiple(steps: int, every: int) -> int:
    return (steps // every + 1) * every
