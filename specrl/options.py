"""argparse types for specrl's numeric (and a few other) command-line options.

Each type refuses a bad value while the command line is parsed, so argparse prints one
line naming the option and the range (``specrl compare: error: argument --seed: expected an
integer in 0..4294967295, got '-1'``) and exits with status 2, before anything loads or runs.
The library checks its own arguments too; these types only make the command line say so
first, in the option's name.

The ranges:

* seeds: :data:`SEED`, 0..2**32 - 1 (NumPy's legacy and SB3's seeding take no more);
* counts (episodes, repeats, steps, requests, rows, timesteps, ...): :data:`positive_int`;
* torch threads: :data:`THREADS`, 1..:data:`THREADS_MAX` (0 and -1 are refused: none of the
  commands gives them a meaning);
* the largest K: :data:`K_MAX`, 1..:data:`K_MAX_RUN`;
* batch sizes and peaks: :data:`BATCH`, 1..:data:`specrl.table.MAX_BATCH_LIMIT` (a K
  table's own limit);
* requests per trace: :data:`N_REQUESTS`, 1..:data:`N_REQUESTS_MAX`;
* devices: :func:`device`, ``cpu``, ``cuda`` or ``cuda:N`` (whether the GPU is there is
  checked later, by :func:`specrl.device.require_device`, which needs torch).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from specrl.table import MAX_BATCH_LIMIT
from specrl.workload.presets import PRESETS, is_preset

SEED_MAX = 2**32 - 1
"""The largest seed: ``numpy.random.seed`` (called by stable-baselines3) takes no more."""
K_MAX_RUN = 16
"""The largest ``--k-max`` any command runs (a table file may hold up to
:data:`specrl.table.K_MAX_LIMIT`). Every profiling round and engine benchmark
steps each K in 1..k_max, and no draft's acceptance pays for more than a handful of tokens;
a larger K mostly fails later for want of positions (``max_position_embeddings``)."""
THREADS_MAX = 1024
"""The most torch threads a command takes (torch accepts more and then crashes at exit)."""
N_REQUESTS_MAX = 100_000
"""The most requests a drawn trace may have (a million take half a minute and 2 GB to
draw; the shipped commands use at most a few hundred)."""

WANDB_MODES = ("offline", "online", "disabled")
"""``--wandb``: offline (the default, no account needed), online, disabled."""


def int_in(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in ``low..high`` (either end open when None)."""
    if low is not None and high is not None:
        wanted = f"an integer in {low}..{high}"
    elif low is not None:
        wanted = f"an integer >= {low}"
    elif high is not None:
        wanted = f"an integer <= {high}"
    else:
        wanted = "an integer"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    convert.__name__ = "int"  # argparse names the type in a few messages of its own
    convert.wanted = wanted  # for a comma list of them (specrl.dataclass_cli)
    return convert


def float_in(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Callable[[str], float]:
    """argparse type: a finite number between ``low`` and ``high`` (inclusive unless
    ``low_open``/``high_open``; either end unbounded when None). ``nan`` and ``inf`` are
    refused."""
    if low is not None and high is not None:
        wanted = (
            f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        )
    elif low is not None:
        wanted = f"a finite number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        wanted = f"a finite number {'<' if high_open else '<='} {high:g}"
    else:
        wanted = "a finite number"

    def convert(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        bad = not math.isfinite(value)
        if low is not None:
            bad = bad or value < low or (low_open and value == low)
        if high is not None:
            bad = bad or value > high or (high_open and value == high)
        if bad:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    convert.__name__ = "float"
    convert.wanted = wanted
    return convert


nonnegative_int = int_in(0)
positive_int = int_in(1)
nonnegative_float = float_in(0.0)
positive_float = float_in(0.0, low_open=True)
probability = float_in(0.0, 1.0)
"""A rate in [0, 1], like an acceptance."""

SEED = int_in(0, SEED_MAX)
THREADS = int_in(1, THREADS_MAX)
K_MAX = int_in(1, K_MAX_RUN)
BATCH = int_in(1, MAX_BATCH_LIMIT)
N_REQUESTS = int_in(1, N_REQUESTS_MAX)


def positive_ints(text: str) -> list[int]:
    """argparse type for lists like ``--batch-sizes 1,4,16,64``: integers in 1..MAX_BATCH_LIMIT."""
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,4,16, got {text!r}") from None
    if not values or min(values) < 1 or max(values) > MAX_BATCH_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected integers from 1 to {MAX_BATCH_LIMIT} like 1,4,16, got {text!r}"
        )
    return values


_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")


def device(text: str) -> str:
    """argparse type for ``--device``: ``cpu``, ``cuda`` or ``cuda:N``, the devices the
    engine runs on. Whether torch sees that GPU is checked when the command runs."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected cpu, cuda or cuda:N (the devices specrl runs on), got {text!r}"
        )
    return text


def workload_preset(text: str) -> str:
    """argparse type: a workload preset name (``steady-N`` for any N >= 1)."""

    if not is_preset(text):
        raise argparse.ArgumentTypeError(
            f"expected a workload preset ({', '.join(PRESETS)}, or steady-N for any N), "
            f"got {text!r}"
        )
    return text


def model_preset(text: str) -> str:
    """argparse type: the name of a default model pair (``specrl models build --preset``)."""
    from specrl.models.build import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(
            f"expected a model preset ({', '.join(PRESETS)}), got {text!r}"
        )
    return text
