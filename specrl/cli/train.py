"""``specrl train``: PPO on the surrogate, with checkpoints, held-out evaluation and logs."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from specrl import options


def add_parser(sub: argparse._SubParsersAction) -> None:
    from specrl.options import WANDB_MODES
    from specrl.train.config import TrainConfig

    parser = sub.add_parser(
        "train",
        help="train the K controller with PPO on the surrogate",
        description="Train PPO on the surrogate over a mix of workloads with fresh seeds per "
        "episode. Checkpoints go to RUN_DIR/checkpoints (a killed run continues with "
        "--resume RUN_DIR), tensorboard logs to RUN_DIR/tb, wandb (offline by default) to "
        "RUN_DIR/wandb; the best-evaluated model to RUN_DIR/model.zip (the last weights to "
        "last_model.zip) and the held-out evaluation "
        "(tokens/s against the best static K and the oracle) to RUN_DIR/summary.json.",
    )
    parser.add_argument("--out", metavar="RUN_DIR", help="run directory of a new run")
    parser.add_argument(
        "--resume", metavar="RUN_DIR", help="continue this run from its newest checkpoint"
    )
    parser.add_argument(
        "--config",
        metavar="CONFIG.json",
        help="a new run with every setting of this training config (a run's config.json, or "
        "one written with TrainConfig.save); the options given here override it",
    )
    parser.add_argument(
        "--timesteps",
        type=options.positive_int,
        default=None,
        help=f"total env steps (default {TrainConfig.total_timesteps:,}: about 2.5 minutes on "
        "2 cores; with --resume: the run's own unless given)",
    )
    parser.add_argument("--seed", type=options.SEED, default=None, help="default 0 (new runs only)")
    parser.add_argument(
        "--wandb", choices=WANDB_MODES, default=None, help="wandb mode (default offline)"
    )
    parser.add_argument(
        "--profile", metavar="PROFILE.json", help="hardware profile (default: the shipped one)"
    )
    parser.add_argument(
        "--env",
        choices=("surrogate", "live"),
        default=None,
        help="train on the surrogate (default) or on the live engine (one env, slow)",
    )
    parser.add_argument(
        "--init", metavar="RUN_DIR", help="start from this finished run's model (fine-tune)"
    )
    parser.add_argument(
        "--n-requests",
        type=options.N_REQUESTS,
        default=None,
        help="requests per training trace (default: the preset's own)",
    )
    parser.add_argument(
        "--max-len",
        type=options.positive_int,
        default=None,
        help=f"longest request, prompt plus output tokens (default {TrainConfig.max_len}; raise "
        "it for a profile of long prompts)",
    )
    parser.add_argument(
        "--preset",
        type=options.model_preset,
        default=None,
        help="--env live: the default pair (small)",
    )
    parser.add_argument(
        "--force-profile",
        action="store_true",
        help="--env live: accept a profile measured elsewhere, or stale",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """The TrainConfig ``args`` ask for, and whether it resumes a run."""
    from specrl.errors import SpecrlError
    from specrl.train.config import TrainConfig

    if bool(args.out) == bool(args.resume):
        which = "not both" if args.out else "one of them (--config sets the settings, not the run)"
        raise SpecrlError(f"give --out RUN_DIR for a new run or --resume RUN_DIR, {which}")
    changes = {"total_timesteps": args.timesteps, "wandb": args.wandb}
    changes = {name: value for name, value in changes.items() if value is not None}
    base = _base_config(args.config) if args.config else TrainConfig()
    new_only = {
        "seed": args.seed,
        "profile": args.profile,
        "env": args.env,
        "init": args.init,
        "n_requests": args.n_requests,
        "max_len": args.max_len,
        "preset": args.preset,
        "force_profile": args.force_profile or None,
    }
    if args.out:
        live_only = [
            f"--{name.replace('_', '-')}"
            for name in ("preset", "force_profile")
            if new_only[name] is not None
        ]
        if live_only and (args.env or base.env) != "live":
            verb, them = ("apply", "them") if len(live_only) > 1 else ("applies", "it")
            raise SpecrlError(
                f"{' and '.join(live_only)} {verb} to --env live only (the surrogate trains "
                f"on the profile); add --env live or drop {them}"
            )
        changes.update({name: value for name, value in new_only.items() if value is not None})
        if changes.get("env") == "live":
            changes["n_envs"] = 1
        return dataclasses.replace(base, out=args.out, **changes), False
    if args.config or any(value is not None for value in new_only.values()):
        raise SpecrlError(
            "--config, --seed, --profile, --env, --init, --n-requests, --max-len, --preset and "
            "--force-profile are fixed when a run starts; --resume takes --timesteps and "
            "--wandb only"
        )
    config = _resume_config(args.resume)
    changes["out"] = args.resume
    return TrainConfig.from_json({**config.to_json(), **changes}, source=args.resume), True


def _base_config(path: str):
    """The TrainConfig in the JSON file ``path`` (``--config``)."""
    from specrl.files import read_json
    from specrl.train.config import TrainConfig

    obj = read_json(path, "training config", "give a run's config.json")
    return TrainConfig.from_json(obj, source=path)


def _resume_config(run_dir: str):
    """The config of the run's newest checkpoint (what it was training to when it stopped, a
    raised --timesteps included); config.json where there is no checkpoint to read."""
    from specrl.errors import SpecrlError
    from specrl.train.config import load_config
    from specrl.train.run import latest_checkpoint

    try:
        return latest_checkpoint(run_dir).config
    except SpecrlError:
        return load_config(run_dir)  # train() then says why it cannot resume


def run(args: argparse.Namespace) -> int:
    from specrl.train.run import check_start, train

    config, resume = config_from_args(args)
    checkpoint = check_start(config, resume=resume)  # refused before anything is printed
    if checkpoint is not None:
        at = checkpoint.num_timesteps
        print(f"resuming {config.out} from its checkpoint at step {at:,}", end="")
    else:
        print(f"training {config.out} on the {config.env} env", end="")
    print(
        f", to {config.total_timesteps:,} steps; a checkpoint every "
        f"{config.checkpoint_every:,} steps",
        flush=True,
    )
    try:
        result = train(config, resume=resume, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"specrl train: {interrupted_note(config.out)}", file=sys.stderr)
        raise
    print(format_summary(result.summary))
    print(f"wrote {result.run_dir}/model.zip and {result.run_dir}/summary.json")
    return 0


def interrupted_note(run_dir) -> str:
    """What a stopped run left behind, and how to go on."""
    from pathlib import Path

    from specrl.errors import SpecrlError
    from specrl.train.config import CHECKPOINT_DIR
    from specrl.train.run import latest_checkpoint

    try:
        at = latest_checkpoint(run_dir).num_timesteps
    except SpecrlError as err:
        if any(Path(run_dir, CHECKPOINT_DIR).glob("step-*")):
            return f"stopped, and its newest checkpoint is unreadable: {err}"
        return (
            f"stopped before its first checkpoint: nothing to resume; delete {run_dir} and "
            "start again"
        )
    return (
        f"stopped; its last checkpoint is at step {at:,}: `specrl train --resume {run_dir}` "
        "continues from there"
    )


def format_summary(summary: dict) -> str:
    """The held-out evaluation of the run's model and the time split, as a Markdown table and
    a line."""
    final = summary.get("model_eval") or summary["final_eval"]
    lines = [
        f"{summary['num_timesteps']:,} steps; the model is the best evaluated, at "
        f"{final['timesteps']:,} steps; its held-out evaluation:",
        "| workload | PPO tokens/s | best static | / best static | / oracle | K shares |",
        "|---|---|---|---|---|---|",
    ]
    for name, w in final["by_workload"].items():
        shares = " ".join(f"{k}:{s:.2f}" for k, s in w["k_share"].items())
        lines.append(
            f"| {name} | {w['tokens_per_s']:.0f} | {w['best_static']} "
            f"({w['best_static_tokens_per_s']:.0f}) | {w['ratio_best_static']:.3f} | "
            f"{w['ratio_oracle']:.3f} | {shares} |"
        )
    lines.append(
        f"mean: {final['ratio_best_static']:.3f}x best static, {final['ratio_oracle']:.3f}x oracle"
    )
    t = summary["timing"]
    lines.append(
        f"this session: {t['steps']:,} steps in {t['wall_s']:.0f} s ({t['steps_per_s']:.0f} "
        f"steps/s); env {t['env_share']:.0%}, PPO updates {t['update_s'] / t['wall_s']:.0%}, "
        f"evaluation {t['eval_s'] / t['wall_s']:.0%}, checkpoints "
        f"{t['checkpoint_s'] / t['wall_s']:.0%}, rest (policy forward in rollouts) "
        f"{t['rest_s'] / t['wall_s']:.0%}"
    )
    return "\n".join(lines)
