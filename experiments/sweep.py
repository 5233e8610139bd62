"""Run a sweep on Ray Tune: every trial of a spec's grid (profiles x workload mixes x seeds x
training settings) trained, exported in every format and compared on held-out seeds, then
mean ± std over seeds per configuration. The same as `specrl sweep` (both call
specrl.sweep.tune.run_sweep).

    python experiments/sweep.py --spec sweep.yaml --out runs/sweep
    python experiments/sweep.py --spec sweep.yaml --out runs/sweep --resume
    python experiments/sweep.py --help

Writes ``OUT/summary.{csv,json}``, ``OUT/best/<profile>-<mix>/`` (the best table of each, in
every format), ``OUT/trials/<trial>/`` and Tune's experiment in ``OUT/ray/``. Exit status 1
if a trial failed (the summary says why).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated

from specrl.dataclass_cli import script_main, value
from specrl.options import nonnegative_int


@dataclass
class Args:
    spec: str
    """The sweep's spec file, YAML or JSON (docs/sweep.md)."""
    out: str
    """The sweep's folder."""
    address: str = ""
    """A Ray cluster's head node (HOST:PORT from `ray start --head`, ray://HOST:PORT, or auto);
    empty: Ray on this machine."""
    max_concurrent: Annotated[int, value(nonnegative_int)] = 0
    """Trials running at once at most; 0: as many as the CPUs allow (with --resume: what the
    sweep was started with)."""
    cpus_per_trial: Annotated[int, value(nonnegative_int)] = 0
    """CPUs reserved per trial, and its torch threads; 0: 1 (with --resume: what the sweep was
    started with)."""
    resume: bool = False
    """Finish the sweep in --out: finished trials are kept, stopped runs continue from their
    last checkpoint."""


def main(argv: list[str] | None = None) -> int:
    results = []
    status = script_main(Args, lambda args: results.append(run(args)), argv, __doc__, "sweep")
    return status or results[0].exit_code


def run(args: Args):
    from specrl.sweep.spec import load_spec
    from specrl.sweep.tune import run_sweep

    return run_sweep(
        load_spec(args.spec),
        args.out,
        address=args.address or None,
        max_concurrent=args.max_concurrent or None,
        cpus_per_trial=args.cpus_per_trial or None,
        resume=args.resume,
    )


if __name__ == "__main__":
    sys.exit(main())
