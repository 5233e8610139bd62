"""A preallocated, per-slot KV cache that Hugging Face decoder models write into in place.

Each batch slot holds one request. Rows have their own lengths: a forward writes each new key
and value at that row's own positions, and the 4D attention mask (built here too) lets each
query see only its row's valid prefix. Rolling a row back after rejected draft tokens is
therefore free: the engine lowers the row's valid length and the stale entries stay masked
until they are overwritten. Nothing is copied per step; transformers' ``DynamicCache`` copies
the whole cache on every call.

Slot ``capacity - 1`` is a trash slot: writes that fall past ``max_len`` (draft tokens that
can never be accepted, filler columns of ragged inputs) land there and are never read by a
real query.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


def _kv_shape(config) -> tuple[int, int, int]:
    text = config.get_text_config(decoder=True)
    n_layers = text.num_hidden_layers
    n_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return n_layers, n_kv_heads, head_dim


class SlotKVCache(Cache):
    """KV buffers ``[max_batch, kv_heads, capacity, head_dim]`` per layer, written in place.

    Call :meth:`prepare` before each forward to say which rows run, where each new token is
    written, and which cached positions each query may see; the model's attention layers then
    call :meth:`update`.
    """

    def __init__(self, config, *, max_batch: int, max_len: int, device, dtype):
        super().__init__(layers=[])
        n_layers, n_kv_heads, head_dim = _kv_shape(config)
        self.max_len = max_len
        self.capacity = max_len + 1
        self.trash_slot = max_len
        shape = (max_batch, n_kv_heads, self.capacity, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self._rows: slice | torch.Tensor = slice(0, 0)
        self._row_index: torch.Tensor | None = None
        self._row_indices: dict[tuple[int, int], torch.Tensor] = {}
        self._key_positions = torch.arange(self.capacity, device=device)
        self._span: slice | None = None
        self._mask_values: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self._write_pos: torch.Tensor | None = None
        self._kv_len = 0
        self.past_end = False

    def prepare(
        self,
        rows: slice | torch.Tensor,  # a slice of slots (views, no copy) or [B] slot indices
        positions: torch.Tensor,  # [B, Q] long: sequence position of each input token
        real: torch.Tensor | None,  # [B, Q] bool: which columns are real (None: all)
        dtype: torch.dtype,
    ) -> torch.Tensor:  # [B, 1, Q, kv_len] additive attention mask
        """Set up the next forward and return the attention mask it must be given.

        A real column of row ``b`` is written at ``positions[b, j]`` and sees cached positions
        ``<= positions[b, j]``. Filler columns (ragged inputs) and positions at or past
        ``max_len`` are written to the trash slot; :attr:`past_end` says whether this
        forward has any (the caller clamps the positions it gives a model with a position
        table, whose lookup stops at ``max_position_embeddings``).
        """
        batch, width = positions.shape
        last = int(positions.max())
        self.past_end = last >= self.max_len
        if self.past_end:
            real = positions < self.max_len if real is None else real & (positions < self.max_len)
        self._write_pos = (
            positions if real is None else torch.where(real, positions, self.trash_slot)
        )
        # Every row of a slot slice writing the same contiguous positions (batch 1,
        # equal-length rows): update() does one strided copy instead of a scatter.
        self._span = None
        if isinstance(rows, slice):
            first = self._write_pos[0]
            start = int(first[0])
            if bool((self._write_pos == first).all()) and (
                width == 1
                or (
                    start + width <= self.capacity
                    and bool((first == self._key_positions[start : start + width]).all())
                )
            ):
                self._span = slice(start, start + width)
        if (batch, width) not in self._row_indices:
            self._row_indices[batch, width] = (
                torch.arange(batch, device=positions.device).unsqueeze(1).expand(-1, width)
            )
        self._row_index = self._row_indices[batch, width]
        self._rows = rows
        self._kv_len = min(last + 1, self.capacity)
        keys = self._key_positions[: self._kv_len]
        visible = keys.view(1, 1, -1) <= positions.unsqueeze(-1)  # [B, Q, kv_len]
        if dtype not in self._mask_values:
            self._mask_values[dtype] = (
                torch.zeros((), dtype=dtype, device=positions.device),
                torch.full((), torch.finfo(dtype).min, dtype=dtype, device=positions.device),
            )
        mask = torch.where(visible, *self._mask_values[dtype])
        return mask.unsqueeze(1)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # key_states: [B, kv_heads, Q, head_dim] for the rows given to prepare()
        if isinstance(self._rows, slice):
            keys = self.keys[layer_idx][self._rows]
            values = self.values[layer_idx][self._rows]
            if self._span is not None:
                keys[:, :, self._span].copy_(key_states)
                values[:, :, self._span].copy_(value_states)
            else:
                keys[self._row_index, :, self._write_pos] = key_states.transpose(1, 2).to(
                    keys.dtype
                )
                values[self._row_index, :, self._write_pos] = value_states.transpose(1, 2).to(
                    values.dtype
                )
            return keys[:, :, : self._kv_len], values[:, :, : self._kv_len]
        slots = self._rows.unsqueeze(1).expand_as(self._write_pos)
        base_k, base_v = self.keys[layer_idx], self.values[layer_idx]
        base_k[slots, :, self._write_pos] = key_states.transpose(1, 2).to(base_k.dtype)
        base_v[slots, :, self._write_pos] = value_states.transpose(1, 2).to(base_v.dtype)
        # Slots that are not contiguous are gathered: only the catch-up path asks for that.
        kv_len = self._kv_len
        return (
            base_k[:, :, :kv_len].index_select(0, self._rows),
            base_v[:, :, :kv_len].index_select(0, self._rows),
        )

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst``."""
        for buf in (*self.keys, *self.values):
            buf[dst, :, :length] = buf[src, :, :length]
