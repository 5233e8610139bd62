"""``specrl train``: PPO on the surrogate, with checkpoints, held-out evaluation and logs."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys

import tyro

from specrl.config import CHECKPOINT_DIR, TrainConfig, load_config
from specrl.dataclass_cli import Option, options, parse
from specrl.errors import SpecrlError
from specrl.files import read_json

SHORT_FLAGS = {"total_timesteps": "--timesteps"}
"""Fields ``specrl train`` also takes under a shorter flag than tyro's."""
ON_RESUME = ("total_timesteps", "wandb")
"""The settings ``--resume`` takes; every other one is fixed when a run starts."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train",
        help="train the K controller with PPO on the surrogate",
        description="Train PPO on the surrogate over a mix of workloads with fresh seeds per "
        "episode. Checkpoints go to RUN_DIR/checkpoints (a killed run continues with "
        "--resume RUN_DIR), tensorboard logs to RUN_DIR/tb, wandb (offline by default) to "
        "RUN_DIR/wandb; the best-evaluated model to RUN_DIR/model.zip (the last weights to "
        "last_model.zip) and the held-out evaluation "
        "(tokens/s against the best static K and the oracle) to RUN_DIR/summary.json.",
        usage="specrl train (--out RUN_DIR | --resume RUN_DIR) [--config CONFIG.json] "
        "[--no-progress] [TRAINING OPTIONS]",
        add_help=False,
    )
    parser.add_argument(
        "-h", "--help", action=_Help, nargs=0, help="show this help message and exit"
    )
    parser.add_argument(
        "--resume", metavar="RUN_DIR", help="continue this run from its newest checkpoint"
    )
    parser.add_argument(
        "--config",
        metavar="CONFIG.json",
        help="a new run with every setting of this training config (a run's config.json, or "
        "one written with TrainConfig.save); the options given here override it",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    for option in options(TrainConfig):
        flags = option.flags + ((SHORT_FLAGS[option.field],) if option.field in SHORT_FLAGS else ())
        for flag in flags:
            parser.add_argument(
                flag,
                dest="settings",
                action=_Setting,
                option=option,
                nargs=0 if option.is_flag else None,
                type=None if option.spec is None else _checked(option.spec),
                help=argparse.SUPPRESS,
            )
    parser.set_defaults(func=run, settings=())


class _Setting(argparse.Action):
    """A TrainConfig option: kept as ``(field, tyro's tokens)`` in ``settings``, its value
    already read by the field's spec (``type``), so a bad one is refused while the command
    line is parsed."""

    def __init__(self, *args, option: Option, **kwargs):
        super().__init__(*args, **kwargs)
        self.option = option

    def __call__(self, parser, namespace, values, option_string=None):
        tokens = [option_string] if self.option.is_flag else [self.option.flags[0], values]
        namespace.settings = (*namespace.settings, (self.option.field, tokens))


def _checked(spec):
    """argparse type: ``text`` as given, once the field's spec reads it."""

    def check(text: str) -> str:
        spec.instance_from_str([text])
        return text

    check.__name__ = spec.metavar
    return check


class _Help(argparse.Action):
    """``specrl train --help``: the command's own options, then TrainConfig's as tyro shows
    them (each field's docstring)."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help()
        print(
            "\ntraining options, one per TrainConfig field (--timesteps is --total-timesteps); "
            "--resume takes --timesteps and --wandb only:"
        )
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            with contextlib.suppress(SystemExit):
                tyro.cli(TrainConfig, args=["--help"], prog="specrl train", description="")
        print(shown.getvalue().split("\n\n", 1)[-1], end="")
        parser.exit()


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, bool]:
    """The TrainConfig ``args`` ask for, and whether it resumes a run."""
    given = dict(args.settings)  # field -> tokens; the last given wins
    out = given["out"][1] if "out" in given else None
    if bool(out) == bool(args.resume):
        which = "not both" if out else "one of them (--config sets the settings, not the run)"
        raise SpecrlError(f"give --out RUN_DIR for a new run or --resume RUN_DIR, {which}")
    if args.resume:
        fixed = ["--config"] * bool(args.config)
        fixed += [tokens[0] for field, tokens in given.items() if field not in ON_RESUME]
        if fixed:
            raise SpecrlError(
                "--config, --seed and every other training option but --timesteps and --wandb "
                f"are fixed when a run starts; --resume takes --timesteps and --wandb only: "
                f"drop {', '.join(fixed)}"
            )
        base = _resume_config(args.resume)
        tokens = [t for tokens in given.values() for t in tokens] + ["--out", args.resume]
        return parse(TrainConfig, tokens, default=base), True
    base = _base_config(args.config) if args.config else TrainConfig()
    env = given["env"][1] if "env" in given else base.env
    flags = {tokens[0] for tokens in given.values()}
    live_only = [flag for flag in ("--preset", "--force-profile") if flag in flags]
    if live_only and env != "live":
        verb, them = ("apply", "them") if len(live_only) > 1 else ("applies", "it")
        raise SpecrlError(
            f"{' and '.join(live_only)} {verb} to --env live only (the surrogate trains "
            f"on the profile); add --env live or drop {them}"
        )
    if "env" in given and env == "live" and "n_envs" not in given:
        given["n_envs"] = ["--n-envs", "1"]  # the live env is one engine
    tokens = [t for tokens in given.values() for t in tokens]
    return parse(TrainConfig, tokens, default=base), False


def _base_config(path: str):
    """The TrainConfig in the JSON file ``path`` (``--config``)."""

    obj = read_json(path, "training config", "give a run's config.json")
    return TrainConfig.from_json(obj, source=path)


def _resume_config(run_dir: str):
    """The config of the run's newest checkpoint (what it was training to when it stopped, a
    raised --timesteps included); config.json where there is no checkpoint to read."""
    from specrl.train.checkpoint import latest_checkpoint

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

    from specrl.train.checkpoint import latest_checkpoint

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
