"""Workloads: seeded, replayable request traces (prompt domains, lengths, load patterns).

See :mod:`specrl.workload.trace` for the trace format and the length distributions, and
:class:`~specrl.workload.driver.TraceDriver` for how a trace is replayed.
"""

from specrl.workload.driver import TraceDriver
from specrl.workload.trace import (
    DOMAINS,
    PRESETS,
    SAMPLING_CONFIGS,
    LengthDist,
    Request,
    Trace,
    bursts,
    day_cycle,
    is_preset,
    load_trace,
    make_trace,
    mixed_day,
    preset_trace,
    profile_workload_kwargs,
    ramp,
    resolve_prompt,
    steady,
    temperature_band,
    trace_from_json,
)

__all__ = [
    "DOMAINS",
    "PRESETS",
    "SAMPLING_CONFIGS",
    "LengthDist",
    "Request",
    "Trace",
    "TraceDriver",
    "bursts",
    "day_cycle",
    "is_preset",
    "load_trace",
    "make_trace",
    "mixed_day",
    "preset_trace",
    "profile_workload_kwargs",
    "ramp",
    "resolve_prompt",
    "steady",
    "temperature_band",
    "trace_from_json",
]
