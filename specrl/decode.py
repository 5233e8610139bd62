"""Speculative decoding of a batch of prompts at one K, on its own: the engine without a
controller, behind ``specrl decode`` (``specrl demo`` is the whole pipeline)."""

from __future__ import annotations

from dataclasses import dataclass

from specrl.engine import SpecEngine


@dataclass
class DecodeResult:
    """What one decode of a batch at one K committed, and how long it took."""

    domain: str
    k: int
    drafted: int
    accepted: int
    committed: int
    row_steps: int
    seconds: float
    k0_tokens_per_s: float

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        return self.committed / self.row_steps if self.row_steps else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.committed / self.seconds if self.seconds else 0.0


def decode(
    pair, prompts: list[list[int]], k: int, *, new_tokens: int, temperature: float
) -> tuple[DecodeResult, list[list[int]]]:
    """Decode ``prompts`` together at ``k`` draft tokens per step (0 = plain decoding): the
    totals, and each prompt's continuation in order."""
    engine = SpecEngine(
        pair.target,
        pair.draft,
        max_batch=len(prompts),
        max_len=max(map(len, prompts)) + new_tokens + 1,
        k_max=max(k, 1),
        vocab_padding=pair.vocab_padding,
    )
    ids = [
        engine.add(p, max_new_tokens=new_tokens, temperature=temperature, seed=i)
        for i, p in enumerate(prompts)
    ]
    result = DecodeResult("", k, 0, 0, 0, 0, 0.0, 0.0)
    outputs = {}
    while engine.has_work:
        stats = engine.step(k)
        result.drafted += stats.drafted
        result.accepted += stats.accepted
        result.committed += stats.committed
        result.row_steps += stats.batch_size
        result.seconds += stats.total_time
        outputs.update({f.request_id: f.token_ids for f in engine.pop_finished()})
    return result, [outputs[i] for i in ids]
