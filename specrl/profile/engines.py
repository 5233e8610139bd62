"""The engines a profile run measures with, and the prompts it feeds them.

Both the timing cells (:mod:`specrl.profile.timing`) and the acceptance pass
(:mod:`specrl.profile.acceptance`) build their engines and cut their prompts here, so that
both size an engine, and read a domain's token stream, the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specrl.engine import SpecEngine, position_limit
from specrl.errors import SpecrlError
from specrl.workload.trace import stream_window


def build_engine(pair, *, max_batch: int, max_len: int, k_max: int, device: str) -> SpecEngine:
    """A :class:`~specrl.engine.SpecEngine` over ``pair``'s target and draft."""
    return SpecEngine(
        pair.target,
        pair.draft,
        max_batch=max_batch,
        max_len=max_len,
        k_max=k_max,
        device=device,
        vocab_padding=pair.vocab_padding,
    )


def engine_max_len(pair, needed: int, room: int) -> int:
    """The ``max_len`` of an engine whose requests need up to ``needed`` positions (prompt
    and output): ``room`` more where the pair has them, else as many as it has. The profile's
    engines have always been sized with that room, so a pair of many positions measures as
    before; without it nothing changes but the cache's width, since the engine stops a
    request's K at its token budget before its ``max_len``."""
    limit = position_limit(pair.target, pair.draft)
    if limit is None:
        return needed + room
    if needed > limit.positions:
        raise SpecrlError(
            f"a profile run needs {needed} positions (prompt + output) but {limit.has}: "
            "use shorter --contexts, or shorter prompts or max_new_tokens in --prompts"
        )
    return min(needed + room, limit.positions)


def cut_prompts(streams, lengths: Sequence[int], rng: np.random.Generator, domains) -> list:
    """One prompt per entry of ``lengths``, cut at a random start of its domain's stream
    (repeated when shorter, as a prompts file's stream may be); the rows rotate through
    ``domains``."""
    out = []
    for i, length in enumerate(lengths):
        length = int(length)
        stream = streams[domains[i % len(domains)]]
        start = int(rng.integers(0, max(1, len(stream) - length)))
        out.append(stream_window(stream, start, length))
    return out
