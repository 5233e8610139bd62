"""Workload traces: which requests arrive, when, from which prompt domain, and how long they run.

A trace is a fixed, replayable list of requests plus the load pattern that admits them. The
same trace is replayed against every policy, so their results differ only by the policy.

Prompts are references, not text: ``(domain, offset, prompt_len)`` points into the domain's
held-out token stream (all held-out documents of the domain, tokenized and joined in order;
``offset`` is taken modulo the stream length, and a prompt that runs off the end wraps to the
start). :func:`resolve_prompt` turns a reference into token ids deterministically, so the trace
stays small and independent of the tokenizer until it meets a live engine.

Domains are :data:`DOMAINS`, except in a trace built from a prompts file
(:mod:`specrl.workload.user_prompts`): its ``prompts`` record (``file``, ``sha256``, ``count``,
``domains``) names the file and the domains it uses instead, and its offsets point into that
file's prompts (:func:`~specrl.workload.user_prompts.tokenize_prompts`).

Lengths (both drawn per request from the trace's seed):

* ``max_new_tokens``: a clipped lognormal, ``clip(round(median * exp(sigma * z)), min, max)``
  with ``z ~ N(0, 1)``. Generation ignores EOS, so every request commits exactly
  ``max_new_tokens`` tokens whatever the policy: the work in a trace is fixed.
* ``prompt_len``: the same clipped lognormal form with its own parameters.

Sampling (format v2): every request carries ``temperature`` (0 = greedy) and ``top_p``, drawn
from the trace's sampling mix over :data:`SAMPLING_CONFIGS` (see there for where each comes
from). Version 1 files (no sampling fields) are read as all-greedy.

Load patterns (``Trace.load``):

* closed loop: ``schedule = [[completed, concurrency], ...]`` sorted by ``completed``. Once
  ``completed`` requests have finished, the driver keeps ``concurrency`` requests in flight
  (running or queued in the engine). The schedule is indexed by completed requests, not by
  steps or seconds, so the same requests share the batch whatever K a policy picks.
* open loop: every request carries ``arrival_s``, Poisson arrivals at ``rate_per_s``, on the
  serving clock (the sum of step times; idle gaps are skipped).
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from specrl.errors import SpecrlError
from specrl.files import check_header, read_json, write_json

TRACE_FORMAT = "specrl-trace"
TRACE_VERSION = 2
"""2: requests carry ``temperature`` and ``top_p``; the trace records its ``sampling`` mix."""
READABLE_VERSIONS = (1, 2)
DOMAINS = ("code", "prose", "hard")
"""Prompt domains: held-out code, held-out prose, and a hard domain where the draft is poor.
Kept equal to ``specrl.models.corpus.DOMAINS`` (a test checks it)."""

SAMPLING_CONFIGS = {
    "greedy": (0.0, 1.0),
    "chat": (0.7, 0.9),
    "default": (1.0, 1.0),
}
"""Named ``(temperature, top_p)`` settings that workloads draw requests from.

* ``greedy``: temperature 0. Code completion, agents, tool calls and evaluations usually run
  greedy (OpenAI's and Anthropic's guides recommend temperature 0 for deterministic tasks).
* ``chat``: 0.7 / 0.9, between the chat defaults that instruct models ship in their
  ``generation_config.json``: Llama-3.1-Instruct 0.6 / 0.9, Qwen2.5-Instruct 0.7 / 0.8.
* ``default``: 1.0 / 1.0, the default of the OpenAI API and of vLLM's ``SamplingParams``,
  what a client that sets nothing gets.

They are also the profile's temperature bands (``specrl.profile``): acceptance is measured at
exactly these settings.
"""
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


DOMAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A domain named in a prompts file: 1 to 64 letters, digits, ``_``, ``-`` or ``.``, starting
with a letter or digit (it becomes a key of profiles and traces, and part of error messages)."""


def check_domain_name(name, where: str) -> str:
    """``name`` if it is a valid domain name (:data:`DOMAIN_NAME`), else a :class:`SpecrlError`
    starting with ``where``."""
    if not isinstance(name, str) or not DOMAIN_NAME.fullmatch(name):
        raise SpecrlError(
            f"{where}: domain {name!r} is not a valid name; use 1 to 64 letters, digits, '_', "
            "'-' or '.', starting with a letter or digit, like 'customer-support'"
        )
    return name


def known_domains(prompts_record, where: str) -> tuple[str, ...]:
    """The domains a trace or profile may use: :data:`DOMAINS`, or, when it was built from a
    prompts file, the domains its ``prompts_record`` names (``{"file", "sha256", "count",
    "domains"}``, from :meth:`~specrl.workload.user_prompts.PromptFile.record`)."""
    if prompts_record is None:
        return DOMAINS
    if not isinstance(prompts_record, Mapping):
        raise SpecrlError(f"{where}: expected {{'file', 'sha256', 'count', 'domains'}}")
    for key, kind in (("file", str), ("sha256", str), ("count", int), ("domains", list)):
        value = prompts_record.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise SpecrlError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    domains = prompts_record["domains"]
    if not domains or len(set(map(str, domains))) != len(domains):
        raise SpecrlError(f"{where}.domains: expected distinct domain names, got {domains!r}")
    return tuple(check_domain_name(d, f"{where}.domains") for d in domains)


def temperature_band(temperature: float) -> str:
    """The :data:`SAMPLING_CONFIGS` name whose temperature is nearest (0 only for greedy)."""
    if temperature <= 0:
        return "greedy"
    return "chat" if temperature < 0.85 else "default"


@dataclass(frozen=True)
class LengthDist:
    """A clipped lognormal over token counts: ``clip(round(median * exp(sigma * z)), lo, hi)``."""

    median: float
    sigma: float
    lo: int
    hi: int

    def __post_init__(self) -> None:
        finite = math.isfinite(self.median) and math.isfinite(self.sigma)
        if not (finite and self.median > 0 and self.sigma >= 0 and 1 <= self.lo <= self.hi):
            raise SpecrlError(
                f"length distribution {self}: need a finite median > 0, a finite sigma >= 0 "
                "and 1 <= lo <= hi"
            )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.at(rng.standard_normal(n))

    def at(self, z) -> np.ndarray:
        """The token counts at standard-normal values ``z`` (a draw, or quantiles)."""
        raw = np.rint(self.median * np.exp(self.sigma * np.asarray(z, dtype=np.float64)))
        return np.clip(raw, self.lo, self.hi).astype(np.int64)


LENGTH_FIELDS = ("median", "sigma", "lo", "hi")
DEFAULT_PROMPT_LENGTHS = LengthDist(median=48, sigma=0.5, lo=8, hi=160)
DEFAULT_OUTPUT_LENGTHS = LengthDist(median=48, sigma=0.6, lo=8, hi=160)
"""The preset workloads' prompt and output lengths (tokens)."""


@dataclass(frozen=True)
class Request:
    domain: str
    offset: int
    """Start in the domain's held-out token stream (modulo its length)."""
    prompt_len: int
    max_new_tokens: int
    arrival_s: float | None = None
    """Open loop only: arrival on the serving clock, seconds."""
    temperature: float = 0.0
    """0 = greedy decoding."""
    top_p: float = 1.0


@dataclass
class Trace:
    name: str
    seed: int
    domains: dict[str, float]
    """Domain mix the requests were drawn from (weights sum to 1; for a mix that shifts
    through the trace, its average)."""
    load: dict
    """``{"kind": "closed", "schedule": [[completed, concurrency], ...]}`` or
    ``{"kind": "open", "rate_per_s": r}``."""
    prompt_lengths: LengthDist
    output_lengths: LengthDist
    requests: list[Request] = field(default_factory=list)
    sampling: dict[str, float] = field(default_factory=lambda: {"greedy": 1.0})
    """Sampling mix over :data:`SAMPLING_CONFIGS` (its average, for a shifting mix)."""
    prompts: dict | None = None
    """Built from a prompts file: its record (see :func:`known_domains`); None otherwise."""

    @property
    def closed_loop(self) -> bool:
        return self.load["kind"] == "closed"

    @property
    def total_tokens(self) -> int:
        return sum(r.max_new_tokens for r in self.requests)

    @property
    def max_request_len(self) -> int:
        return max(r.prompt_len + r.max_new_tokens for r in self.requests)

    def concurrency(self, completed: int) -> int:
        """Closed loop: requests to keep in flight once ``completed`` have finished."""
        target = 0
        for start, conc in self.load["schedule"]:
            if start > completed:
                break
            target = conc
        return target

    def to_json(self) -> dict:
        prompts = {} if self.prompts is None else {"prompts": self.prompts}
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "name": self.name,
            "seed": self.seed,
            "domains": self.domains,
            "sampling": self.sampling,
            "load": self.load,
            "prompt_lengths": asdict(self.prompt_lengths),
            "output_lengths": asdict(self.output_lengths),
            "requests": [
                {k: v for k, v in asdict(r).items() if v is not None} for r in self.requests
            ],
            **prompts,
        }

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_json())


def resolve_prompt(streams: Mapping[str, Sequence[int]], request: Request) -> list[int]:
    """The prompt token ids of ``request``: ``prompt_len`` tokens of its domain's stream."""
    if request.domain not in streams:
        raise SpecrlError(
            f"domain {request.domain!r} has no held-out token stream; known: {sorted(streams)}"
        )
    stream = streams[request.domain]
    if len(stream) == 0:
        raise SpecrlError(f"the held-out token stream of domain {request.domain!r} is empty")
    return stream_window(stream, request.offset, request.prompt_len)


def stream_window(stream: Sequence[int], start: int, length: int) -> list[int]:
    """``length`` tokens of ``stream`` from ``start`` (modulo its length), wrapping to its
    start as often as needed: a short stream is repeated."""
    start %= len(stream)
    ids = list(stream[start : start + length])
    while len(ids) < length:
        ids.extend(stream[: length - len(ids)])
    return ids


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
            kwargs[arg] = _length_dist(meta[key], where)
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


def is_preset(name: str) -> bool:
    steady_n = name.startswith("steady-") and name[len("steady-") :].isdigit()
    return name in PRESETS or (steady_n and int(name[len("steady-") :]) >= 1)


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
    if preset.startswith("steady-"):
        batch = min(int(preset.split("-", 1)[1]), peak)
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


# ----------------------------------------------------------------------------------------------
# Loading and validation: a trace that fails any check is rejected whole.


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


def _length_dist(obj, where: str) -> LengthDist:
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
    for d, w in domains.items():
        if d not in known:
            raise SpecrlError(f"{source}.domains: unknown domain {d!r}; known: {known}")
        if not _weight(w):
            raise SpecrlError(
                f"{source}.domains.{d}: weight must be a finite number >= 0, got {w!r}"
            )
    if not any(w > 0 for w in domains.values()):
        raise SpecrlError(f"{source}.domains: give at least one domain a weight > 0")
    v1 = obj["version"] == 1
    sampling = {"greedy": 1.0} if v1 else _field(obj, "sampling", dict, source)
    for c, w in sampling.items():
        if c not in SAMPLING_CONFIGS:
            raise SpecrlError(
                f"{source}.sampling: unknown setting {c!r}; known: {list(SAMPLING_CONFIGS)}"
            )
        if not _weight(w):
            raise SpecrlError(
                f"{source}.sampling.{c}: weight must be a finite number >= 0, got {w!r}"
            )
    if not any(w > 0 for w in sampling.values()):
        raise SpecrlError(f"{source}.sampling: give at least one setting a weight > 0")
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
    prompt_lengths = _length_dist(obj.get("prompt_lengths"), f"{source}.prompt_lengths")
    output_lengths = _length_dist(obj.get("output_lengths"), f"{source}.output_lengths")
    raw = _field(obj, "requests", list, source)
    if not raw:
        raise SpecrlError(f"{source}.requests: a trace needs at least one request")
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
        temperature, top_p = 0.0, 1.0
        if not v1:
            temperature = float(_field(r, "temperature", (int, float), where))
            top_p = float(_field(r, "top_p", (int, float), where))
            if not (math.isfinite(temperature) and temperature >= 0):
                raise SpecrlError(
                    f"{where}.temperature: must be a finite number >= 0 (0 = greedy), got "
                    f"{temperature!r}"
                )
            if not 0 < top_p <= 1:
                raise SpecrlError(f"{where}.top_p: must be in (0, 1], got {top_p!r}")
        requests.append(Request(domain, offset, plen, olen, arrival, temperature, top_p))
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


def load_trace(path: str | Path) -> Trace:
    """Read and validate a JSON trace written by :meth:`Trace.save`."""
    obj = read_json(
        path, "trace", "fix it, or write one with `specrl workload --preset ramp --out TRACE.json`"
    )
    return trace_from_json(obj, source=str(path))
