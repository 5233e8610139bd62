"""Prompts files: your own prompts, to profile a pair on and to build a workload from.

A prompts file is JSON Lines, one object per line (blank lines are skipped)::

    {"prompt": "def parse_header(line):", "domain": "code", "max_new_tokens": 64}
    {"prompt": "Summarise the ticket below.\\n...", "domain": "support", "temperature": 0.7}

* ``prompt`` (required): the prompt text, non-empty. It is tokenized as it is, with the
  target's tokenizer and its special tokens (a BOS where the tokenizer adds one), but no chat
  template: if your traffic uses one, put its text in the prompt.
* ``domain`` (default ``"user"``): groups the prompts; acceptance is measured and kept per
  domain. 1 to 64 letters, digits, ``_``, ``-`` or ``.``.
* ``temperature`` (default 0, greedy): a number >= 0. Its band (``greedy``, ``chat`` or
  ``default``, :func:`~specrl.features.temperature_band`) is the profile's group.
* ``top_p`` (default 1): a number in (0, 1].
* ``max_new_tokens`` (default: drawn like the preset workloads' output lengths): an integer
  >= 1.

Any other key is refused (a misspelt ``temprature`` would otherwise go greedy unnoticed). A
file that breaks a rule is rejected whole, with a :class:`~specrl.errors.SpecrlError` naming
the line and the fix.

:func:`prompts_trace` builds a workload trace from the file. The trace references the
prompts (domain, offset into the domain's prompts, prompt length, temperature, top_p,
max_new_tokens); it is a trace of lengths, domains and sampling settings, which is what the
surrogate reads. The live env serves a trace's prompts from the token streams it is given,
by default the held-out corpus, which has no user domains: to serve your own prompt text,
pass ``streams=tokenize_prompts(prompts, tokenizer).streams`` to ``LiveSpecEnv``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from specrl.errors import SpecrlError
from specrl.features import temperature_band
from specrl.files import DuplicateKeyError, unique_keys
from specrl.workload.presets import preset_trace
from specrl.workload.trace import (
    DEFAULT_OUTPUT_LENGTHS,
    SAMPLING_CONFIGS,
    LengthDist,
    Request,
    Trace,
    check_domain_name,
)
from specrl.workload.trace_file import check_known_keys, trace_from_json

DEFAULT_DOMAIN = "user"
"""The domain of a prompt that names none."""
KEYS = ("prompt", "domain", "temperature", "top_p", "max_new_tokens")
EXAMPLE = '{"prompt": "def parse_header(line):", "domain": "code", "temperature": 0}'


@dataclass(frozen=True)
class UserPrompt:
    prompt: str
    domain: str = DEFAULT_DOMAIN
    temperature: float = 0.0
    """0 = greedy decoding."""
    top_p: float = 1.0
    max_new_tokens: int | None = None
    """None: drawn by whoever decodes it (the profile, the trace builder)."""
    line: int = 0
    """1-based line of the file it came from."""

    @property
    def band(self) -> str:
        """Its temperature band, a name of :data:`~specrl.workload.trace.SAMPLING_CONFIGS`."""
        return temperature_band(self.temperature)


@dataclass(frozen=True)
class PromptFile:
    path: str
    sha256: str
    """Of the file's bytes: a profile or trace names exactly which prompts it came from."""
    prompts: tuple[UserPrompt, ...]

    @property
    def domains(self) -> tuple[str, ...]:
        """The domains, in order of first appearance."""
        return tuple(dict.fromkeys(p.domain for p in self.prompts))

    @property
    def bands(self) -> tuple[str, ...]:
        """The temperature bands any prompt falls in, in :data:`SAMPLING_CONFIGS` order."""
        present = {p.band for p in self.prompts}
        return tuple(b for b in SAMPLING_CONFIGS if b in present)

    def record(self) -> dict:
        """What a trace (field ``prompts``) or a profile (``meta.prompts``) keeps of the file;
        its ``domains`` are the ones that trace or profile may use."""
        return {
            "file": self.path,
            "sha256": self.sha256,
            "count": len(self.prompts),
            "domains": list(self.domains),
        }


def load_prompts(path: str | Path) -> PromptFile:
    """Read and validate a prompts file (the module docstring has the format)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise SpecrlError(
            f"prompts file {path} not found; write one JSON object per line, like {EXAMPLE}"
        ) from None
    except OSError as err:
        raise SpecrlError(f"prompts file {path} could not be read ({err})") from None
    prompts = []
    # bytes.splitlines splits at \n, \r\n and \r only, so numbers match an editor's lines.
    for number, data in enumerate(raw.splitlines(), start=1):
        try:
            text = data.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise SpecrlError(
                f"{path}, line {number}: not UTF-8 text ({err.reason}); save the file as UTF-8"
            ) from None
        if text.strip():
            prompts.append(parse_prompt_line(text, f"{path}, line {number}", number))
    if not prompts:
        raise SpecrlError(
            f"prompts file {path} has no prompts (it is empty or holds only blank lines); "
            f"write one JSON object per line, like {EXAMPLE}"
        )
    return PromptFile(str(path), hashlib.sha256(raw).hexdigest(), tuple(prompts))


def parse_prompt_line(text: str, where: str, line: int = 0) -> UserPrompt:
    """One line of a prompts file; errors start with ``where`` (the file and line)."""
    jsonl = f"a prompts file is JSON Lines: one object per line, like {EXAMPLE}"
    try:
        obj = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKeyError as err:
        raise SpecrlError(f"{where}: {err}; keep one of them") from None
    except json.JSONDecodeError as err:
        spread = " (one JSON value spread over several lines?)" if text.strip() in "{[" else ""
        raise SpecrlError(
            f"{where}: not a JSON object ({err.msg} at column {err.colno}){spread}; {jsonl}"
        ) from None
    except (RecursionError, ValueError) as err:  # nesting too deep, integers too long
        raise SpecrlError(f"{where}: not a JSON object ({err}); {jsonl}") from None
    if not isinstance(obj, dict):
        raise SpecrlError(f"{where}: a JSON {type(obj).__name__}, not an object; {jsonl}")
    check_known_keys(obj, KEYS, where)
    if "prompt" not in obj:
        raise SpecrlError(f'{where}: missing "prompt"; every line needs one, like {EXAMPLE}')
    prompt = obj["prompt"]
    if not isinstance(prompt, str):
        raise SpecrlError(f'{where}: "prompt" must be a string, got {_kind(prompt)}')
    if not prompt.strip():
        empty = "empty" if not prompt else "only whitespace"
        raise SpecrlError(f'{where}: "prompt" is {empty}; give the prompt text or drop the line')
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # JSON's "\ud800" escape: a lone surrogate
        raise SpecrlError(
            f'{where}: "prompt" is not valid Unicode ({err.reason} at character {err.start}); '
            "fix the escape sequence"
        ) from None
    domain = check_domain_name(obj.get("domain", DEFAULT_DOMAIN), f'{where}: "domain"')
    temperature = _number(obj, "temperature", 0.0, where)
    if temperature < 0:
        raise SpecrlError(
            f'{where}: "temperature" must be >= 0 (0 = greedy), got {_json(temperature)}'
        )
    top_p = _number(obj, "top_p", 1.0, where)
    if not 0 < top_p <= 1:
        raise SpecrlError(f'{where}: "top_p" must be in (0, 1], got {_json(top_p)}')
    max_new_tokens = obj.get("max_new_tokens")
    if max_new_tokens is not None and (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise SpecrlError(
            f'{where}: "max_new_tokens" must be an integer >= 1, got {_json(max_new_tokens)}'
        )
    return UserPrompt(prompt, domain, temperature, top_p, max_new_tokens, line)


def _number(obj: dict, key: str, default: float, where: str) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecrlError(f'{where}: "{key}" must be a finite number, got {_json(value)}')
    return float(value)


def _json(value) -> str:
    """``value`` as the file spells it (``true``, ``null``, ``"hot"``, ``NaN``)."""
    return json.dumps(value)


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


@dataclass(frozen=True)
class PromptTokens:
    """A prompts file tokenized with one tokenizer."""

    ids: list[list[int]]
    """Each prompt's token ids, in file order."""
    streams: dict[str, list[int]]
    """Per domain, its prompts' ids joined in file order (each followed by EOS when the
    tokenizer has one): the token streams a trace's references point into."""
    offsets: list[int]
    """Where each prompt starts in its domain's stream."""


def tokenize_prompts(prompts: PromptFile, tokenizer) -> PromptTokens:
    """Tokenize every prompt (special tokens included, as a server does) and join them into
    per-domain streams."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids, offsets = [], []
    streams: dict[str, list[int]] = {d: [] for d in prompts.domains}
    for p in prompts.prompts:
        tokens = list(tokenizer.encode(p.prompt, add_special_tokens=True))
        if not tokens:
            raise SpecrlError(
                f"{prompts.path}, line {p.line}: the prompt tokenizes to no tokens; give text"
            )
        stream = streams[p.domain]
        offsets.append(len(stream))
        stream.extend(tokens)
        if eos is not None:
            stream.append(eos)
        ids.append(tokens)
    return PromptTokens(ids, streams, offsets)


def fitted_lengths(lengths) -> LengthDist:
    """A :class:`LengthDist` summarising observed token counts: their median, the standard
    deviation of their logs, their minimum and maximum."""
    x = np.asarray(lengths, dtype=np.float64)
    return LengthDist(
        median=round(float(np.median(x)), 4),
        sigma=round(float(np.std(np.log(x))), 4),
        lo=int(x.min()),
        hi=int(x.max()),
    )


def file_output_lengths(prompts: PromptFile) -> LengthDist | None:
    """The output lengths of the file's requests, as :func:`prompts_trace` gives them: each
    line's ``max_new_tokens``, and for a line without one the preset workloads' output
    lengths (:data:`~specrl.workload.trace.DEFAULT_OUTPUT_LENGTHS`, at evenly spaced
    quantiles, so the fit is deterministic), fitted together (:func:`fitted_lengths`), its
    bounds widened to the presets' where a line gives none. None when no line gives one: the
    presets' lengths then stand as they are."""
    given = [p.max_new_tokens for p in prompts.prompts if p.max_new_tokens]
    if not given:
        return None
    missing = len(prompts.prompts) - len(given)
    d = DEFAULT_OUTPUT_LENGTHS
    z = [NormalDist().inv_cdf((i + 0.5) / missing) for i in range(missing)]
    fit = fitted_lengths(given + d.at(z).tolist())
    if not missing:
        return fit
    # A line without max_new_tokens may draw anything the presets draw.
    return dataclasses.replace(fit, lo=min(fit.lo, d.lo), hi=max(fit.hi, d.hi))


def prompts_trace(
    prompts: PromptFile,
    tokenizer,
    *,
    preset: str = "ramp",
    seed: int = 0,
    n_requests: int | None = None,
    peak: int = 64,
) -> Trace:
    """A workload trace of ``prompts``: request ``i`` is prompt ``i`` of the file (cycled when
    ``n_requests`` is more than the file holds; default: one request per prompt).

    From the file: each request's domain, temperature and top_p, its prompt length (tokens of
    ``tokenizer``, the target's) and its ``max_new_tokens`` where the line gives one. From the
    workload ``preset`` drawn with ``seed`` and ``peak`` over the same number of requests
    (:func:`~specrl.workload.presets.preset_trace`): the load pattern (closed-loop schedule, or
    open-loop Poisson arrivals for ``poisson``) and the output length of every request whose
    line gives none. ``prompt_lengths`` and ``output_lengths`` summarise the requests'
    lengths (:func:`fitted_lengths`). Offsets point into
    ``tokenize_prompts(prompts, tokenizer).streams``."""
    tokens = tokenize_prompts(prompts, tokenizer)
    n = len(prompts.prompts) if n_requests is None else n_requests
    if n < 1:
        raise SpecrlError(f"n_requests must be >= 1, got {n}")
    base = preset_trace(preset, seed=seed, n_requests=n, peak=peak)
    requests = []
    for i, drawn in enumerate(base.requests):
        j = i % len(prompts.prompts)
        p = prompts.prompts[j]
        requests.append(
            Request(
                domain=p.domain,
                offset=tokens.offsets[j],
                prompt_len=len(tokens.ids[j]),
                max_new_tokens=p.max_new_tokens or drawn.max_new_tokens,
                arrival_s=drawn.arrival_s,
                temperature=p.temperature,
                top_p=p.top_p,
            )
        )
    domains = [r.domain for r in requests]
    bands = [temperature_band(r.temperature) for r in requests]
    trace = Trace(
        name=f"{preset}:{Path(prompts.path).name}",
        seed=seed,
        domains={d: domains.count(d) / n for d in prompts.domains},
        load=base.load,
        prompt_lengths=fitted_lengths([r.prompt_len for r in requests]),
        output_lengths=fitted_lengths([r.max_new_tokens for r in requests]),
        requests=requests,
        sampling={b: bands.count(b) / n for b in SAMPLING_CONFIGS if b in bands},
        prompts=prompts.record(),
    )
    return trace_from_json(trace.to_json(), source=f"trace of {prompts.path}")
