"""Continuous batching: the requests an engine serves, waiting, running and finished.

A request waits in a queue until a slot is free; then the target prefills its whole prompt
and commits its first token from the prefill's last logits (as ``generate`` does, so a
request costs one prefill and ``max_new_tokens - 1`` decode forwards). A request that ends on
that token (EOS, or ``max_new_tokens=1``) leaves before the decode. After each decode its
committed block is appended, cut at EOS and the token budget; finished rows then leave, and
the last live rows move into their slots (cache rows included), so the running batch always
occupies slots ``0 .. B-1`` and every forward works on cache views.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from specrl.engine.forward import CachedModel, ragged
from specrl.engine.kv import SlotKVCache
from specrl.engine.sampling import sample_inverse_cdf, token_probs
from specrl.engine.stats import Finished
from specrl.errors import InvalidRequestError


@dataclass
class EngineRequest:
    """A request inside the engine: its settings, its tokens so far, and its counts."""

    request_id: int
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    eos_token_id: int | None
    generator: torch.Generator | None  # None for greedy rows: they draw no random numbers
    tokens: list[int] = field(default_factory=list)  # prompt + committed
    draft_len: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    finish_reason: str | None = None

    @property
    def seq_len(self) -> int:
        return len(self.tokens)

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)


class Batch:
    """The waiting queue (at most ``max_waiting``), the running batch (at most ``max_batch``
    rows, in slots ``0 .. B-1``) and the requests finished since the last
    :meth:`pop_finished`. ``seed`` seeds the generators of sampled requests added without a
    seed."""

    def __init__(self, *, max_batch: int, max_len: int, max_waiting: int, seed: int):
        self.max_batch, self.max_len, self.max_waiting = max_batch, max_len, max_waiting
        self.running: list[EngineRequest] = []
        self.waiting: deque[EngineRequest] = deque()
        self.finished: list[Finished] = []
        self._next_id = 0
        self._seed_source = torch.Generator().manual_seed(seed)

    def add(
        self,
        prompt: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
        eos_token_id: int | None,
    ) -> int:
        """Queue a checked request (:func:`~specrl.engine.checks.check_request`); returns its
        id. A sampled request gets a generator of its own, so its tokens do not depend on
        which other rows share its batch."""
        if len(self.waiting) >= self.max_waiting:
            raise InvalidRequestError(
                f"the queue is full ({self.max_waiting} waiting requests); step the engine "
                "until requests finish, or create it with a larger max_waiting"
            )
        generator = None
        if temperature > 0:
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
            generator = torch.Generator().manual_seed(seed)
        request = EngineRequest(
            request_id=self._next_id,
            prompt=prompt,
            max_new_tokens=max_new_tokens,
            temperature=float(temperature),
            top_p=float(top_p),
            eos_token_id=eos_token_id,
            generator=generator,
            tokens=list(prompt),
        )
        self._next_id += 1
        self.waiting.append(request)
        return request.request_id

    def admit(self) -> tuple[int, list[EngineRequest]]:
        """Move the waiting requests that fit into the free slots; returns the first slot they
        take, and them."""
        free = self.max_batch - len(self.running)
        new = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        first = len(self.running)
        self.running.extend(new)
        return first, new

    def start(self, new: list[EngineRequest], tokens: list[int]) -> None:
        """Commit each admitted request's first token (``tokens``: from its prefill)."""
        for r, token in zip(new, tokens):
            r.tokens.append(token)
            if token == r.eos_token_id:
                r.finish_reason = "eos"
            elif r.max_new_tokens == 1 or r.seq_len >= self.max_len:
                r.finish_reason = "length"

    def commit(self, k, k_eff, drafts, accepted, next_tokens) -> int:
        """Append each running row's accepted draft tokens (``drafts``: lists, None when K=0)
        and its next token, cut at EOS and the token budget; returns the tokens committed."""
        committed = 0
        for b, r in enumerate(self.running):
            a = accepted[b]
            block = drafts[b][:a] + [next_tokens[b]] if a else [next_tokens[b]]
            block = block[: r.max_new_tokens - r.generated]
            if r.eos_token_id is not None and r.eos_token_id in block:
                block = block[: block.index(r.eos_token_id) + 1]
                r.finish_reason = "eos"
            old_len = r.seq_len
            r.tokens.extend(block)
            committed += len(block)
            r.steps += 1
            r.drafted += k_eff[b]
            r.accepted += a
            if k > 0:
                # The draft read d_1 .. d_{k-1}; those the target accepted stay valid.
                r.draft_len = min(old_len + min(a, k - 1), r.seq_len)
            if r.finish_reason is None and (
                r.generated >= r.max_new_tokens or r.seq_len >= self.max_len
            ):
                r.finish_reason = "length"
        return committed

    def retire(self, target_cache: SlotKVCache, draft_cache: SlotKVCache | None) -> int:
        """Finished rows leave; the last live rows move into their slots, with their rows of
        both caches. Returns how many left."""
        rows = self.running
        done = [b for b, r in enumerate(rows) if r.finish_reason is not None]
        if not done:
            return 0
        for b in done:
            r = rows[b]
            self.finished.append(
                Finished(
                    request_id=r.request_id,
                    token_ids=r.tokens[len(r.prompt) :],
                    prompt_len=len(r.prompt),
                    finish_reason=r.finish_reason,
                    steps=r.steps,
                    drafted=r.drafted,
                    accepted=r.accepted,
                )
            )
        live = len(rows) - len(done)
        holes = [b for b in done if b < live]
        movers = [b for b in range(live, len(rows)) if rows[b].finish_reason is None]
        for hole, src in zip(holes, movers):
            r = rows[src]
            target_cache.move_row(src, hole, r.seq_len)
            if draft_cache is not None:
                draft_cache.move_row(src, hole, r.draft_len)
            rows[hole] = r
        del rows[live:]
        return len(done)

    def pop_finished(self) -> list[Finished]:
        """Requests completed since the last call, in completion order."""
        done, self.finished = self.finished, []
        return done


def prefill(target: CachedModel, new: list[EngineRequest], first: int) -> tuple[list[int], int]:
    """The target's forward over the prompts of ``new``, admitted to slots ``first ..``, and
    each one's first token: the argmax for a greedy request, else sampled with its own
    generator. Returns the tokens and the prompt tokens read."""
    device = target.device
    ids, lengths = ragged([r.prompt for r in new], new, device, right=True)
    logits = target.forward(
        ids,
        starts=torch.zeros_like(lengths),
        n_real=lengths,
        rows=slice(first, first + len(new)),
        logits_to_keep=1,
        right_aligned=True,
    )[:, -1]  # [n, V]: each prompt's last position
    if all(r.generator is None for r in new):
        tokens = logits.argmax(-1)
    else:
        uniforms = torch.tensor(
            [
                float(torch.rand(1, generator=r.generator, dtype=torch.float64))
                if r.generator is not None
                else 0.0
                for r in new
            ],
            dtype=torch.float64,
            device=device,
        )
        temps = torch.tensor([r.temperature for r in new], device=device)
        top_ps = torch.tensor([r.top_p for r in new], device=device)
        tokens = sample_inverse_cdf(token_probs(logits, temps, top_ps), uniforms)
    return tokens.tolist(), int(lengths.sum())


def step_uniforms(rows: list[EngineRequest], k: int, k_eff: list[int], device: torch.device):
    """Each sampled row's randomness for one step, drawn from its own generator in one
    call: k_eff uniforms to draft, k_eff to accept, 1 for the recovered/bonus token.

    Returns ``(draft [B, k], accept [B, k], final [B])`` on the device, zeros for greedy
    rows (which draw nothing), or None when every row is greedy.
    """
    if all(r.generator is None for r in rows):
        return None
    draft_u = torch.zeros(len(rows), k, dtype=torch.float64)
    accept_u = torch.zeros(len(rows), k)
    final_u = torch.zeros(len(rows))
    for b, (r, ke) in enumerate(zip(rows, k_eff)):
        if r.generator is None:
            continue
        u = torch.rand(2 * ke + 1, generator=r.generator, dtype=torch.float64)
        draft_u[b, :ke] = u[:ke]
        accept_u[b, :ke] = u[ke : 2 * ke]
        final_u[b] = u[2 * ke]
    return draft_u.to(device), accept_u.to(device), final_u.to(device)
