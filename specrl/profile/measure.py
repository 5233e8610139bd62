"""Measure a hardware profile with the real engine (``specrl profile --out PROFILE.json``).

A profile run has two measurements, each in a module of its own, and this module runs them:

* timing (:mod:`specrl.profile.timing`): engines of every batch size and context level are
  stepped through every K, and :mod:`specrl.profile.tables` makes the profile's step-cost
  tables from their steps;
* acceptance (:mod:`specrl.profile.acceptance`): requests are decoded per domain and
  temperature band, and :mod:`specrl.profile.level_fit` reads each request's acceptance level,
  and how levels drift, from them.

Before anything is timed, the run's settings are checked against the pair (its positions
above all); after it, the profile records where and how it was measured (``meta``).

With a prompts file (``specrl profile --prompts P.jsonl``, :mod:`specrl.workload.user_prompts`)
acceptance is measured on the file's prompts. The timing cells then cut their rows from the
prompts (joined per domain and repeated to reach a cell's length) and take the prompts'
sampling settings in turn. The profile's ``meta.prompts`` names the file and its domains;
``meta.prompt_counts[domain][band]`` counts the file's prompts per group (0: the group ran at
the band's setting). ``meta.prompt_lengths_dist`` summarises the file's prompt lengths (target
tokens) and ``meta.output_lengths_dist`` its output lengths where any line gives
``max_new_tokens`` (lines without one count at the presets' lengths, as in a trace of the
file: :func:`~specrl.workload.user_prompts.file_output_lengths`): the surrogate's preset
workloads draw their requests' lengths from them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone

import numpy as np
from tqdm.auto import tqdm

from specrl.engine import position_limit
from specrl.errors import SpecrlError
from specrl.profile.acceptance import (
    ACCEPTANCE_ROWS,
    OUTPUT_EDGES,
    bucket_rates,
    conditional_rates,
    corpus_acceptance,
    prompt_acceptance,
)
from specrl.profile.fingerprint import other_weights, pair_fingerprint
from specrl.profile.level_fit import fit_level_drift, level_quantiles, request_offsets
from specrl.profile.schema import Profile
from specrl.profile.tables import tabulate
from specrl.profile.timing import (
    LARGE_BATCH_REPEATS,
    TimedCells,
    cell_new_tokens,
    replicas,
    round_repeats,
    time_cells,
)
from specrl.workload.prompts import token_streams
from specrl.workload.trace import (
    DEFAULT_OUTPUT_LENGTHS,
    DEFAULT_PROMPT_LENGTHS,
    DOMAINS,
    SAMPLING_CONFIGS,
)
from specrl.workload.user_prompts import (
    PromptFile,
    file_output_lengths,
    fitted_lengths,
    tokenize_prompts,
)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
"""The batch sizes a profile times by default (``specrl profile --batch-sizes``)."""
ACCEPTANCE_FIELDS = (
    "acceptance",
    "acceptance_by_output",
    "acceptance_counts",
    "request_levels",
    "level_drift",
)
"""The profile's fields that hold what the pair accepts, not what the machine costs."""


def measure_profile(
    pair,
    *,
    k_max: int = 4,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    contexts: Sequence[int] = (16, 128, 256),
    reps: int = 5,
    streams: dict[str, list[int]] | None = None,
    device: str = "cpu",
    seed: int = 0,
    acceptance_rows: int = ACCEPTANCE_ROWS,
    acceptance_tokens: int | None = None,
    progress: bool = True,
    preset: str | None = None,
    prompts: PromptFile | None = None,
    acceptance_from: Profile | None = None,
    acceptance_source: str = "acceptance_from",
) -> Profile:
    """Measure ``pair`` on this machine; see the module docstring for what runs.

    ``prompts``: a prompts file (:func:`~specrl.workload.user_prompts.load_prompts`) to
    measure acceptance on, and to cut the timing cells' rows from unless ``streams`` is given;
    default: the held-out corpus's domains.

    ``acceptance_from``: a profile of the same weights whose acceptance fields
    (:data:`ACCEPTANCE_FIELDS`) are taken instead of measuring them again (see
    :func:`check_acceptance_source`, whose errors name it ``acceptance_source``): what a pair
    accepts does not depend on the machine, and measuring it is most of a profile's time.
    Only the step times are measured then."""
    # Long: a 16-option signature and docstring, then the measurement's steps in order.
    if pair.draft is None:
        raise SpecrlError("profiling needs a draft model; this pair has none")
    check_settings(k_max, batch_sizes, contexts, reps, acceptance_rows)
    started = time.perf_counter()
    fingerprint = pair_fingerprint(pair, k_max=k_max, device=device)
    if acceptance_from is not None:
        check_acceptance_source(
            acceptance_from,
            fingerprint,
            k_max=k_max,
            prompts=prompts,
            acceptance_rows=acceptance_rows,
            acceptance_tokens=acceptance_tokens,
            where=acceptance_source,
        )
    tokens = None if prompts is None else tokenize_prompts(prompts, pair.tokenizer)
    _check_positions(  # before the timing, not after it
        pair,
        batch_sizes=batch_sizes,
        contexts=contexts,
        k_max=k_max,
        reps=reps,
        acceptance_tokens=acceptance_tokens,
        prompts=prompts,
        tokens=tokens,
    )
    streams, by_cell = _row_streams(pair, streams, tokens)
    keys = [(b, c) for c in contexts for b in batch_sizes]
    groups = 0 if acceptance_from is not None else _acceptance_groups(prompts)
    rounds = reps * len(contexts)  # time_cells runs each context level's rounds in turn
    # Each cell's admission, then the cells, then the rounds.
    total = 2 * sum(replicas(b) for b, _ in keys) + rounds + groups
    bar = tqdm(total=total, desc="profile", disable=not progress)
    timed = _time_cells(
        pair,
        streams,
        keys,
        prompts,
        bar,
        rounds,
        k_max=k_max,
        reps=reps,
        device=device,
        seed=seed,
    )
    accepted = _accepted_fields(
        pair,
        streams,
        prompts,
        tokens,
        bar,
        acceptance_from,
        k_max=k_max,
        device=device,
        seed=seed,
        rows=acceptance_rows,
        new_tokens=acceptance_tokens,
    )
    bar.close()
    profile = tabulate(timed, batch_sizes, contexts, k_max, accepted, by_cell=by_cell)
    profile.fingerprint = fingerprint
    profile.meta = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - started, 1),
        "preset": preset,
        "reps": reps,
        "large_batch_repeats": LARGE_BATCH_REPEATS,
        "prompt_lengths": list(contexts),
        "acceptance_rows": acceptance_rows,
        "acceptance_tokens": acceptance_tokens,
        "seed": seed,
    }
    if acceptance_from is not None:
        profile.meta["acceptance_from"] = _source_record(acceptance_from, acceptance_source)
    if prompts is not None:
        profile.meta.update(_prompts_meta(prompts, tokens))
    return profile


def _time_cells(
    pair, streams, keys, prompts: PromptFile | None, bar, rounds: int, **kw
) -> TimedCells:
    """:func:`~specrl.profile.timing.time_cells` of ``keys``, counted on ``bar`` (``rounds``
    in all); with a prompts file, the cells' rows take its prompts' sampling settings in
    turn."""
    bar.set_postfix_str("timing cells")
    settings = None if prompts is None else [(p.temperature, p.top_p) for p in prompts.prompts]

    def after_round(r: int) -> None:
        bar.set_postfix_str(f"round {r + 1}/{rounds}")
        bar.update()

    return time_cells(
        pair, streams, keys, settings=settings, on_built=bar.update, on_round=after_round, **kw
    )


def check_settings(k_max, batch_sizes, contexts, reps, acceptance_rows) -> None:
    """Refuse settings that cannot make a profile, before any pair loads."""
    if k_max < 1:
        raise SpecrlError(f"k_max must be >= 1 to profile speculation, got {k_max}")
    if list(batch_sizes) != sorted(set(batch_sizes)) or batch_sizes[0] != 1:
        raise SpecrlError(f"batch sizes must increase from 1, got {list(batch_sizes)}")
    if list(contexts) != sorted(set(contexts)) or contexts[0] < 2:
        raise SpecrlError(f"contexts must increase from at least 2, got {list(contexts)}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise SpecrlError(f"reps must be an integer >= 1 (timings per K and cell), got {reps!r}")
    if acceptance_rows < 1:
        raise SpecrlError(f"acceptance_rows must be >= 1, got {acceptance_rows}")


def _row_streams(pair, streams, tokens) -> tuple[dict, bool]:
    """The token streams the timing cells cut their rows from: ``streams``, else a prompts
    file's (``tokens``), else the held-out corpus's; and whether a check can rebuild those
    rows (cut from the held-out corpus: from the tokenizer alone)."""
    if tokens is not None:
        streams = streams or tokens.streams
    if streams is None:
        return token_streams(pair.tokenizer), True
    return streams, False


def _acceptance_groups(prompts: PromptFile | None) -> int:
    """The (domain, band) groups the acceptance pass decodes."""
    if prompts is not None:
        return len(prompts.domains) * len(prompts.bands)
    return len(DOMAINS) * len(SAMPLING_CONFIGS)


def _accepted_fields(
    pair, streams, prompts: PromptFile | None, tokens, bar, source: Profile | None, *, seed, **kw
) -> dict:
    """The profile's :data:`ACCEPTANCE_FIELDS`: taken from ``source`` where one is given, else
    measured, counted on ``bar``, on the prompts file's prompts (``tokens``: their token ids)
    or on the held-out corpus's ``streams``."""
    if source is not None:
        return {name: getattr(source, name) for name in ACCEPTANCE_FIELDS}
    bar.set_postfix_str("acceptance")
    kw.update(rng=np.random.default_rng(seed), progress=bar.update)
    if prompts is not None:
        counts, steps = prompt_acceptance(pair, prompts, tokens.ids, **kw)
    else:
        counts, steps = corpus_acceptance(pair, streams, domains=DOMAINS, **kw)
    return acceptance_fields(counts, steps)


def _source_record(source: Profile, file: str) -> dict:
    """What a profile that took its acceptance from ``source`` records of it."""
    return {
        "file": file,
        "created": source.meta.get("created"),
        "device": source.fingerprint.get("device"),
    }


def _prompts_meta(prompts: PromptFile, tokens) -> dict:
    """What a profile measured on a prompts file records of it (see the module docstring)."""
    meta = {
        "prompts": prompts.record(),
        "prompt_lengths_dist": asdict(fitted_lengths([len(t) for t in tokens.ids])),
    }
    outputs = file_output_lengths(prompts)
    if outputs is not None:
        meta["output_lengths_dist"] = asdict(outputs)
    meta["prompt_counts"] = {
        d: {b: sum(p.domain == d and p.band == b for p in prompts.prompts) for b in prompts.bands}
        for d in prompts.domains
    }
    return meta


def _check_positions(
    pair,
    *,
    batch_sizes: Sequence[int],
    contexts: Sequence[int],
    k_max: int,
    reps: int,
    acceptance_tokens: int | None,
    prompts: PromptFile | None = None,
    tokens=None,
) -> None:
    """Refuse, before anything is timed, a run that needs more positions than the pair has
    (:func:`~specrl.engine.position_limit`): the largest timing cell, the single admissions, and the
    acceptance pass at its longest prompt and output (a prompts file's line without
    ``max_new_tokens`` may draw the presets' longest output)."""
    limit = position_limit(pair.target, pair.draft)
    if limit is None:
        return
    positions, has = limit.positions, limit.has
    # The shortest context's large cells step each K>0 more often a round (round_repeats).
    shortest, longest, batch = min(contexts), max(contexts), max(batch_sizes)
    cell_extra = cell_new_tokens(
        k_max, reps, round_repeats(batch, longest, shortest, LARGE_BATCH_REPEATS)
    )
    short_extra = cell_new_tokens(
        k_max, reps, round_repeats(batch, shortest, shortest, LARGE_BATCH_REPEATS)
    )
    needed = max(longest + cell_extra, shortest + short_extra)
    if needed > positions:
        raise SpecrlError(
            f"a profile run needs {needed} positions (prompt + output) "
            f"but {has}: use shorter --contexts (at most {positions - cell_extra} "
            f"at --k-max {k_max} --reps {reps}), or a lower --k-max or --reps"
        )
    longest_output = acceptance_tokens or DEFAULT_OUTPUT_LENGTHS.hi
    if prompts is None:
        needed = DEFAULT_PROMPT_LENGTHS.hi + longest_output
        if needed > positions:
            raise SpecrlError(
                f"measuring acceptance on the held-out corpus needs {needed} positions "
                f"(prompts up to {DEFAULT_PROMPT_LENGTHS.hi} tokens, outputs up to "
                f"{longest_output}) but {has}: measure on your own prompts "
                "(--prompts, with max_new_tokens on each line)"
            )
        return
    for p, ids in zip(prompts.prompts, tokens.ids):
        n_out = p.max_new_tokens or longest_output
        needed = len(ids) + n_out
        if needed > positions:
            given = (
                f"max_new_tokens {n_out}"
                if p.max_new_tokens
                else f"no max_new_tokens (outputs up to {n_out} tokens are drawn)"
            )
            raise SpecrlError(
                f"{prompts.path}, line {p.line}: the prompt ({len(ids)} tokens) with "
                f"{given} needs {needed} positions, and {has}; shorten the "
                "prompt or give a lower max_new_tokens"
            )


def check_acceptance_source(
    source: Profile,
    fingerprint: dict,
    *,
    k_max: int,
    prompts: PromptFile | None,
    acceptance_rows: int,
    acceptance_tokens: int | None,
    where: str = "acceptance_from",
) -> None:
    """Refuse ``source`` as the acceptance of a profile of the pair with ``fingerprint``
    unless it was measured as that profile would measure it: the same target and draft
    weights, ``k_max``, kind of device (a GPU's fp16 numerics are not a CPU's), on the
    held-out corpus, with the same ``acceptance_rows`` and ``acceptance_tokens``."""
    theirs = source.fingerprint
    other = other_weights(theirs, fingerprint)
    if other:
        raise SpecrlError(
            f"{where}: measured on another {' and '.join(other)} (target "
            f"{theirs.get('target_id')}, draft {theirs.get('draft_id')}, whose weights differ "
            "from this pair's); acceptance belongs to the pair: measure it (leave "
            "--acceptance-from out)"
        )
    kind = str(theirs.get("device", "")).split(":")[0]
    here = fingerprint["device"].split(":")[0]
    wanted = {
        "k_max": (source.k_max, k_max),
        "device kind": (kind, here),
        "prompts file (sha256)": (
            (source.meta.get("prompts") or {}).get("sha256"),
            prompts and prompts.sha256,
        ),
        "acceptance_rows": (source.meta.get("acceptance_rows"), acceptance_rows),
        "acceptance_tokens": (source.meta.get("acceptance_tokens"), acceptance_tokens),
    }
    for name, (got, want) in wanted.items():
        if got != want:
            raise SpecrlError(
                f"{where}: its {name} is {got!r}, this profile's is {want!r}; only acceptance "
                "measured as this profile would measure it can stand in: measure it (leave "
                "--acceptance-from out)"
            )


def acceptance_fields(counts: dict, request_steps: dict) -> dict:
    """The profile's :data:`ACCEPTANCE_FIELDS` from the acceptance pass: per-position
    ``counts`` and every request's steps, per domain and band."""
    acceptance = {
        d: {
            band: conditional_rates(c["accepted_per_position"], c["drafted_per_position"])
            for band, c in by_band.items()
        }
        for d, by_band in counts.items()
    }
    by_output = {
        "edges": list(OUTPUT_EDGES),
        "rates": {
            d: {band: bucket_rates(c) for band, c in by_band.items()}
            for d, by_band in counts.items()
        },
    }
    levels = {
        d: {
            band: level_quantiles(
                request_offsets(request_steps[d][band], by_output["rates"][d][band])
            )
            for band in by_band
        }
        for d, by_band in counts.items()
    }
    drift = {
        d: {
            band: fit_level_drift(
                request_steps[d][band],
                by_output["rates"][d][band],
                levels[d][band],
                by_output["edges"],
            )
            for band in by_band
        }
        for d, by_band in counts.items()
    }
    return {
        "acceptance": acceptance,
        "acceptance_by_output": by_output,
        "acceptance_counts": counts,
        "request_levels": levels,
        "level_drift": drift,
    }


def format_table(profile: Profile) -> str:
    """Measured tokens/s by batch size (rows) and K (columns), as a Markdown table."""
    ks = range(profile.k_max + 1)
    head = "| batch | " + " | ".join("off" if k == 0 else f"K={k}" for k in ks) + " |"
    lines = [head, "|" + "---|" * (profile.k_max + 2)]
    for b, row in zip(profile.batch_sizes, profile.tokens_per_s, strict=True):
        best = int(np.argmax(row))
        cells = [f"**{v:.0f}**" if k == best else f"{v:.0f}" for k, v in enumerate(row)]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
