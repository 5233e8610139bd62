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

Traces are drawn by :mod:`specrl.workload.presets` (named workloads, :func:`make_trace`) and
read back, validated whole, by :mod:`specrl.workload.trace_file`.

Load patterns (``Trace.load``):

* closed loop: ``schedule = [[completed, concurrency], ...]`` sorted by ``completed``. Once
  ``completed`` requests have finished, the driver keeps ``concurrency`` requests in flight
  (running or queued in the engine). The schedule is indexed by completed requests, not by
  steps or seconds, so the same requests share the batch whatever K a policy picks.
* open loop: every request carries ``arrival_s``, Poisson arrivals at ``rate_per_s``, on the
  serving clock (the sum of step times; idle gaps are skipped).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specrl.errors import SpecrlError
from specrl.files import write_json

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
