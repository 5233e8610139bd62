"""One model's forwards over the running batch's ragged rows, through its runner and its cache.

Rows have their own lengths. A forward takes them as one ``[B, P]`` block: a short row is
filled with a real token of its own (never a pad id) at a position of its own, and the
fillers' cache writes go to the trash slot (:class:`~specrl.engine.kv.SlotKVCache`), so no
row ever reads them.
"""

from __future__ import annotations

import torch

from specrl.engine.kv import SlotKVCache
from specrl.engine.runner import make_runner


class CachedModel:
    """A model's runner (:func:`~specrl.engine.runner.make_runner`) and its slot KV cache,
    sized ``max_batch`` rows of ``max_len`` positions."""

    def __init__(self, model, *, runner: str, max_batch: int, max_len: int, device: torch.device):
        self.run = make_runner(model, runner)
        self.cache = SlotKVCache(
            model.config,
            max_batch=max_batch,
            max_len=max_len,
            device=device,
            dtype=next(model.parameters()).dtype,
        )
        self.max_len = max_len
        self.device = device

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, P] long
        starts: torch.Tensor,  # [B] long: position of each row's first input token
        n_real: torch.Tensor | None,  # [B] long: real tokens per row (None: every column)
        rows: slice | torch.Tensor | None = None,  # slots; default: the running batch
        logits_to_keep: int = 0,
        right_aligned: bool = False,
    ) -> torch.Tensor:  # [B, P, V] (or the last logits_to_keep columns)
        """One forward over ragged rows. Left-aligned (default): filler columns follow the
        real tokens and repeat the row's last real position. Right-aligned (:func:`ragged`
        with ``right=True``): fillers come first at the row's first position, so the last
        column is every row's last real token. Fillers' writes go to the trash slot."""
        width = input_ids.shape[1]
        if n_real is None:  # every column is a real token: no fillers
            positions, real = starts.unsqueeze(1), None
            if width > 1:
                positions = positions + torch.arange(width, device=self.device)
        elif right_aligned:
            cols = torch.arange(width, device=self.device).unsqueeze(0)
            pad = (width - n_real).unsqueeze(1)
            positions = starts.unsqueeze(1) + (cols - pad).clamp(min=0)
            real = cols >= pad
        else:
            cols = torch.arange(width, device=self.device).unsqueeze(0)
            last_col = (n_real - 1).clamp(min=0).unsqueeze(1)
            positions = starts.unsqueeze(1) + torch.minimum(cols, last_col)
            real = cols < n_real.unsqueeze(1)
        rows = slice(0, input_ids.shape[0]) if rows is None else rows
        mask = self.cache.prepare(rows, positions, real, self.run.dtype)
        if self.cache.past_end:
            # Columns at or past max_len (a verify block near the end of a row) are drafts
            # that k_eff never accepts; the cache sends them to the trash slot. A model with
            # learned positions (GPT-2's wpe) has no row for them, so it reads max_len - 1.
            positions = positions.clamp(max=self.max_len - 1)
        return self.run(input_ids, positions, mask, self.cache, logits_to_keep)


def ragged(
    seqs: list[list[int]], rows: list, device: torch.device, *, right: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:  # ids [B, P] long, lengths [B] long
    """Token ids ``[B, P]``, left-aligned (or right-aligned), and each row's length. Short
    rows are filled with a real token of their own: the last one given, the first when
    right-aligned, or, for a row given none, the last one its request (``rows``) committed."""
    width = max(1, max(len(s) for s in seqs))
    if right:
        ids = [[s[0]] * (width - len(s)) + s for s in seqs]
    else:
        ids = [s + [s[-1] if s else r.tokens[-1]] * (width - len(s)) for s, r in zip(seqs, rows)]
    lengths = torch.tensor([len(s) for s in seqs], device=device)
    return torch.tensor(ids, device=device), lengths
