"""The exported K table (format ``"specrl-k-table"``, version 2): what a serving stack reads.

Pure Python (standard library and :mod:`specrl.errors`, :mod:`specrl.files`,
:mod:`specrl.features` only): :class:`specrl.controller.LookupController` loads it on a
serving stack's hot path, where numpy, torch and gymnasium have no place.

A table holds K for every batch size ``1..max_batch`` in contiguous buckets, by the
acceptance estimate (bins over [0, 1]) and optionally by context length::

    {
     "format": "specrl-k-table",
     "version": 2,
     "k_max": 4,
     "max_batch": 64,
     "batch_buckets": [[1, 8], [9, 32], [33, 64]],
     "acceptance_edges": [0.0, 0.4, 0.7, 1.0],
     "k": [[1, 3, 4], [0, 2, 3], [0, 0, 1]],
     "stale_k": [0, 0, 0],
     "probe": {"after_steps": 32, "k": 1, "scope": "speculating"},
     "provenance": {"profile_sha256": "...", "profile_fingerprint": {...}, "target_id": "...",
                    "draft_id": "...", "run_id": "...", "training_steps": 200000,
                    "specrl_version": "0.1.0", "created": "2026-11-02T10:00:00+00:00"}
    }

Fields:

* ``k_max``: the largest K the engine drafts (1..:data:`K_MAX_LIMIT`); no K exceeds it.
* ``max_batch``: the largest batch the table was made for (1..:data:`MAX_BATCH_LIMIT`).
  A controller clamps larger batches to the last bucket.
* ``batch_buckets``: ``[lo, hi]`` inclusive ranges, the first starting at 1, each starting
  one after the previous ends, the last ending at ``max_batch``. ``[[1, 1], [2, 2], ...]``
  lists every size.
* ``acceptance_edges``: ``e_0 = 0 < e_1 < ... < e_n = 1``; bin ``j`` is ``[e_j, e_{j+1})``,
  the last one closed at 1. The estimate is :class:`specrl.features.AcceptanceTracker`'s:
  the per-token acceptance (the chance that a draft token is accepted given the ones before
  it were), averaged over recent steps. Version 1 tables indexed accepted / drafted, which
  falls as K grows at the same traffic; they are refused.
* ``context_bins`` (optional): ``[lo, hi]`` inclusive ranges of the batch's longest row in
  tokens, the first starting at 1, contiguous, the last ``[lo, null]`` (open-ended).
* ``k``: K per batch bucket and acceptance bin, ``k[bucket][acceptance]``; with context bins
  ``k[bucket][context][acceptance]``. Integers ``0..k_max``.
* ``stale_k``: K when the acceptance estimate is unknown or stale, that is when no step has
  drafted for :data:`~specrl.features.STALE_STEPS` steps (as at the start):
  ``stale_k[bucket]``, with context bins ``stale_k[bucket][context]``.
* ``probe``: ``{"after_steps": N, "k": P}``. Whenever the table says K=0 and no step has
  drafted for ``N`` steps, the controller drafts ``P`` (1..k_max) for a step, so the
  estimate is measured again instead of going blind. With ``N = STALE_STEPS`` (the default
  of :func:`specrl.table.build.table_from_policy`) the probe fires exactly when the estimate
  becomes fully stale, the moment ``stale_k`` takes over; so a ``stale_k`` of 0 still probes.
  Before any step has drafted (the start) the interval counts as passed
  (:data:`~specrl.features.NEVER_MEASURED`): K=0 on the first step probes at once.
  Optional ``"scope"`` (:data:`PROBE_SCOPES`), where the probe may fire:

  * ``"all"`` (the default when absent): at every batch size.
  * ``"speculating"``: only at batch sizes (and context bins) whose row has a K > 0 in some
    acceptance bin. Elsewhere the table says K=0 at every estimate, so a probe cannot
    change what it chooses there, and it pays the draft's catch-up on every skipped token
    of every row.
  * ``"operating"``, with ``"acceptance": A`` (a number in [0, 1], required with this scope
    and refused with the others): only where the row has a K > 0 in some acceptance bin at
    or below the one holding ``A``, the typical acceptance the table was made for (the
    export writes its operating point there). A row that drafts only at estimates above
    ``A`` pays the catch-up of a probe for a change of K that typical traffic does not
    bring; it still drafts when a fresh estimate reaches its K > 0 bins.

  Once the batch reaches a row where the probe may fire, the interval has usually passed
  and the probe fires at once.
* ``provenance``: where the table came from; the keys of :data:`PROVENANCE_KEYS` are
  required (more are allowed). :meth:`LookupController.load
  <specrl.controller.LookupController.load>` compares ``profile_fingerprint`` with the
  serving machine's profile. ``acceptance_estimate`` (optional, one of
  ``specrl.features.ACCEPTANCE_ESTIMATES``; absent means ``"steps"``) names the figure the
  acceptance bins are read with; a controller fed another refuses the table.

A file that breaks any rule is rejected whole with a :class:`~specrl.errors.SpecrlError`
naming the field.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import InitVar, dataclass
from datetime import datetime, timezone
from pathlib import Path

from specrl.errors import SpecrlError
from specrl.features import ACCEPTANCE_ESTIMATES, NEVER_MEASURED, STALE_STEPS, TEMPERATURE_BANDS
from specrl.files import check_header, read_json, write_atomic

TABLE_FORMAT = "specrl-k-table"
TABLE_VERSION = 2
K_MAX_LIMIT = 256
"""No engine drafts more; a larger ``k_max`` is a corrupt file."""
PROBE_SCOPES = ("all", "speculating", "operating")
"""Values of the probe rule's optional ``scope`` (see the module)."""
MAX_BATCH_LIMIT = 65536
"""The controller expands the buckets into one entry per batch size; this bounds that list."""
CONTEXT_LIMIT = 2**31 - 2
"""Context bounds stay below vLLM's "infinity" (:data:`specrl.table.vllm.CONTEXT_INFINITY`,
2**31 - 1) so every table exports."""
PROVENANCE_KEYS = {
    "profile_sha256": str,
    "profile_fingerprint": dict,
    "target_id": str,
    "draft_id": str,
    "run_id": str,
    "training_steps": int,
    "specrl_version": str,
    "created": str,
}
"""Required provenance keys and their JSON types; fingerprint values are strings or numbers."""

_REMAKE = "export the table again with `specrl export --run RUN_DIR --out TABLE.json`"
_REMAKE_VERSION = (
    "export a table from a run trained with this specrl (version 1 tables index the "
    "acceptance as accepted / drafted): `specrl train --out RUN_DIR`, then `specrl export "
    "--run RUN_DIR --out TABLE.json`"
)
_MEANING = {
    "k_max": "the largest K the engine drafts",
    "max_batch": "the largest batch size the table covers",
    "batch_buckets": "[lo, hi] batch ranges covering 1..max_batch",
    "acceptance_edges": "acceptance bin edges from 0 to 1",
    "context_bins": "[lo, hi] context ranges from 1, the last [lo, null]",
    "k": "K per batch bucket and acceptance bin",
    "stale_k": "K per batch bucket when the acceptance estimate is unknown or stale",
    "probe": 'the probe rule while K=0, like {"after_steps": 32, "k": 1, "scope": "all"}',
    "provenance": "where the table came from",
    "request_acceptance": "the per-request acceptance estimate's candidates and curves",
}
_FIELDS = tuple(_MEANING)
OPTIONAL_FIELDS = ("context_bins", "request_acceptance")


@dataclass
class KTable:
    """A validated K table; the fields are the file's (see the module docstring).

    Construction validates every field and raises :class:`SpecrlError` naming the first
    that is wrong; ``source`` (the file, by default ``"KTable"``) starts each message.
    Nested lists are copied, so later changes to the arguments do not reach the table.
    Without ``context_bins``, ``k`` is ``[bucket][acceptance]`` and ``stale_k`` is
    ``[bucket]``; :meth:`cell` and :meth:`stale` read either shape.
    """

    k_max: int
    max_batch: int
    batch_buckets: list[list[int]]
    acceptance_edges: list[float]
    k: list
    stale_k: list
    probe: dict
    provenance: dict
    context_bins: list[list[int | None]] | None = None
    request_acceptance: dict | None = None
    source: InitVar[str] = "KTable"

    def __post_init__(self, source: str) -> None:
        _validate(self, source)
        for name in _FIELDS:
            setattr(self, name, copy.deepcopy(getattr(self, name)))

    # ------------------------------------------------------------------ lookups

    @property
    def n_context(self) -> int:
        """Context bins (1 without ``context_bins``)."""
        return 1 if self.context_bins is None else len(self.context_bins)

    @property
    def context_starts(self) -> list[int]:
        """The first token count of every context bin, ascending (``[1]`` without bins)."""
        return [1] if self.context_bins is None else [lo for lo, _ in self.context_bins]

    def cell(self, bucket: int, context: int = 0) -> list[int]:
        """K per acceptance bin in batch bucket ``bucket`` and context bin ``context``
        (indices)."""
        row = self.k[bucket]
        return row if self.context_bins is None else row[context]

    def stale(self, bucket: int, context: int = 0) -> int:
        """K in bucket ``bucket`` and context bin ``context`` when the estimate is stale."""
        entry = self.stale_k[bucket]
        return entry if self.context_bins is None else entry[context]

    def probes_at(self, bucket: int, context: int = 0) -> bool:
        """Whether the probe rule may fire in bucket ``bucket`` and context bin ``context``
        (its ``scope``; see the module)."""
        scope = self.probe.get("scope", "all")
        if scope == "all":
            return True
        ks = self.cell(bucket, context)
        if scope == "operating":
            ks = ks[: self.acceptance_bin(self.probe["acceptance"]) + 1]
        return any(ks)

    def acceptance_bin(self, acceptance: float) -> int:
        """The bin holding ``acceptance`` (below 0: the first; 1 and above: the last)."""
        return sum(acceptance >= edge for edge in self.acceptance_edges[1:-1])

    def context_bin(self, context_len: int | None) -> int:
        """The bin holding ``context_len`` tokens (None or below 1: the first)."""
        if context_len is None:
            return 0
        return max(0, sum(context_len >= start for start in self.context_starts) - 1)

    # ------------------------------------------------------------------ files

    def to_json(self) -> dict:
        obj = {"format": TABLE_FORMAT, "version": TABLE_VERSION}
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                obj[name] = copy.deepcopy(value)
        return obj

    def save(self, path: str | Path) -> None:
        """Write the table as JSON, one batch bucket (or context bin) per line; atomically,
        so a server reloading it never reads half a file."""
        path = Path(path)
        obj = self.to_json()
        lines = []
        for key, value in obj.items():
            if isinstance(value, list) and value and isinstance(value[0], list):
                rows = ",\n  ".join(json.dumps(row) for row in value)
                text = f"[\n  {rows}\n ]"
            elif key == "request_acceptance":
                rows = ",\n   ".join(json.dumps(g) for g in value["groups"])
                edges = json.dumps(value["generated_edges"])
                text = f'{{"generated_edges": {edges}, "groups": [\n   {rows}\n ]}}'
            elif key == "provenance":
                text = json.dumps(value, indent=1).replace("\n", "\n ")
            else:
                text = json.dumps(value)
            lines.append(f" {json.dumps(key)}: {text}")
        write_atomic(path, "{\n" + ",\n".join(lines) + "\n}\n")


def table_from_json(obj, source: str = "K table") -> KTable:
    """Validate a parsed table file (``source`` names it in errors)."""
    check_header(
        obj, source, fmt=TABLE_FORMAT, version=TABLE_VERSION, what="K table", remake=_REMAKE_VERSION
    )
    unknown = sorted(set(obj) - set(_FIELDS) - {"format", "version"})
    if unknown:
        raise SpecrlError(
            f"{source}: unknown field(s) {', '.join(map(repr, unknown))}; a version "
            f"{TABLE_VERSION} table holds only {', '.join(_FIELDS)}"
        )
    for name in _FIELDS:
        if name not in obj and name not in OPTIONAL_FIELDS:
            raise SpecrlError(f"{source}: missing field {name!r} ({_MEANING[name]}); {_REMAKE}")
    return KTable(**{name: obj.get(name) for name in _FIELDS}, source=source)


def load_table(path: str | Path) -> KTable:
    """Read and validate a table written by ``specrl export`` (or :meth:`KTable.save`)."""
    obj = read_json(path, "K table", _REMAKE)
    return table_from_json(obj, source=str(path))


def provenance(
    *,
    profile_sha256: str,
    profile_fingerprint: dict,
    target_id: str,
    draft_id: str,
    run_id: str,
    training_steps: int,
    **extra,
) -> dict:
    """A provenance object stamped with this specrl's version and the time now (UTC);
    ``extra`` keys (JSON values) are kept as they are."""
    # At call time: a serving stack may vendor this module without specrl's package __init__.
    from specrl import __version__

    return {
        "profile_sha256": profile_sha256,
        "profile_fingerprint": dict(profile_fingerprint),
        "target_id": target_id,
        "draft_id": draft_id,
        "run_id": run_id,
        "training_steps": training_steps,
        "specrl_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


# ---------------------------------------------------------------------- validation


def is_int(value) -> bool:
    """Whether ``value`` is an integer; JSON's ``true`` and ``false`` are not."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_acceptance(value) -> bool:
    """Whether ``value`` is an acceptance: a finite number (not a bool) in [0, 1]."""
    return _is_number(value) and 0 <= value <= 1


def check_acceptance(value, name: str = "acceptance") -> float:
    """``value`` as an acceptance, a finite number in [0, 1]; else an error naming ``name``."""
    if not is_acceptance(value):
        raise SpecrlError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def _int_field(value, where: str, low: int, high: int, meaning: str = "") -> int:
    if not is_int(value) or not low <= value <= high:
        detail = f" ({meaning})" if meaning else ""
        raise SpecrlError(f"{where}: expected an integer {low}..{high}{detail}, got {value!r}")
    return value


def _list_field(value, where: str, length: int | None = None, what: str = "a list") -> list:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        got = f"a list of {len(value)}" if isinstance(value, list) else repr(value)
        need = f"a list of {length}" if length is not None else what
        raise SpecrlError(f"{where}: expected {need}, got {got}")
    return value


def _check_ranges(ranges, where: str, last_end: int | None, limit: int, what: str) -> None:
    """Contiguous inclusive ``[lo, hi]`` ranges from 1; the last ends at ``last_end`` (None:
    open-ended, written ``null``)."""
    _list_field(ranges, where, what=f"a non-empty list of [lo, hi] {what} ranges")
    if not ranges:
        raise SpecrlError(f"{where}: expected a non-empty list of [lo, hi] {what} ranges")
    expected_lo = 1
    for i, entry in enumerate(ranges):
        at = f"{where}[{i}]"
        _list_field(entry, at, 2)
        lo, hi = entry
        last = i == len(ranges) - 1
        _int_field(lo, f"{at}[0]", 1, limit, f"first {what} of the range")
        if lo != expected_lo:
            fault = "leaves a gap" if lo > expected_lo else "overlaps the previous range"
            start = (
                "the first range must start at 1"
                if i == 0
                else (f"it must start at {expected_lo}, one after the previous range ends")
            )
            raise SpecrlError(f"{at} starts at {lo} and {fault}; {start}")
        if last and last_end is None:
            if hi is not None:
                raise SpecrlError(f"{at}: the last {what} range is open-ended; write [{lo}, null]")
            break
        if last and hi != last_end:
            raise SpecrlError(
                f"{at}: the last {what} range ends at {hi!r}; it must end at {last_end} "
                f"(max_batch) so every {what} size has a K"
            )
        _int_field(hi, f"{at}[1]", lo, limit, f"last {what} of the range, >= its start")
        expected_lo = hi + 1


def _check_ks(value, shape: tuple[int, ...], where: str, k_max: int) -> None:
    if not shape:
        if is_int(value) and value > k_max:
            raise SpecrlError(f"{where}: K={value} is above k_max ({k_max}); K is 0..k_max")
        _int_field(value, where, 0, k_max, "a K, at most k_max")
        return
    _list_field(value, where, shape[0])
    for i, item in enumerate(value):
        _check_ks(item, shape[1:], f"{where}[{i}]", k_max)


def _check_json_value(value, where: str, depth: int = 0) -> None:
    if depth > 32:
        raise SpecrlError(f"{where}: nested too deeply")
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise SpecrlError(f"{where}: expected a finite number, got {value!r}")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_value(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SpecrlError(f"{where}: keys must be strings, got {key!r}")
            _check_json_value(item, f"{where}.{key}", depth + 1)
        return
    raise SpecrlError(f"{where}: expected a JSON value, got {type(value).__name__}")


def _check_provenance(value, where: str) -> None:
    if not isinstance(value, dict):
        raise SpecrlError(f"{where}: expected an object with {', '.join(PROVENANCE_KEYS)}")
    for key, kind in PROVENANCE_KEYS.items():
        at = f"{where}.{key}"
        if key not in value:
            raise SpecrlError(f"{where}: missing {key!r}; {_REMAKE}")
        item = value[key]
        if kind is int:
            _int_field(item, at, 0, 2**63 - 1)
        elif not isinstance(item, kind):
            raise SpecrlError(f"{at}: expected a {kind.__name__}, got {item!r}")
    estimate = value.get("acceptance_estimate", "steps")
    if estimate not in ACCEPTANCE_ESTIMATES:
        raise SpecrlError(
            f"{where}.acceptance_estimate: expected one of {', '.join(ACCEPTANCE_ESTIMATES)} "
            f"(the figure the table's acceptance bins are read with), got {estimate!r}"
        )
    for key, item in value["profile_fingerprint"].items():
        if not (isinstance(item, str) or _is_number(item)):
            raise SpecrlError(
                f"{where}.profile_fingerprint.{key}: expected a string or a finite number, "
                f"got {item!r}"
            )
    _check_json_value(value, where)


def check_acceptance_edges(edges, where: str) -> None:
    """Strictly increasing finite numbers from 0 to 1, at least two."""
    _list_field(edges, where)
    if len(edges) < 2 or not all(_is_number(e) for e in edges):
        raise SpecrlError(f"{where}: expected at least two finite numbers, got {edges!r}")
    if edges[0] != 0:
        wrong = f"it starts at {edges[0]!r}"
    elif edges[-1] != 1:
        wrong = f"it ends at {edges[-1]!r}"
    else:
        bad = [i for i in range(1, len(edges)) if edges[i] <= edges[i - 1]]
        wrong = f"[{bad[0]}] = {edges[bad[0]]!r} follows {edges[bad[0] - 1]!r}" if bad else None
    if wrong is not None:
        raise SpecrlError(
            f"{where}: expected strictly increasing edges from 0 to 1 (like [0, 0.5, 1]); {wrong}"
        )


def check_context_bins(bins, where: str) -> None:
    """Contiguous ``[lo, hi]`` token ranges from 1, the last ``[lo, None]``."""
    _check_ranges(bins, where, None, CONTEXT_LIMIT, "context")


def _validate(table: KTable, source: str) -> None:
    k_max = _int_field(table.k_max, f"{source}: field 'k_max'", 1, K_MAX_LIMIT)
    max_batch = _int_field(table.max_batch, f"{source}: field 'max_batch'", 1, MAX_BATCH_LIMIT)
    _check_ranges(
        table.batch_buckets, f"{source}: field 'batch_buckets'", max_batch, max_batch, "batch"
    )

    edges = table.acceptance_edges
    check_acceptance_edges(edges, f"{source}: field 'acceptance_edges'")
    if table.context_bins is not None:
        check_context_bins(table.context_bins, f"{source}: field 'context_bins'")

    n_buckets, n_acceptance = len(table.batch_buckets), len(edges) - 1
    by_context = () if table.context_bins is None else (len(table.context_bins),)
    _check_ks(table.k, (n_buckets, *by_context, n_acceptance), f"{source}: field 'k'", k_max)
    _check_ks(table.stale_k, (n_buckets, *by_context), f"{source}: field 'stale_k'", k_max)

    where = f"{source}: field 'probe'"
    if not isinstance(table.probe, dict) or not (
        {"after_steps", "k"} <= set(table.probe) <= {"after_steps", "k", "scope", "acceptance"}
    ):
        raise SpecrlError(
            f'{where}: expected {{"after_steps": N, "k": P}}, optionally "scope" and, with '
            f'"scope": "operating", "acceptance" (draft P tokens after N steps without '
            f'drafting, e.g. {{"after_steps": {STALE_STEPS}, "k": 1, "scope": "all"}}), got '
            f"{table.probe!r}"
        )
    scope = table.probe.get("scope", "all")
    if scope not in PROBE_SCOPES:
        raise SpecrlError(
            f"{where}.scope: must be one of {', '.join(map(repr, PROBE_SCOPES))} (where the "
            f"probe fires: every batch size, only where the row has a K > 0, or only where it "
            f"has one at or below the operating acceptance), got {table.probe['scope']!r}"
        )
    if scope == "operating":
        acceptance = table.probe.get("acceptance")
        if not is_acceptance(acceptance):
            raise SpecrlError(
                f'{where}.acceptance: the scope "operating" needs the acceptance it probes at, '
                f'a number in [0, 1] (like {{"scope": "operating", "acceptance": 0.7}}), got '
                f"{acceptance!r}"
            )
    elif "acceptance" in table.probe:
        raise SpecrlError(
            f'{where}.acceptance: only the scope "operating" takes an acceptance (this rule\'s '
            f'scope is {scope!r}); remove it, or set "scope": "operating"'
        )
    _int_field(
        table.probe["after_steps"],
        f"{where}.after_steps",
        1,
        NEVER_MEASURED,
        "steps without drafting before a probe",
    )
    _int_field(table.probe["k"], f"{where}.k", 1, k_max, "K of a probing step")

    _check_provenance(table.provenance, f"{source}: field 'provenance'")
    if table.request_acceptance is not None:
        estimate = table.provenance.get("acceptance_estimate", "steps")
        where = f"{source}: field 'request_acceptance'"
        if estimate == "steps":
            raise SpecrlError(
                f"{where}: read only by a table on a per-request estimate, and this one's "
                "provenance.acceptance_estimate is 'steps'; remove the field, or set the "
                "estimate the table was trained on"
            )
        check_request_block(table.request_acceptance, where, k_max)


def check_request_block(block, where: str, k_max: int) -> None:
    """The ``request_acceptance`` block: ``generated_edges`` (strictly increasing token
    counts) and ``groups``, each ``{"domain", "band", "levels", "logits"}`` with logits
    ``[len(generated_edges) + 1][k_max]``."""
    if not isinstance(block, dict) or set(block) != {"generated_edges", "groups"}:
        got = sorted(block) if isinstance(block, dict) else repr(block)
        raise SpecrlError(
            f'{where}: expected {{"generated_edges": [...], "groups": [...]}}, got {got}; {_REMAKE}'
        )
    edges = _list_field(block["generated_edges"], f"{where}.generated_edges")
    for i, edge in enumerate(edges):
        low = edges[i - 1] + 1 if i and is_int(edges[i - 1]) else 1
        _int_field(edge, f"{where}.generated_edges[{i}]", low, CONTEXT_LIMIT, "tokens, ascending")
    groups = _list_field(block["groups"], f"{where}.groups")
    if not groups:
        raise SpecrlError(f"{where}.groups: expected at least one group; {_REMAKE}")
    seen = set()
    for i, group in enumerate(groups):
        at = f"{where}.groups[{i}]"
        keys = {"domain", "band", "levels", "logits"}
        if not isinstance(group, dict) or set(group) != keys:
            got = sorted(group) if isinstance(group, dict) else repr(group)
            raise SpecrlError(f"{at}: expected the keys {sorted(keys)}, got {got}")
        domain, band = group["domain"], group["band"]
        if not isinstance(domain, str) or not domain:
            raise SpecrlError(f"{at}.domain: expected a domain name, got {domain!r}")
        if band not in TEMPERATURE_BANDS:
            raise SpecrlError(
                f"{at}.band: expected one of {', '.join(TEMPERATURE_BANDS)}, got {band!r}"
            )
        if (domain, band) in seen:
            raise SpecrlError(f"{at}: ({domain!r}, {band!r}) appears twice")
        seen.add((domain, band))
        levels = _list_field(group["levels"], f"{at}.levels")
        if not levels or not all(_is_number(x) for x in levels):
            raise SpecrlError(
                f"{at}.levels: expected a non-empty list of finite numbers (logit offsets)"
            )
        logits = _list_field(group["logits"], f"{at}.logits", len(edges) + 1)
        for j, row in enumerate(logits):
            _list_field(row, f"{at}.logits[{j}]", k_max)
            if not all(_is_number(x) for x in row):
                raise SpecrlError(f"{at}.logits[{j}]: expected {k_max} finite numbers")
