"""The hardware profile: what one engine step costs on one machine with one model pair.

A profile is a JSON file (``format: "specrl-profile"``) holding a fingerprint of where it was
measured and the measured tables. Grids: ``batch_sizes`` (B, starting at 1), ``contexts``
(the batch's longest row, tokens: attention runs over the padded batch, so the longest row
sets the cost) and K = 0..``k_max``.

Tables (seconds are medians over the measured steps, device-synchronized; medians because
one busy moment on a shared machine would drag a mean of three samples far off):

* ``verify_s[b][k][c]``: the target forward over K+1 tokens per row.
* ``draft_s[b][k][c]``: the draft's K proposals, without catch-up (0 for K=0).
* ``overhead_s[b][k]``: the rest of a step (sampling, bookkeeping, retiring rows; at K=0
  also the setup before the target forward).
* ``time_log_sigma[b]``: spread of a step's time around the table: robust standard deviation
  (1.4826 * MAD) of ``log(measured / table)`` over the steps at batch size ``b``.
* ``prefill`` and ``catchup``: ``{"tokens": [...], "seconds": [...]}``: the target's prompt
  prefill and the draft's catch-up forward by padded tokens (rows x widest row): the median
  at each measured token count, made non-decreasing (interpolated linearly between).
* ``acceptance[domain][band][i]``: probability that draft token ``i`` (0-based) is accepted
  given tokens ``0..i-1`` were, for requests of temperature band ``band`` (a name of
  :data:`~specrl.workload.trace.SAMPLING_CONFIGS`: ``greedy``, ``chat``, ``default``), from
  ``acceptance_counts[domain][band]``. Domains are ``code``, ``prose`` and ``hard``, or, in a
  profile measured on a prompts file (``specrl profile --prompts``), the file's domains, named
  with the file in ``meta.prompts`` (checked as a trace's ``prompts`` record is).
* ``acceptance_by_output``: ``{"edges": [e_1, ...], "rates": {domain: {band: [[rate per
  position] per bucket]}}}``: the same conditional rates by tokens the row had generated
  before the step, bucket ``j`` covering ``[e_j, e_{j+1})`` (``e_0 = 0``, the last
  open-ended).
* ``request_levels[domain][band]``: sorted quantiles (at ``(i + 0.5) / n``) of the
  per-request acceptance level, a logit offset added to every conditional rate of the
  request (see :func:`specrl.profile.level_fit.request_offsets`).
* ``level_drift[domain][band]`` (optional; absent: each request keeps one level throughout):
  ``{"per_token": phi, "scale": s, "shift": c}``. A request's level moves as it generates:
  it is ``s * Q(Phi(z)) + c`` with ``Q`` the quantiles of ``request_levels``, ``Phi`` the
  standard normal CDF and ``z`` a standard normal that keeps ``phi ** n`` of its value over
  ``n`` generated tokens (an AR(1) process: ``phi = 1`` is a fixed level, smaller drifts
  faster); see :mod:`specrl.profile.levels`. Fitted by
  :func:`specrl.profile.level_fit.fit_level_drift`.
* ``cell_s[b][k]`` and ``cell_spread[b][k]`` (optional, together): at the shortest context,
  the median seconds of the timing cells' clean decode steps (no admission, no catch-up)
  and their spread, the robust standard deviation of ``log(seconds / median)``
  (:func:`specrl.profile.timing.cell_statistics`). The freshness check rebuilds those cells
  row for row and compares its own medians with these, within a tolerance set by the
  spread (:mod:`specrl.profile.freshness`).
* ``cell_prefill`` (optional): ``{"tokens": [...], "seconds": [...]}``: each timing cell's
  admission (its first step: rows x context padded tokens) as measured, the median at each
  token count, before ``prefill`` pools it with the small admissions. The freshness check
  times the same admissions and compares them with these, so that it compares one
  procedure with itself (:mod:`specrl.profile.freshness`).
* ``tokens_per_s[b][k]``: goodput from the measurements: ``b * E(K)`` committed tokens per
  step (``E`` from the measured acceptance, averaged over the domains) over the step time
  at ``contexts[0]`` (the README's table). Per-step committed counts at small batch are too
  few to average directly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

from specrl.errors import SpecrlError
from specrl.files import check_header, read_json, write_json
from specrl.workload.trace import SAMPLING_CONFIGS, known_domains
from specrl.workload.trace_file import check_known_keys

PROFILE_FORMAT = "specrl-profile"
OPTIONAL_FIELDS = ("meta", "cell_s", "cell_spread", "level_drift", "cell_prefill")
PROFILE_VERSION = 3
"""3: acceptance per domain and temperature band, per-request levels (``request_levels``);
batch grid to 128. 2: acceptance by output position; the prefill commits the first token."""


@dataclass
class Profile:
    fingerprint: dict
    batch_sizes: list[int]
    contexts: list[float]
    k_max: int
    verify_s: list[list[list[float]]]
    draft_s: list[list[list[float]]]
    overhead_s: list[list[float]]
    time_log_sigma: list[float]
    prefill: dict
    catchup: dict
    acceptance: dict[str, dict[str, list[float]]]
    acceptance_by_output: dict
    acceptance_counts: dict[str, dict[str, dict[str, list]]]
    request_levels: dict[str, dict[str, list[float]]]
    tokens_per_s: list[list[float]]
    meta: dict = field(default_factory=dict)
    cell_s: list[list[float]] | None = None
    """Optional (None: a profile from before they were kept); see the module."""
    cell_spread: list[list[float]] | None = None
    cell_prefill: dict | None = None
    """Optional (None: a profile from before it was kept); see the module."""
    level_drift: dict[str, dict[str, dict[str, float]]] | None = None
    """Optional (None: fixed levels); see the module."""

    def step_seconds(self, b: int, k: int, c: int) -> float:
        """Table time of a step without prefill or catch-up, at grid indices."""
        return self.verify_s[b][k][c] + self.draft_s[b][k][c] + self.overhead_s[b][k]

    @property
    def bands(self) -> list[str]:
        """The temperature bands measured (the same for every domain)."""
        return list(next(iter(self.acceptance.values())))

    @property
    def mean_acceptance(self) -> list[float]:
        """Conditional rates per position averaged over every domain and band measured."""
        tables = [rates for by_band in self.acceptance.values() for rates in by_band.values()]
        return [sum(col) / len(col) for col in zip(*tables)]

    @property
    def plain_decode_tokens_per_s(self) -> float:
        """Committed tokens per second of plain decoding (K=0) at batch 1, shortest context."""
        return 1.0 / self.step_seconds(0, 0, 0)

    def to_json(self) -> dict:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, **asdict(self)}

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_json())


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _check_array(value, shape: tuple[int, ...], where: str) -> None:
    if not shape:
        if not _num(value):
            raise SpecrlError(f"{where}: expected a finite number >= 0, got {value!r}")
        return
    if not isinstance(value, list) or len(value) != shape[0]:
        got = len(value) if isinstance(value, list) else type(value).__name__
        raise SpecrlError(f"{where}: expected a list of {shape[0]}, got {got}")
    for i, item in enumerate(value):
        _check_array(item, shape[1:], f"{where}[{i}]")


def _check_points(obj, where: str) -> None:
    if not isinstance(obj, dict) or set(obj) != {"tokens", "seconds"}:
        raise SpecrlError(f"{where}: expected {{'tokens': [...], 'seconds': [...]}}")
    n = len(obj["tokens"]) if isinstance(obj["tokens"], list) else 0
    if n == 0:
        raise SpecrlError(f"{where}.tokens: expected a non-empty list")
    _check_array(obj["tokens"], (n,), f"{where}.tokens")
    _check_array(obj["seconds"], (n,), f"{where}.seconds")
    if any(b < a for a, b in pairwise(obj["tokens"])):
        raise SpecrlError(f"{where}.tokens: must be sorted ascending")


def _check_rates(table, shape: tuple[int, ...], where: str) -> None:
    _check_array(table, shape, where)
    flat = table
    for _ in shape[:-1]:
        flat = [x for row in flat for x in row]
    if any(r > 1 for r in flat):
        raise SpecrlError(f"{where}: acceptance rates must lie in [0, 1]")


def _check_by_band(obj, where: str, bands: list[str] | None) -> list[str]:
    """``obj`` is ``{band: ...}`` over known band names, the same bands as ``bands``."""
    if not isinstance(obj, dict) or not obj:
        raise SpecrlError(f"{where}: expected {{band: ...}} over {list(SAMPLING_CONFIGS)}")
    unknown = [b for b in obj if b not in SAMPLING_CONFIGS]
    if unknown:
        raise SpecrlError(
            f"{where}: unknown temperature band {unknown[0]!r}; known: {list(SAMPLING_CONFIGS)}"
        )
    if bands is not None and sorted(obj) != sorted(bands):
        raise SpecrlError(f"{where}: expected the bands {sorted(bands)}, got {sorted(obj)}")
    return list(obj)


def _check_by_output(obj, domains: set, bands: list[str], k_max: int, source: str) -> None:
    where = f"{source}.acceptance_by_output"
    if not isinstance(obj, dict) or set(obj) != {"edges", "rates"}:
        raise SpecrlError(f"{where}: expected {{'edges': [...], 'rates': {{domain: ...}}}}")
    edges = obj["edges"]
    if not (
        isinstance(edges, list)
        and all(isinstance(e, int) and not isinstance(e, bool) and e > 0 for e in edges)
        and all(b > a for a, b in pairwise(edges))
    ):
        raise SpecrlError(f"{where}.edges: expected increasing integers > 0, got {edges!r}")
    for table, at in _groups(obj["rates"], domains, bands, f"{where}.rates"):
        _check_rates(table, (len(edges) + 1, k_max), at)


def _groups(obj, domains: set, bands: list[str], where: str):
    """``obj`` is ``{domain: {band: entry}}`` over exactly ``domains`` and ``bands``; yields
    each entry with its field path."""
    if not isinstance(obj, dict) or set(obj) != domains:
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise SpecrlError(f"{where}: expected the domains {sorted(domains)}, got {got}")
    for domain, by_band in obj.items():
        _check_by_band(by_band, f"{where}.{domain}", bands)
        for band, entry in by_band.items():
            yield entry, f"{where}.{domain}.{band}"


def _check_drift(obj, domains: set, bands: list[str], where: str) -> None:
    for entry, at in _groups(obj, domains, bands, where):
        if not isinstance(entry, dict) or set(entry) != {"per_token", "scale", "shift"}:
            raise SpecrlError(f'{at}: expected {{"per_token": phi, "scale": s, "shift": c}}')
        phi, scale, shift = entry["per_token"], entry["scale"], entry["shift"]
        if not (_num(phi) and 0 < phi <= 1):
            raise SpecrlError(f"{at}.per_token: expected a number in (0, 1], got {phi!r}")
        if not (_num(scale) and scale > 0):
            raise SpecrlError(f"{at}.scale: expected a number > 0, got {scale!r}")
        finite = isinstance(shift, (int, float)) and not isinstance(shift, bool)
        if not (finite and math.isfinite(shift)):
            raise SpecrlError(f"{at}.shift: expected a finite number, got {shift!r}")


MAX_TIME_LOG_SIGMA = 2.0
"""The largest step-time log-spread a profile may hold: step times spread 7x at one batch size
are no measurement, and a measured profile's spread is a small fraction of this."""


def profile_from_json(obj, source: str = "profile") -> Profile:
    """Validate a decoded profile; a profile that fails any check is rejected whole."""
    check_header(
        obj,
        source,
        fmt=PROFILE_FORMAT,
        version=PROFILE_VERSION,
        what="profile",
        remake=f"measure it again with `specrl profile --out {source}`",
    )
    names = [f for f in Profile.__dataclass_fields__ if f not in OPTIONAL_FIELDS]
    for name in names:
        if name not in obj:
            raise SpecrlError(f"{source}: missing field {name!r}")
    # A misspelt level_drift would otherwise simulate fixed levels unnoticed.
    check_known_keys(obj, ("format", "version", *Profile.__dataclass_fields__), source, "field")
    shape = _check_grid(obj, source)
    _check_times(obj, shape, source)
    meta, bands = _check_acceptance(obj, obj["k_max"], source)
    cell_s, cell_spread = obj.get("cell_s"), obj.get("cell_spread")
    if (cell_s is None) != (cell_spread is None):
        missing = "cell_spread" if cell_s is not None else "cell_s"
        raise SpecrlError(
            f"{source}: missing field {missing!r} (cell_s and cell_spread come together)"
        )
    if cell_s is not None:
        _check_cells(cell_s, cell_spread, shape[:2], source)
    cell_prefill = obj.get("cell_prefill")
    if cell_prefill is not None:
        _check_points(cell_prefill, f"{source}.cell_prefill")
    drift = obj.get("level_drift")
    if drift is not None:
        _check_drift(drift, set(obj["acceptance"]), bands, f"{source}.level_drift")
    if not isinstance(obj["fingerprint"], dict):
        raise SpecrlError(f"{source}.fingerprint: expected an object")
    if not isinstance(obj["acceptance_counts"], dict):
        raise SpecrlError(f"{source}.acceptance_counts: expected an object")
    return Profile(
        **{name: obj[name] for name in names},
        meta=dict(meta),
        level_drift=drift,
        cell_s=cell_s,
        cell_spread=cell_spread,
        cell_prefill=cell_prefill,
    )


def _check_grid(obj, source: str) -> tuple[int, int, int]:
    """``k_max``, ``batch_sizes`` and ``contexts``; returns the tables' shape (batch sizes,
    K = 0..k_max, contexts)."""
    k_max = obj["k_max"]
    if not isinstance(k_max, int) or isinstance(k_max, bool) or k_max < 0:
        raise SpecrlError(f"{source}.k_max: expected an integer >= 0, got {k_max!r}")
    batch_sizes, contexts = obj["batch_sizes"], obj["contexts"]
    ok_b = (
        isinstance(batch_sizes, list)
        and batch_sizes
        and all(isinstance(b, int) and not isinstance(b, bool) for b in batch_sizes)
        and batch_sizes[0] == 1
        and all(b > a for a, b in pairwise(batch_sizes))
    )
    if not ok_b:
        raise SpecrlError(f"{source}.batch_sizes: expected increasing integers starting at 1")
    if not (isinstance(contexts, list) and contexts and all(_num(c) for c in contexts)) or any(
        b <= a for a, b in pairwise(contexts)
    ):
        raise SpecrlError(f"{source}.contexts: expected increasing numbers >= 0")
    return len(batch_sizes), k_max + 1, len(contexts)


def _check_times(obj, shape: tuple[int, int, int], source: str) -> None:
    """The step-time tables of ``shape`` (batch sizes, K, contexts), the goodput table, and
    the prefill and catch-up costs."""
    nb, nk, nc = shape
    _check_array(obj["verify_s"], (nb, nk, nc), f"{source}.verify_s")
    _check_array(obj["draft_s"], (nb, nk, nc), f"{source}.draft_s")
    _check_array(obj["overhead_s"], (nb, nk), f"{source}.overhead_s")
    _check_array(obj["time_log_sigma"], (nb,), f"{source}.time_log_sigma")
    if max(obj["time_log_sigma"]) > MAX_TIME_LOG_SIGMA:
        raise SpecrlError(
            f"{source}.time_log_sigma: {max(obj['time_log_sigma'])!r} is above "
            f"{MAX_TIME_LOG_SIGMA} (step times spread {math.exp(MAX_TIME_LOG_SIGMA):.0f}x at one "
            "sigma), not a measurement; measure the profile again"
        )
    _check_array(obj["tokens_per_s"], (nb, nk), f"{source}.tokens_per_s")
    if not all(v > 0 for v in obj["verify_s"][0][0]):
        raise SpecrlError(f"{source}.verify_s[0][0]: plain decode times must be > 0")
    _check_points(obj["prefill"], f"{source}.prefill")
    _check_points(obj["catchup"], f"{source}.catchup")


def _check_acceptance(obj, k_max: int, source: str) -> tuple[dict, list | None]:
    """``acceptance``, ``acceptance_by_output`` and ``request_levels``, over the domains
    ``meta`` allows (:func:`~specrl.workload.trace.known_domains`); returns ``meta`` and the
    bands every domain has."""
    acceptance = obj["acceptance"]
    if not isinstance(acceptance, dict) or not acceptance:
        raise SpecrlError(
            f"{source}.acceptance: expected {{domain: {{band: [rate per position]}}}}"
        )
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise SpecrlError(f"{source}.meta: expected an object")
    known = known_domains(meta.get("prompts"), f"{source}.meta.prompts")
    bands = None
    for domain, by_band in acceptance.items():
        where = f"{source}.acceptance.{domain}"
        if domain not in known:
            raise SpecrlError(f"{where}: unknown domain {domain!r}; known: {known}")
        bands = _check_by_band(by_band, where, bands)
        for band, rates in by_band.items():
            _check_rates(rates, (k_max,), f"{where}.{band}")
    _check_by_output(obj["acceptance_by_output"], set(acceptance), bands, k_max, source)
    _check_levels(obj["request_levels"], acceptance, bands, source)
    return meta, bands


def _check_levels(levels, acceptance: dict, bands, source: str) -> None:
    """``request_levels``: per domain of ``acceptance`` and band, sorted finite quantiles."""
    if not isinstance(levels, dict) or set(levels) != set(acceptance):
        raise SpecrlError(
            f"{source}.request_levels: expected the domains {sorted(acceptance)}, one list of "
            "quantiles per band"
        )
    for domain, by_band in levels.items():
        where = f"{source}.request_levels.{domain}"
        _check_by_band(by_band, where, bands)
        for band, quantiles in by_band.items():
            ok = (
                isinstance(quantiles, list)
                and quantiles
                and all(
                    isinstance(q, (int, float)) and not isinstance(q, bool) and math.isfinite(q)
                    for q in quantiles
                )
                and all(b >= a for a, b in pairwise(quantiles))
            )
            if not ok:
                raise SpecrlError(
                    f"{where}.{band}: expected a non-empty sorted list of finite numbers"
                )


def _check_cells(cell_s, cell_spread, shape: tuple[int, int], source: str) -> None:
    """``cell_s`` and ``cell_spread``, ``shape`` (batch sizes, K) each."""
    _check_array(cell_s, shape, f"{source}.cell_s")
    _check_array(cell_spread, shape, f"{source}.cell_spread")
    if not all(v > 0 for row in cell_s for v in row):
        raise SpecrlError(f"{source}.cell_s: step times must be > 0")
    if max(max(row) for row in cell_spread) > MAX_TIME_LOG_SIGMA:
        raise SpecrlError(
            f"{source}.cell_spread: {max(max(row) for row in cell_spread)!r} is above "
            f"{MAX_TIME_LOG_SIGMA}, not a measurement; measure the profile again"
        )


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile written by ``specrl profile --out PATH``."""
    obj = read_json(path, "profile", f"measure one with `specrl profile --out {path}`")
    return profile_from_json(obj, source=str(path))
