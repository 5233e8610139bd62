"""``specrl bench sweep``: what running trials side by side on Ray buys on this machine.

The same small sweep (``trials`` seeds of one configuration, one torch thread each) runs
twice under Ray Tune: one trial at a time, then ``concurrent`` at once. It prints the
wall-time ratio of the two (the goal on 2 cores: at most 0.65), Ray's start-up time, and
Ray's overhead per trial: the one-at-a-time sweep's trial time beyond what the trials
themselves measured (train, export, compare).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from specrl.files import read_json
from specrl.sweep.spec import spec_from_json
from specrl.sweep.trial import METRICS_FILE, trial_dir
from specrl.sweep.tune import run_sweep

GOAL = 0.65
"""Wall time of ``concurrent`` trials at once over one at a time, on 2 cores."""


def bench_spec(trials: int, timesteps: int) -> dict:
    """A sweep of ``trials`` seeds of one small configuration on the shipped profile."""
    return {
        "workloads": [["ramp", "steady-8"]],
        "seeds": list(range(trials)),
        "train": {
            "total_timesteps": timesteps,
            "max_batch": 16,
            "n_requests": 32,
            "n_envs": 2,
            "n_steps": 256,
            "batch_size": 256,
            "eval_every": 0,
            "warm_start": "none",
            "eval_workloads": ["ramp"],
        },
        "compare": {"workloads": ["ramp"], "episodes": 1},
        "export": {"search": False},
        "wandb": "disabled",
    }


def run(*, trials: int = 4, concurrent: int = 2, timesteps: int = 4096, out: str | None = None):
    """Run the sweep both ways and print the ratios; returns them."""
    root = Path(out) if out else Path(tempfile.mkdtemp(prefix="specrl-bench-sweep-"))
    spec = spec_from_json(bench_spec(trials, timesteps), source="the benchmark's spec")
    one = run_sweep(spec, root / "one-at-a-time", max_concurrent=1, cpus_per_trial=1)
    both = run_sweep(spec, root / "side-by-side", max_concurrent=concurrent, cpus_per_trial=1)
    measured = sum(
        sum(
            read_json(trial_dir(one.out, t) / METRICS_FILE, "trial metrics", "run it again")[
                "seconds"
            ].values()
        )
        for t in spec.trials()
    )
    ratio = both.seconds["trials"] / one.seconds["trials"]
    overhead = (one.seconds["trials"] - measured) / trials
    print(
        f"\n{trials} trials, one torch thread each: one at a time {one.seconds['trials']:.1f} s, "
        f"{concurrent} at once {both.seconds['trials']:.1f} s: ratio {ratio:.2f} (goal <= "
        f"{GOAL}); Ray up in {one.seconds['ray_start']:.1f} s and "
        f"{both.seconds['ray_start']:.1f} s; Ray's overhead per trial {overhead:.1f} s (the "
        f"one-at-a-time sweep's {one.seconds['trials']:.1f} s less the {measured:.1f} s the "
        f"trials measured); sweeps in {root}"
    )
    return {"ratio": ratio, "ray_start_s": one.seconds["ray_start"], "overhead_s": overhead}
