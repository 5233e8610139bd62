"""Workloads: seeded, replayable request traces (prompt domains, lengths, load patterns).

See :mod:`specrl.workload.trace` for the trace format and the length distributions,
:mod:`specrl.workload.presets` for how traces are drawn and the named workloads,
:mod:`specrl.workload.trace_file` for reading one back, and
:class:`~specrl.workload.driver.TraceDriver` for how a trace is replayed.
"""

from specrl.features import temperature_band
from specrl.workload.driver import TraceDriver
from specrl.workload.presets import (
    PRESETS,
    bursts,
    capped_workloads,
    day_cycle,
    is_preset,
    make_trace,
    mixed_day,
    preset_trace,
    profile_workload_kwargs,
    ramp,
    steady,
)
from specrl.workload.trace import (
    DOMAINS,
    SAMPLING_CONFIGS,
    LengthDist,
    Request,
    Trace,
    resolve_prompt,
)
from specrl.workload.trace_file import load_trace, trace_from_json

__all__ = [
    "DOMAINS",
    "PRESETS",
    "SAMPLING_CONFIGS",
    "LengthDist",
    "Request",
    "Trace",
    "TraceDriver",
    "bursts",
    "capped_workloads",
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
