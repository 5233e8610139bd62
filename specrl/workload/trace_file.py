"""Reading a trace file: every field checked, and a trace that fails any check rejected whole.

:func:`load_trace` reads a file written by :meth:`~specrl.workload.trace.Trace.save`;
:func:`trace_from_json` validates a decoded one (and every drawn trace, as a file would be).
An error names the file and the field, and says what was expected.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path

from specrl.errors import SpecrlError
from specrl.files import check_header, read_json
from specrl.workload.trace import (
    READABLE_VERSIONS,
    SAMPLING_CONFIGS,
    TRACE_FORMAT,
    LengthDist,
    Request,
    Trace,
    known_domains,
)

_KIND_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    dict: "an object",
    list: "a list",
}


def _kind_name(kind: type | tuple) -> str:
    kinds = set(kind) if isinstance(kind, tuple) else {kind}
    if kinds == {int, float}:
        return "a number"
    return " or ".join(sorted(_KIND_NAMES.get(k, k.__name__) for k in kinds))


def _field(obj: Mapping, key: str, kind: type | tuple, where: str):
    if not isinstance(obj, Mapping):
        raise SpecrlError(
            f"{where}: expected an object with field {key!r}, got {type(obj).__name__}"
        )
    if key not in obj:
        raise SpecrlError(f"{where}: missing field {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise SpecrlError(
            f"{where}.{key}: expected {_kind_name(kind)}, got {type(value).__name__} {value!r}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecrlError(f"{where}.{key}: expected a finite number, got {value!r}")
    return value


def length_dist_from_json(obj, where: str) -> LengthDist:
    """A length distribution recorded as ``{"median", "sigma", "lo", "hi"}`` at ``where``."""
    if obj is None:
        raise SpecrlError(
            f"{where}: missing; a trace records the length distribution its requests were "
            'drawn from, {"median": M, "sigma": S, "lo": LO, "hi": HI} (a hand-written '
            "trace can give its requests' median, 0, min and max)"
        )
    check_known_keys(obj, ("median", "sigma", "lo", "hi"), where)
    median = float(_field(obj, "median", (int, float), where))
    sigma = float(_field(obj, "sigma", (int, float), where))
    lo, hi = _field(obj, "lo", int, where), _field(obj, "hi", int, where)
    try:
        return LengthDist(median=median, sigma=sigma, lo=lo, hi=hi)
    except SpecrlError as err:
        raise SpecrlError(f"{where}: {err}") from None


TRACE_KEYS = (
    "format",
    "version",
    "name",
    "seed",
    "domains",
    "sampling",
    "load",
    "prompt_lengths",
    "output_lengths",
    "requests",
    "prompts",
)
REQUEST_KEYS = tuple(f.name for f in fields(Request))


def check_known_keys(obj: Mapping, keys: Sequence[str], where: str, what: str = "key") -> None:
    """Refuse a key outside ``keys`` (of a trace, a request, a prompts file's line or a
    profile, whose keys are called ``what``): a misspelt ``temprature`` would otherwise be
    ignored and the request run greedy."""
    unknown = [k for k in obj if k not in keys]
    if unknown:
        raise SpecrlError(
            f"{where}: unknown {what} {unknown[0]!r}; the {what}s are {', '.join(keys)} (fix "
            "its spelling or remove it)"
        )


def _weight(w) -> bool:
    """A mix weight: a finite number >= 0."""
    return not isinstance(w, bool) and isinstance(w, (int, float)) and math.isfinite(w) and w >= 0


def trace_from_json(obj: Mapping, source: str = "trace") -> Trace:
    """Validate a decoded trace; ``source`` (usually the file) prefixes every error."""
    check_header(
        obj,
        source,
        fmt=TRACE_FORMAT,
        version=READABLE_VERSIONS,
        what="specrl trace",
        remake="regenerate it with `specrl workload --preset NAME --out TRACE.json`",
    )
    check_known_keys(obj, TRACE_KEYS, source)
    name = _field(obj, "name", str, source)
    seed = _field(obj, "seed", int, source)
    prompts = obj.get("prompts")
    known = known_domains(prompts, f"{source}.prompts")
    domains = _field(obj, "domains", dict, source)
    _check_mix(domains, known, f"{source}.domains", "domain")
    v1 = obj["version"] == 1
    sampling = {"greedy": 1.0} if v1 else _field(obj, "sampling", dict, source)
    _check_mix(sampling, list(SAMPLING_CONFIGS), f"{source}.sampling", "setting")
    load = _load(obj, source)
    prompt_lengths = length_dist_from_json(obj.get("prompt_lengths"), f"{source}.prompt_lengths")
    output_lengths = length_dist_from_json(obj.get("output_lengths"), f"{source}.output_lengths")
    raw = _field(obj, "requests", list, source)
    if not raw:
        raise SpecrlError(f"{source}.requests: a trace needs at least one request")
    requests = _requests(raw, source, known, domains, load["kind"], v1)
    return Trace(
        name,
        seed,
        dict(domains),
        dict(load),
        prompt_lengths,
        output_lengths,
        requests,
        dict(sampling),
        None if prompts is None else dict(prompts),
    )


def _check_mix(mix: Mapping, known: Sequence[str], where: str, noun: str) -> None:
    """Refuse a mix (of domains or sampling settings, each a ``noun``) over names outside
    ``known``, with a weight that is not a finite number >= 0, or with no weight > 0."""
    for key, w in mix.items():
        if key not in known:
            raise SpecrlError(f"{where}: unknown {noun} {key!r}; known: {known}")
        if not _weight(w):
            raise SpecrlError(f"{where}.{key}: weight must be a finite number >= 0, got {w!r}")
    if not any(w > 0 for w in mix.values()):
        raise SpecrlError(f"{where}: give at least one {noun} a weight > 0")


def _load(obj: Mapping, source: str) -> Mapping:
    """The trace's load pattern: a closed loop's schedule, or an open loop's rate."""
    load = _field(obj, "load", dict, source)
    kind = _field(load, "kind", str, f"{source}.load")
    load_keys = {"closed": ("kind", "schedule"), "open": ("kind", "rate_per_s")}
    if kind in load_keys:
        check_known_keys(load, load_keys[kind], f"{source}.load")
    if kind == "closed":
        sched = _field(load, "schedule", list, f"{source}.load")
        prev = -1
        for i, item in enumerate(sched):
            ok = (
                isinstance(item, list)
                and len(item) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            )
            if not ok or item[0] <= prev or item[1] < 1:
                raise SpecrlError(
                    f"{source}.load.schedule[{i}]: expected [completed, concurrency] with "
                    "completed increasing from 0 and concurrency >= 1"
                )
            prev = item[0]
        if not sched or sched[0][0] != 0:
            raise SpecrlError(f"{source}.load.schedule: must start with [0, concurrency]")
    elif kind == "open":
        rate = _field(load, "rate_per_s", (int, float), f"{source}.load")
        if not rate > 0:
            raise SpecrlError(f"{source}.load.rate_per_s: must be > 0")
    else:
        raise SpecrlError(f"{source}.load.kind: {kind!r} is neither 'closed' nor 'open'")
    return load


def _requests(raw: list, source: str, known, domains: Mapping, kind: str, v1: bool) -> list:
    """The trace's requests: each one's domain one of ``known`` with a weight in ``domains``,
    its arrivals (``kind`` "open") not decreasing; a version 1 trace's requests run greedy."""
    requests = []
    last_arrival = 0.0
    for i, r in enumerate(raw):
        where = f"{source}.requests[{i}]"
        domain = _field(r, "domain", str, where)
        check_known_keys(r, REQUEST_KEYS, where)
        if domain not in known:
            raise SpecrlError(f"{where}.domain: unknown domain {domain!r}; known: {known}")
        if not domains.get(domain, 0) > 0:
            raise SpecrlError(
                f"{where}.domain: {domain!r} has no weight in {source}.domains "
                f"({json.dumps(domains)}), which says what the requests are drawn from; give "
                "it one"
            )
        offset = _field(r, "offset", int, where)
        plen = _field(r, "prompt_len", int, where)
        olen = _field(r, "max_new_tokens", int, where)
        if offset < 0 or plen < 1 or olen < 1:
            raise SpecrlError(f"{where}: need offset >= 0, prompt_len >= 1, max_new_tokens >= 1")
        arrival = None
        if kind == "open":
            arrival = float(_field(r, "arrival_s", (int, float), where))
            if arrival < last_arrival:
                raise SpecrlError(f"{where}.arrival_s: arrivals must not decrease")
            last_arrival = arrival
        elif "arrival_s" in r:
            raise SpecrlError(f"{where}.arrival_s: closed-loop traces take no arrival times")
        temperature, top_p = (0.0, 1.0) if v1 else _sampling(r, where)
        requests.append(Request(domain, offset, plen, olen, arrival, temperature, top_p))
    return requests


def _sampling(r: Mapping, where: str) -> tuple[float, float]:
    """A version 2 request's ``temperature`` and ``top_p``."""
    temperature = float(_field(r, "temperature", (int, float), where))
    top_p = float(_field(r, "top_p", (int, float), where))
    if not (math.isfinite(temperature) and temperature >= 0):
        raise SpecrlError(
            f"{where}.temperature: must be a finite number >= 0 (0 = greedy), got {temperature!r}"
        )
    if not 0 < top_p <= 1:
        raise SpecrlError(f"{where}.top_p: must be in (0, 1], got {top_p!r}")
    return temperature, top_p


def load_trace(path: str | Path) -> Trace:
    """Read and validate a JSON trace written by :meth:`Trace.save`."""
    obj = read_json(
        path, "trace", "fix it, or write one with `specrl workload --preset ramp --out TRACE.json`"
    )
    return trace_from_json(obj, source=str(path))
