"""Train the K controller with PPO on the surrogate: the same training as ``specrl train``.

    python experiments/train_ppo.py --total-timesteps 300000 --seed 1
    python experiments/train_ppo.py --help

Every field of ``TrainConfig`` is an option (``net_arch`` as ``64,64``, ``workloads`` as a
comma list); its docstring is the help text. The run directory is
``runs/{exp_name}__{seed}__{time}`` unless ``--out`` names one.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, fields
from typing import Annotated

from specrl.cli.train import format_summary
from specrl.dataclass_cli import script_main, value
from specrl.options import nonnegative_int
from specrl.train import TrainConfig, train


@dataclass(frozen=True)
class Args(TrainConfig):
    """TrainConfig, with this script's run directory and env count by default."""

    out: str = ""
    """Run directory; empty: runs/{exp_name}__{seed}__{unix time}."""
    n_envs: Annotated[int, value(nonnegative_int)] = 0
    """Training envs stepped together; 0: 8 on the surrogate, 1 live (the only count the live
    env takes)."""
    exp_name: str = "train_ppo"
    """Name of the experiment: the first part of the run directory's name."""

    def __post_init__(self) -> None:
        if not self.out:
            run_name = f"{self.exp_name}__{self.seed}__{int(time.time())}"
            object.__setattr__(self, "out", f"runs/{run_name}")
        if self.n_envs == 0:
            object.__setattr__(self, "n_envs", 1 if self.env == "live" else TrainConfig.n_envs)
        super().__post_init__()

    def config(self) -> TrainConfig:
        """The run's TrainConfig: every field but ``exp_name``."""
        return TrainConfig(**{f.name: getattr(self, f.name) for f in fields(TrainConfig)})


def run(args: Args) -> None:
    result = train(args.config())
    print(format_summary(result.summary))
    print(f"run directory: {result.run_dir}")


def main(argv: list[str] | None = None) -> int:
    return script_main(Args, run, argv, __doc__, "train_ppo")


if __name__ == "__main__":
    sys.exit(main())
