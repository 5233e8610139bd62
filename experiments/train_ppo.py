"""Train the K controller with PPO on the surrogate: the same training as ``specrl train``.

    python experiments/train_ppo.py --total-timesteps 300000 --seed 1
    python experiments/train_ppo.py --help

Every field of ``Args`` is an option (``net_arch`` as ``64,64``, ``workloads`` as a comma
list); its docstring is the help text. The run directory is ``runs/{exp_name}__{seed}__{time}``
unless ``--out`` names one.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from args import parse_dataclass

from specrl.errors import SpecrlError
from specrl.train import TrainConfig, train
from specrl.train.cli import format_summary

DEFAULT = TrainConfig()


@dataclass
class Args:
    exp_name: str = "train_ppo"
    """Name of the experiment: the first part of the run directory's name."""
    out: str = ""
    """Run directory; empty: runs/{exp_name}__{seed}__{unix time}."""
    seed: int = DEFAULT.seed
    """Seed of the model, the global RNGs and the training envs."""
    total_timesteps: int = DEFAULT.total_timesteps
    """Env steps to train for, over all envs."""
    env: str = DEFAULT.env
    """Where PPO trains: surrogate or live (the real engine on this machine, one env)."""
    preset: str = DEFAULT.preset
    """The default pair the live env serves with (--env live)."""
    init: str = ""
    """A finished run to fine-tune (its model.zip); empty: a new network."""
    force_profile: bool = DEFAULT.force_profile
    """--env live: use a profile measured elsewhere, or stale, with a warning."""
    workloads: tuple[str, ...] = DEFAULT.workloads
    """Workload presets drawn per training episode."""
    n_requests: int = 0
    """Requests per preset trace; 0: the preset's own."""
    profile: str = ""
    """Hardware profile JSON; empty: the one shipped with specrl."""
    max_batch: int = DEFAULT.max_batch
    """Most rows decoded in one step."""
    max_len: int = DEFAULT.max_len
    """Longest sequence (prompt + output) a row may reach."""
    k_max: int = DEFAULT.k_max
    """Largest K; actions are 0..k_max (0: speculation off)."""
    n_envs: int = 0
    """Training envs stepped together; 0: 8 on the surrogate, 1 live (the only
    count the live env takes)."""
    n_steps: int = DEFAULT.n_steps
    """Steps per env per rollout."""
    batch_size: int = DEFAULT.batch_size
    """PPO minibatch size."""
    n_epochs: int = DEFAULT.n_epochs
    """Passes over each rollout."""
    learning_rate: float = DEFAULT.learning_rate
    """Adam learning rate."""
    gamma: float = DEFAULT.gamma
    """Discount per step."""
    gae_lambda: float = DEFAULT.gae_lambda
    """GAE lambda."""
    ent_coef: float = DEFAULT.ent_coef
    """Entropy bonus."""
    net_arch: tuple[int, ...] = DEFAULT.net_arch
    """Hidden layer widths of the policy and value networks."""
    reward_reference: str = DEFAULT.reward_reference
    """Rate a step's seconds are charged at: batch (per batch size) or workload."""
    shape_catchup: bool = DEFAULT.shape_catchup
    """Potential-based shaping with the draft's catch-up debt."""
    warm_start: str = DEFAULT.warm_start
    """Controller imitated before PPO (a policy name, or none)."""
    reference_floor: bool = DEFAULT.reference_floor
    """Floor the reward's reference at the warm start teacher's rate per batch size."""
    warm_start_episodes: int = DEFAULT.warm_start_episodes
    """Episodes of each training workload the warm start's teacher plays."""
    warm_start_epochs: int = DEFAULT.warm_start_epochs
    """Passes of behaviour cloning."""
    normalize_reward: bool = DEFAULT.normalize_reward
    """Scale rewards by the running spread of the discounted return (SB3 VecNormalize)."""
    eval_workloads: tuple[str, ...] = DEFAULT.eval_workloads
    """Workload presets of the held-out evaluation."""
    eval_episodes: int = DEFAULT.eval_episodes
    """Episodes per evaluation workload."""
    eval_seed: int = DEFAULT.eval_seed
    """Seed of the first evaluation episode (far from the training seeds)."""
    eval_every: int = DEFAULT.eval_every
    """Env steps between held-out evaluations (0: the final one only)."""
    checkpoint_every: int = DEFAULT.checkpoint_every
    """Env steps between checkpoints."""
    wandb: str = DEFAULT.wandb
    """wandb mode: offline, online or disabled."""
    torch_threads: int = DEFAULT.torch_threads
    """torch intra-op threads."""


def parse_args(argv: list[str] | None = None) -> Args:
    """``Args`` from the command line: one ``--option`` per field, help from its docstring."""
    return parse_dataclass(Args, argv, __doc__)


def config_from(args: Args) -> TrainConfig:
    out = args.out or f"runs/{args.exp_name}__{args.seed}__{int(time.time())}"
    return TrainConfig(
        out=out,
        seed=args.seed,
        total_timesteps=args.total_timesteps,
        env=args.env,
        preset=args.preset,
        init=args.init or None,
        force_profile=args.force_profile,
        workloads=args.workloads,
        n_requests=args.n_requests or None,
        profile=args.profile or None,
        max_batch=args.max_batch,
        max_len=args.max_len,
        k_max=args.k_max,
        n_envs=args.n_envs or (1 if args.env == "live" else DEFAULT.n_envs),
        n_steps=args.n_steps,
        batch_size=args.batch_size,
        n_epochs=args.n_epochs,
        learning_rate=args.learning_rate,
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        ent_coef=args.ent_coef,
        net_arch=args.net_arch,
        normalize_reward=args.normalize_reward,
        reward_reference=args.reward_reference,
        shape_catchup=args.shape_catchup,
        warm_start=args.warm_start,
        warm_start_episodes=args.warm_start_episodes,
        warm_start_epochs=args.warm_start_epochs,
        reference_floor=args.reference_floor,
        eval_workloads=args.eval_workloads,
        eval_episodes=args.eval_episodes,
        eval_seed=args.eval_seed,
        eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every,
        wandb=args.wandb,
        torch_threads=args.torch_threads,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = train(config_from(args))
    except SpecrlError as err:
        print(f"train_ppo: error: {err}", file=sys.stderr)
        return 2
    print(format_summary(result.summary))
    print(f"run directory: {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
