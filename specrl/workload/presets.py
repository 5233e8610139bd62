"""Drawing traces: load patterns, domain and sampling mixes, and the named workloads.

:func:`make_trace` draws a trace's requests from its seed; :func:`preset_trace` names the
workloads the envs, the training and the comparisons run (:data:`PRESETS`). Every drawn trace
is validated as a file would be (:func:`~specrl.workload.trace_file.trace_from_json`).
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from specrl.errors import SpecrlError
from specrl.workload.trace import (
    DEFAULT_OUTPUT_LENGTHS,
    DEFAULT_PROMPT_LENGTHS,
    LENGTH_FIELDS,
    SAMPLING_CONFIGS,
    LengthDist,
    Request,
    Trace,
    known_domains,
)
from specrl.workload.trace_file import length_dist_from_json, trace_from_json

DEFAULT_SAMPLING = {"greedy": 1 / 3, "chat": 1 / 3, "default": 1 / 3}
"""The sampling mix of the presets other than ``mixed``. No public trace records sampling
parameters, so this is an assumption: equal shares, stated and overridable (``sampling=``)."""
WORK_HOURS = (
    {"code": 0.6, "prose": 0.3, "hard": 0.1},
    {"greedy": 0.5, "chat": 0.3, "default": 0.2},
)
OFF_HOURS = (
    {"code": 0.2, "prose": 0.5, "hard": 0.3},
    {"greedy": 0.15, "chat": 0.5, "default": 0.35},
)
"""The ``mixed`` preset's (domain mix, sampling mix) at the busiest and the quietest hour.

Azure's public LLM inference traces (Splitwise, Patel et al., ISCA 2024) come as a coding and
a conversation service: the coding service's load follows the working day, conversation
traffic is spread wider. So the busy hours lean to code and greedy decoding, the quiet hours to
prose and sampled chat. The shares are our assumption, not read from a trace; they were set
once before any controller was run and not tuned afterwards."""


# ----------------------------------------------------------------------------------------------
# Load patterns


def steady(batch: int) -> list[list[int]]:
    """Closed loop at a constant concurrency."""
    return [[0, batch]]


def ramp(n_requests: int, peak: int = 64) -> list[list[int]]:
    """Closed loop 1 -> peak -> 1 in powers of two, each level held for an equal share of the
    completed requests."""
    up = [2**i for i in range(int(math.log2(peak)) + 1)]
    if up[-1] != peak:
        up.append(peak)
    levels = up + up[-2::-1]
    return [[round(i * n_requests / len(levels)), c] for i, c in enumerate(levels)]


def bursts(n_requests: int, low: int = 2, high: int = 48, period: int = 32) -> list[list[int]]:
    """Closed loop alternating ``low`` and ``high`` concurrency every ``period``/2 completions."""
    half = max(1, period // 2)
    return [[s, low if (s // half) % 2 == 0 else high] for s in range(0, n_requests, half)]


def day_cycle(
    n_requests: int, low: int = 1, high: int = 64, cycles: int = 1, points: int = 24
) -> list[list[int]]:
    """Closed loop following one raised-cosine "day" per cycle: night at ``low``, noon at
    ``high``, sampled at ``points`` steps per cycle."""
    total = cycles * points
    sched = []
    for j in range(total):
        phase = 2 * math.pi * (j % points) / points
        conc = round(low + (high - low) * (1 - math.cos(phase)) / 2)
        sched.append([round(j * n_requests / total), max(1, conc)])
    return sched


Mix = Mapping[str, float]


def _draw(rng: np.random.Generator, mix, names: Sequence[str], n: int, what: str) -> np.ndarray:
    """Index into ``names`` per request; ``mix`` is a mapping or ``f(fraction) -> mapping``
    evaluated at each request's place in the trace (``i / n``)."""
    mixes = [mix(i / n) for i in range(n)] if callable(mix) else [mix]
    weights = np.array([[m.get(x, 0.0) for x in names] for m in mixes], dtype=np.float64)
    unknown = {x for m in mixes for x in m} - set(names)
    if unknown or np.any(weights < 0) or np.any(weights.sum(axis=1) <= 0):
        raise SpecrlError(f"{what} mix {mixes[0]!r}: need non-negative weights over {list(names)}")
    weights /= weights.sum(axis=1, keepdims=True)
    cdf = np.cumsum(np.broadcast_to(weights, (n, len(names))), axis=1)
    picks = (rng.random(n)[:, None] >= cdf).sum(axis=1)
    return np.minimum(picks, len(names) - 1)


def make_trace(
    *,
    name: str,
    seed: int,
    n_requests: int,
    load: dict,
    domains: Mix | Callable[[float], Mix] | None = None,
    sampling: Mix | Callable[[float], Mix] | None = None,
    prompt_lengths: LengthDist | None = None,
    output_lengths: LengthDist | None = None,
    stream_len: int = 1 << 20,
    prompts: dict | None = None,
) -> Trace:
    """Draw a trace. ``load`` is ``{"kind": "closed", "schedule": ...}`` or
    ``{"kind": "open", "rate_per_s": r}``; for open loop, arrivals are a Poisson process.
    ``domains`` (over :data:`DOMAINS`, or over the domains of ``prompts``, a prompts file's
    record) and ``sampling`` (over :data:`SAMPLING_CONFIGS`) are mixes, or functions of the
    request's place in the trace (0 to 1) returning one."""
    if n_requests < 1:
        raise SpecrlError(f"trace {name!r}: need n_requests >= 1")
    names = known_domains(prompts, f"trace {name!r}.prompts")
    rng = np.random.default_rng(seed)
    prompt_lengths = prompt_lengths or DEFAULT_PROMPT_LENGTHS
    output_lengths = output_lengths or DEFAULT_OUTPUT_LENGTHS
    dom = _draw(rng, domains or {d: 1 / len(names) for d in names}, names, n_requests, "domain")
    offsets = rng.integers(0, stream_len, size=n_requests)
    plen = prompt_lengths.sample(rng, n_requests)
    olen = output_lengths.sample(rng, n_requests)
    configs = list(SAMPLING_CONFIGS)
    samp = _draw(rng, sampling or DEFAULT_SAMPLING, configs, n_requests, "sampling")
    arrivals: list[float | None] = [None] * n_requests
    if load.get("kind") == "open":
        rate = load.get("rate_per_s")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise SpecrlError(
                f"trace {name!r}: an open-loop load needs 'rate_per_s', a number > 0 (requests "
                f"per second), got {rate!r}"
            )
        gaps = rng.exponential(1.0 / float(rate), size=n_requests)
        arrivals = [round(float(t), 6) for t in np.cumsum(gaps)]
    requests = [
        Request(
            names[dom[i]],
            int(offsets[i]),
            int(plen[i]),
            int(olen[i]),
            arrivals[i],
            *SAMPLING_CONFIGS[configs[samp[i]]],
        )
        for i in range(n_requests)
    ]
    trace = Trace(
        name=name,
        seed=seed,
        domains={d: float(np.mean(dom == i)) for i, d in enumerate(names)},
        load=load,
        prompt_lengths=prompt_lengths,
        output_lengths=output_lengths,
        requests=requests[:1],
        sampling={c: float(np.mean(samp == i)) for i, c in enumerate(configs)},
        prompts=None if prompts is None else copy.deepcopy(dict(prompts)),
    )
    # Validated as a file would be, with one request: the others are drawn as it was (known
    # domains and settings, lengths clipped to validated bounds, arrivals a cumulative sum),
    # and checking each one took a third of the training env's reset.
    trace = trace_from_json(trace.to_json(), source=f"trace {name!r}")
    trace.requests = requests
    return trace


def profile_workload_kwargs(meta: Mapping) -> dict:
    """Preset-workload arguments that fit a profile measured on a prompts file (its ``meta``
    has ``prompts`` and ``prompt_counts[domain][band]``): the file's domains and temperature
    bands, each in the share of the file's prompts that fell in it, drawn independently, the
    file's record (so the trace may name its domains), and its prompt and output lengths
    where the profile recorded them (``meta.prompt_lengths_dist``, ``meta.output_lengths_dist``;
    outputs stay the preset's when no line gave ``max_new_tokens``). The load pattern stays
    the preset's. ``{}`` for a profile of the held-out corpus: presets draw its domains as
    they are."""
    record = meta.get("prompts") if isinstance(meta, Mapping) else None
    if record is None:
        return {}
    counts = meta.get("prompt_counts") or {}
    ok = isinstance(counts, Mapping) and all(
        isinstance(c, Mapping)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in c.values())
        for c in counts.values()
    )
    if not ok:
        raise SpecrlError(
            "profile field 'meta.prompt_counts': expected {domain: {band: count}} with "
            f"counts >= 0, got {counts!r}; re-measure with `specrl profile --prompts`"
        )
    domains = {d: float(sum(counts.get(d, {}).values())) for d in record["domains"]}
    bands = {b: float(sum(c.get(b, 0) for c in counts.values())) for b in SAMPLING_CONFIGS}
    kwargs = {
        "prompts": copy.deepcopy(dict(record)),
        "domains": domains if sum(domains.values()) > 0 else None,
        "sampling": {b: w for b, w in bands.items() if w > 0} or None,
    }
    for key, arg in (
        ("prompt_lengths_dist", "prompt_lengths"),
        ("output_lengths_dist", "output_lengths"),
    ):
        if meta.get(key) is None:
            continue
        where, remake = f"profile field 'meta.{key}'", "re-measure with `specrl profile --prompts`"
        if not isinstance(meta[key], Mapping) or set(meta[key]) != set(LENGTH_FIELDS):
            raise SpecrlError(f"{where}: expected the fields {list(LENGTH_FIELDS)}; {remake}")
        try:
            kwargs[arg] = length_dist_from_json(meta[key], where)
        except SpecrlError as err:
            raise SpecrlError(f"{err}; {remake}") from None
    return kwargs


def _blend(a: Mix, b: Mix, w: float) -> dict[str, float]:
    return {x: (1 - w) * a.get(x, 0.0) + w * b.get(x, 0.0) for x in {*a, *b}}


def mixed_day(fraction: float, cycles: int = 1) -> tuple[dict, dict]:
    """The ``mixed`` preset's (domain mix, sampling mix) at ``fraction`` of the trace: from
    :data:`OFF_HOURS` at night to :data:`WORK_HOURS` at noon, on the same raised cosine as
    :func:`day_cycle`'s load."""
    w = (1 - math.cos(2 * math.pi * fraction * cycles)) / 2
    return _blend(OFF_HOURS[0], WORK_HOURS[0], w), _blend(OFF_HOURS[1], WORK_HOURS[1], w)


PRESETS = ("mixed", "steady-1", "steady-8", "steady-64", "ramp", "bursts", "day", "poisson")
"""Named workloads; ``steady-N`` works for any N. ``mixed`` (the default) is a day of traffic:
the day cycle's load, with the domain and sampling mix shifting with the hour
(:func:`mixed_day`); the others draw from fixed mixes."""


def _steady_rows(name, peak: int | None = None) -> int | None:
    """The rows a ``steady-N`` workload holds (N >= 1), capped at ``peak`` as every
    closed-loop pattern is; None for any other name."""
    digits = name[len("steady-") :] if isinstance(name, str) else ""
    if not (digits.isdigit() and name.startswith("steady-") and int(digits) >= 1):
        return None
    return int(digits) if peak is None else min(int(digits), peak)


def is_preset(name: str) -> bool:
    return name in PRESETS or _steady_rows(name) is not None


def capped_workloads(names, peak: int) -> tuple[str, ...]:
    """``names`` as they serve at ``peak`` rows: a ``steady-N`` above ``peak`` runs at
    ``peak`` (as :func:`preset_trace` caps it), so it is named ``steady-<peak>``, and a name
    that repeats an earlier one is dropped. A mix drawn uniformly over the result weighs each
    distinct workload once: at 32 rows, ``steady-64`` and ``steady-128`` are one workload."""
    out: list[str] = []
    for name in names:
        if (rows := _steady_rows(name, peak)) is not None:
            name = f"steady-{rows}"
        if name not in out:
            out.append(name)
    return tuple(out)


def _count(value) -> bool:
    """An integer >= 1 (numpy's included, bool not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


TRACE_KWARGS = ("domains", "sampling", "prompt_lengths", "output_lengths", "stream_len", "prompts")
"""The keyword arguments :func:`preset_trace` passes on to :func:`make_trace`."""


def preset_trace(
    preset: str, seed: int = 0, n_requests: int | None = None, peak: int = 64, **kwargs
) -> Trace:
    """A named workload. ``peak`` caps the concurrency of every closed-loop pattern;
    ``kwargs`` go to :func:`make_trace` (domains, sampling, prompt_lengths, output_lengths,
    prompts). With ``prompts`` (a prompts file's record) and no mix given, domains are drawn
    uniformly from the file's and sampling from the default mix; ``mixed`` then keeps its
    load but not its shift of domains and sampling over the day."""
    if not is_preset(preset):
        raise SpecrlError(
            f"unknown workload preset {preset!r}; choose one of {', '.join(PRESETS)}, or "
            "steady-N for any N"
        )
    if n_requests is not None and not _count(n_requests):
        raise SpecrlError(
            f"workload {preset!r}: n_requests must be an integer >= 1 (leave it out for the "
            f"preset's default), got {n_requests!r}"
        )
    if not _count(peak):
        raise SpecrlError(f"workload {preset!r}: peak must be an integer >= 1, got {peak!r}")
    unknown = sorted(
        set(kwargs) - set(TRACE_KWARGS) - ({"rate_per_s"} if preset == "poisson" else set())
    )
    if unknown:
        raise SpecrlError(
            f"workload {preset!r}: unknown argument(s) {', '.join(map(repr, unknown))}; "
            f"valid: n_requests, peak, {', '.join(TRACE_KWARGS)} and, for poisson, rate_per_s"
        )
    if (batch := _steady_rows(preset, peak)) is not None:
        n = n_requests or 4 * batch
        load = {"kind": "closed", "schedule": steady(batch)}
    elif preset == "ramp":
        n = n_requests or 4 * peak
        load = {"kind": "closed", "schedule": ramp(n, peak)}
    elif preset == "bursts":
        n = n_requests or 4 * peak
        low = min(2, peak)  # peak caps every closed-loop pattern; at peak 1 there is no burst
        load = {"kind": "closed", "schedule": bursts(n, low, max(low, 3 * peak // 4), peak // 2)}
    elif preset == "day":
        n = n_requests or 4 * peak
        load = {"kind": "closed", "schedule": day_cycle(n, 1, peak)}
    elif preset == "mixed":
        n = n_requests or 4 * peak
        load = {"kind": "closed", "schedule": day_cycle(n, 1, peak)}
        if kwargs.get("prompts") is None:  # a prompts file's domains have no day shift
            kwargs.setdefault("domains", lambda f: mixed_day(f)[0])
            kwargs.setdefault("sampling", lambda f: mixed_day(f)[1])
    else:
        n = n_requests or 64
        load = {"kind": "open", "rate_per_s": kwargs.pop("rate_per_s", 8.0)}
    if load["kind"] == "closed":
        # Fewer requests than the pattern has levels put several levels at one completion
        # count; the last of them is the one the driver would keep, so keep only it.
        load["schedule"] = list({start: [start, c] for start, c in load["schedule"]}.values())
    return make_trace(name=preset, seed=seed, n_requests=n, load=load, **kwargs)
