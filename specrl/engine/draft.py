"""The draft phase of a step: the draft catches up on what it has not read, then proposes K.

Per row, the draft cache holds positions ``0 .. draft_len-1`` with ``draft_len <= seq_len``.
With K = 0 the draft does not run at all and its ``draft_len`` falls behind; the next step
with K > 0 first feeds it the committed tokens it missed (a new prompt, or everything
committed while K was 0) in one forward, then proposes K tokens per row, one forward each.
"""

from __future__ import annotations

import torch

from specrl.engine.batch import EngineRequest
from specrl.engine.forward import CachedModel, ragged
from specrl.engine.sampling import sample_inverse_cdf, token_probs


class Drafter:
    """The draft model of a pair whose target has ``vocab_size`` ids. ``draft_vocab``: the
    draft's own vocab size where it differs (``vocab_padding``), else None."""

    def __init__(self, model: CachedModel, *, vocab_size: int, draft_vocab: int | None):
        self.model = model
        self.vocab_size = vocab_size
        self.draft_vocab = draft_vocab

    def catch_up(self, running: list[EngineRequest]) -> tuple[int, int]:
        """Feed the draft the committed tokens it missed, leaving one unread token per row.
        Returns the tokens read and the forward's padded size (rows x widest row)."""
        behind = [b for b, r in enumerate(running) if r.seq_len - r.draft_len > 2]
        if not behind:
            return 0, 0
        lagging = [running[b] for b in behind]
        seqs = [r.tokens[r.draft_len : -1] for r in lagging]
        ids, lengths = ragged(seqs, lagging, self.model.device)
        starts = torch.tensor([r.draft_len for r in lagging], device=self.model.device)
        if behind == list(range(behind[0], behind[-1] + 1)):
            slots = slice(behind[0], behind[-1] + 1)
        else:
            slots = torch.tensor(behind, device=self.model.device)
        self.model.forward(
            self._read_ids(ids), starts, n_real=lengths, rows=slots, logits_to_keep=1
        )
        for r in lagging:
            r.draft_len = r.seq_len - 1
        return int(lengths.sum()), int(ids.numel())

    def propose(
        self,
        rows: list[EngineRequest],
        k: int,
        uniforms: torch.Tensor | None,  # [B, k] float64: a draw per position; None: greedy batch
        temps: torch.Tensor | None,  # [B] float
        top_ps: torch.Tensor | None,  # [B] float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # tokens [B, k] long, q [B, k, V]
        """Draft k tokens per row (after :meth:`catch_up`): the tokens, and the q each was
        sampled from (None for an all-greedy batch, which takes the argmax)."""
        device = self.model.device
        # Each row now has one or two unread tokens (two after a fully accepted block).
        seqs = [r.tokens[r.draft_len :] for r in rows]
        ids, lengths = ragged(seqs, rows, device)
        starts = torch.tensor([r.draft_len for r in rows], device=device)
        logits = self.model.forward(self._read_ids(ids), starts, n_real=lengths)
        last = self._over_target_vocab(logits[torch.arange(len(rows), device=device), lengths - 1])
        for r in rows:
            r.draft_len = r.seq_len
        seq_lens = torch.tensor([r.seq_len for r in rows], device=device)
        tokens, probs = [], []
        for j in range(k):
            if uniforms is None:
                token = last.argmax(-1)
            else:
                q = token_probs(last, temps, top_ps)  # [B, V]
                token = sample_inverse_cdf(q, uniforms[:, j])
                probs.append(q)
            tokens.append(token)
            if j < k - 1:
                last = self.model.forward(
                    token.unsqueeze(1),  # -inf padding: never an id the draft lacks
                    seq_lens + j,
                    n_real=None,
                )[:, -1]
                last = self._over_target_vocab(last)
        return torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None

    def _read_ids(self, ids: torch.Tensor) -> torch.Tensor:  # [B, P] long
        """With ``vocab_padding``, an id the draft lacks (a padding id the target committed)
        is read as the last id the draft has."""
        if self.draft_vocab is None or self.draft_vocab >= self.vocab_size:
            return ids
        return ids.clamp(max=self.draft_vocab - 1)

    def _over_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V_draft] -> [B, V]
        """With ``vocab_padding``, the draft's logits over the target's ids: cut to them, or
        extended with -inf (exactly zero probability at any temperature; the dtype's lowest
        value is not, in fp16 at a temperature of 1e5) for ids only the target has.
        Verification then sees a q over the target's vocabulary, as p is."""
        if self.draft_vocab is None:
            return logits
        if self.draft_vocab > self.vocab_size:
            return logits[:, : self.vocab_size]
        return torch.nn.functional.pad(
            logits, (0, self.vocab_size - self.draft_vocab), value=float("-inf")
        )
