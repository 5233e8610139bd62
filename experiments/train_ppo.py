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

from args import arg, one_of, parse_dataclass

from specrl.cli.train import format_summary
from specrl.errors import SpecrlError
from specrl.options import (
    BATCH,
    K_MAX,
    N_REQUESTS_MAX,
    SEED,
    THREADS,
    WANDB_MODES,
    float_in,
    int_in,
    nonnegative_int,
    positive_int,
    workload_preset,
)
from specrl.train import TrainConfig, train

DEFAULT = TrainConfig()


@dataclass
class Args:
    exp_name: str = "train_ppo"
    """Name of the experiment: the first part of the run directory's name."""
    out: str = ""
    """Run directory; empty: runs/{exp_name}__{seed}__{unix time}."""
    seed: int = arg(DEFAULT.seed, SEED)
    """Seed of the model, the global RNGs and the training envs."""
    total_timesteps: int = arg(DEFAULT.total_timesteps, positive_int)
    """Env steps to train for, over all envs."""
    env: str = DEFAULT.env
    """Where PPO trains: surrogate or live (the real engine on this machine, one env)."""
    preset: str = DEFAULT.preset
    """The default pair the live env serves with (--env live)."""
    init: str = ""
    """A finished run to fine-tune (its model.zip); empty: a new network."""
    force_profile: bool = DEFAULT.force_profile
    """--env live: use a profile measured elsewhere, or stale, with a warning."""
    workloads: tuple[str, ...] = arg(DEFAULT.workloads, workload_preset)
    """Workload presets drawn per training episode."""
    n_requests: int = arg(0, int_in(0, N_REQUESTS_MAX))
    """Requests per preset trace; 0: the preset's own."""
    profile: str = ""
    """Hardware profile JSON; empty: the one shipped with specrl."""
    max_batch: int = arg(DEFAULT.max_batch, BATCH)
    """Most rows decoded in one step."""
    max_len: int = arg(DEFAULT.max_len, positive_int)
    """Longest sequence (prompt + output) a row may reach."""
    k_max: int = arg(DEFAULT.k_max, K_MAX)
    """Largest K; actions are 0..k_max (0: speculation off)."""
    n_envs: int = arg(0, nonnegative_int)
    """Training envs stepped together; 0: 8 on the surrogate, 1 live (the only
    count the live env takes)."""
    n_steps: int = arg(DEFAULT.n_steps, positive_int)
    """Steps per env per rollout."""
    batch_size: int = arg(DEFAULT.batch_size, int_in(2))
    """PPO minibatch size."""
    n_epochs: int = arg(DEFAULT.n_epochs, positive_int)
    """Passes over each rollout."""
    learning_rate: float = arg(DEFAULT.learning_rate, float_in(0.0, 1.0, low_open=True))
    """Adam learning rate."""
    gamma: float = arg(DEFAULT.gamma, float_in(0.0, 1.0, low_open=True))
    """Discount per step."""
    gae_lambda: float = arg(DEFAULT.gae_lambda, float_in(0.0, 1.0, low_open=True))
    """GAE lambda."""
    ent_coef: float = arg(DEFAULT.ent_coef, float_in(0.0, 1.0))
    """Entropy bonus."""
    net_arch: tuple[int, ...] = arg(DEFAULT.net_arch, positive_int)
    """Hidden layer widths of the policy and value networks."""
    reward_reference: str = DEFAULT.reward_reference
    """Rate a step's seconds are charged at: batch (per batch size) or workload."""
    shape_catchup: bool = DEFAULT.shape_catchup
    """Potential-based shaping with the draft's catch-up debt."""
    warm_start: str = DEFAULT.warm_start
    """Controller imitated before PPO (a policy name, or none)."""
    reference_floor: bool = DEFAULT.reference_floor
    """Floor the reward's reference at the warm start teacher's rate per batch size."""
    warm_start_episodes: int = arg(DEFAULT.warm_start_episodes, positive_int)
    """Episodes of each training workload the warm start's teacher plays."""
    warm_start_epochs: int = arg(DEFAULT.warm_start_epochs, positive_int)
    """Passes of behaviour cloning."""
    normalize_reward: bool = DEFAULT.normalize_reward
    """Scale rewards by the running spread of the discounted return (SB3 VecNormalize)."""
    eval_workloads: tuple[str, ...] = arg(DEFAULT.eval_workloads, workload_preset)
    """Workload presets of the held-out evaluation."""
    eval_episodes: int = arg(DEFAULT.eval_episodes, positive_int)
    """Episodes per evaluation workload."""
    eval_seed: int = arg(DEFAULT.eval_seed, SEED)
    """Seed of the first evaluation episode (far from the training seeds)."""
    eval_every: int = arg(DEFAULT.eval_every, nonnegative_int)
    """Env steps between held-out evaluations (0: the final one only)."""
    checkpoint_every: int = arg(DEFAULT.checkpoint_every, positive_int)
    """Env steps between checkpoints."""
    wandb: str = arg(DEFAULT.wandb, one_of(*WANDB_MODES))
    """wandb mode: offline, online or disabled."""
    torch_threads: int = arg(DEFAULT.torch_threads, THREADS)
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
