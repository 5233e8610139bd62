"""What the engine reports: one ``StepStats`` per step, one ``Finished`` per completed request.

Terms (as in vLLM's spec-decode docs):

* **drafted**: draft tokens proposed that could have been accepted (K per row, less where a
  row is clamped by ``max_len`` or its token budget).
* **accepted**: draft tokens the target agreed with (greedy: equal to its argmax; sampling:
  passed the rejection test).
* **recovered**: the target's own token at the first rejected position.
* **bonus**: the target's extra token when every draft token of a row was accepted.
* **committed** = accepted + recovered + bonus, less what an EOS or the token budget cut off.

Mean accepted length (tokens per row per step) = committed / row-steps, includes the bonus.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    """One engine step for the whole running batch. Times are seconds, device-synchronized."""

    batch_size: int
    """Rows decoded in this step (after admitting waiting requests)."""
    k: int
    """K requested for the step (0 = plain decode, the draft does not run)."""
    drafted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    """``accepted_per_position[i]``: rows whose draft token ``i`` (0-based) was accepted."""
    drafted_per_position: list[int] = field(default_factory=list)
    """``drafted_per_position[i]``: rows that proposed a draft token at position ``i``."""
    committed: int = 0
    """Tokens committed in this step, the first token of each admitted request included."""
    prefill_tokens: int = 0
    """Prompt tokens the target processed for requests admitted in this step."""
    catchup_tokens: int = 0
    """Committed tokens the draft read to catch up after steps with K=0 (and new prompts)."""
    catchup_padded_tokens: int = 0
    """Size of the catch-up forward: rows caught up x the widest of them (what it costs)."""
    prefill_time: float = 0.0
    draft_time: float = 0.0
    """Draft forwards, catch-up included."""
    catchup_time: float = 0.0
    """The part of ``draft_time`` spent reading ``catchup_tokens``."""
    verify_time: float = 0.0
    """The target forward over the last committed token plus the K draft tokens."""
    total_time: float = 0.0
    mean_context: float = 0.0
    """Mean tokens per row (prompt + committed) at the start of the decode."""
    max_context: int = 0
    admitted: int = 0
    finished: int = 0
    row_request_ids: list[int] = field(default_factory=list)
    """Per decoded row (batch order): the request's id."""
    row_generated: list[int] = field(default_factory=list)
    """Per decoded row (batch order): tokens it had generated before this step's decode."""
    row_drafted: list[int] = field(default_factory=list)
    """Per decoded row: draft tokens it proposed (K, clamped near its budget or ``max_len``)."""
    row_accepted: list[int] = field(default_factory=list)
    """Per decoded row: leading draft tokens the target accepted."""

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted; NaN when nothing was drafted (K=0)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.committed / self.total_time if self.total_time > 0 else 0.0


@dataclass
class Finished:
    """A completed request."""

    request_id: int
    token_ids: list[int]
    """Generated tokens only (no prompt), ending with EOS when ``finish_reason == "eos"``."""
    prompt_len: int
    finish_reason: str
    """``"eos"`` or ``"length"`` (``max_new_tokens`` or ``max_len`` reached)."""
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
