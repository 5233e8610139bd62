"""What SpecEngine refuses, and why: its settings, its models, a request, a step's K.

Every refusal is an :class:`~specrl.errors.InvalidRequestError` that leaves the engine as it
was. The checks of the models read configs and shapes only, so they run before the models are
moved to the device or put in eval mode.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

from specrl.errors import InvalidRequestError


def is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def vocab_size(model) -> int:
    """Rows of the model's output embedding: the ids it can score."""
    return model.get_output_embeddings().weight.shape[0]


class PositionLimit(NamedTuple):
    """The most positions a pair can run (a request's prompt and output: a verify block's
    lookahead past ``max_len`` never reaches the model's positions), which model sets it,
    and the config setting that does."""

    positions: int
    model: str
    """``"target"`` or ``"draft"``."""
    setting: str = "max_position_embeddings"
    """``"max_position_embeddings"``, or ``"sliding_window"``: SpecEngine's per-row masks let
    a query see its whole row, so past the model's sliding attention window its output would
    no longer be the model's own."""

    def __str__(self) -> str:
        """How a message names it: "the draft's max_position_embeddings (96)"."""
        if self.setting == "sliding_window":
            return (
                f"the {self.model}'s sliding attention window ({self.positions} tokens), "
                "which SpecEngine's per-row masks do not apply"
            )
        return f"the {self.model}'s max_position_embeddings ({self.positions})"

    @property
    def has(self) -> str:
        """The same, as "the draft has 96 (max_position_embeddings)"."""
        if self.setting == "sliding_window":
            return (
                f"the {self.model} attends over a sliding window of {self.positions} tokens "
                "(sliding_window), which SpecEngine's per-row masks do not apply"
            )
        return f"the {self.model} has {self.positions} (max_position_embeddings)"


def _sliding_window(config) -> int | None:
    """The attention window of a model whose layers (any of them) attend over a sliding
    window: Mistral, Starcoder2 and Phi-3 (``sliding_window``), Gemma 2/3, Cohere 2 and Qwen 2
    with ``use_sliding_window`` (``layer_types`` holding ``"sliding_attention"``), GPT-Neo
    (``"local"`` layers, ``window_size``). None when every layer attends over the whole row."""
    if config is None:
        return None
    get_text = getattr(config, "get_text_config", None)
    text = get_text(decoder=True) if callable(get_text) else config
    windows = []
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        slides = "sliding_attention" in layer_types
    else:
        slides = getattr(text, "use_sliding_window", True) is not False
    if slides and is_int(window) and window > 0:
        windows.append(int(window))
    local = getattr(text, "window_size", None)
    if "local" in (getattr(text, "attention_layers", None) or ()) and is_int(local):
        windows.append(int(local))
    return min(windows) if windows else None


def _builds_alibi_from_mask(config) -> bool:
    """BLOOM, and Falcon with ``alibi``: their forward builds ALiBi biases from a 2D
    attention mask and fails on a 4D one. (MPT builds its ALiBi from positions and runs.)"""
    model_type = getattr(config, "model_type", None)
    return model_type == "bloom" or (model_type == "falcon" and bool(getattr(config, "alibi", 0)))


def position_limit(target, draft=None) -> PositionLimit | None:
    """The fewest positions the pair can run, which model sets it and how: its
    ``max_position_embeddings``, or a sliding attention window shorter than that (see
    :class:`PositionLimit`); None when neither config says. A request's prompt and output
    must fit."""
    limits = []
    for name, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        config = getattr(model, "config", None)
        positions = getattr(config, "max_position_embeddings", None)
        if isinstance(positions, int):
            limits.append(PositionLimit(positions, name))
        window = _sliding_window(config)
        if window is not None:
            limits.append(PositionLimit(window, name, "sliding_window"))
    return min(limits, key=lambda limit: limit.positions) if limits else None


def check_sizes(*, max_batch, max_len, k_max, max_waiting) -> None:
    """Refuse an engine size that is not an integer at or above its least."""
    for name, value, low in (
        ("max_batch", max_batch, 1),
        ("max_len", max_len, 2),
        ("k_max", k_max, 0),
        ("max_waiting", max_waiting, 0),
    ):
        if not is_int(value) or value < low:
            raise InvalidRequestError(f"{name} must be an integer >= {low}, got {value!r}")


def check_models(target, draft, *, max_len: int, vocab_padding: bool) -> int | None:
    """Refuse a pair SpecEngine cannot run exactly: an architecture or attention backend
    that ignores its per-row 4D masks, a ``max_len`` past the pair's positions, or vocab
    sizes that differ without ``vocab_padding``. Returns the draft's vocab size where it
    differs from the target's (else None)."""
    target_vocab = vocab_size(target)
    for name, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        if _builds_alibi_from_mask(model.config):
            raise InvalidRequestError(
                f"{name} is a {model.config.model_type} model with ALiBi, whose position "
                "bias transformers builds from a 2D attention mask; SpecEngine passes "
                "per-row 4D masks, so this architecture is not supported"
            )
        impl = model.config._attn_implementation
        if impl not in ("sdpa", "eager"):
            raise InvalidRequestError(
                f"{name} uses attention '{impl}'; SpecEngine passes per-row 4D masks, "
                "load the model with attn_implementation='sdpa' or 'eager'"
            )
    limit = position_limit(target, draft)
    if limit is not None and max_len > limit.positions:
        raise InvalidRequestError(f"max_len={max_len} exceeds {limit}; lower max_len")
    if not isinstance(vocab_padding, bool):
        raise InvalidRequestError(f"vocab_padding must be True or False, got {vocab_padding!r}")
    if draft is None or vocab_size(draft) == target_vocab:
        return None
    if not vocab_padding:
        raise InvalidRequestError(
            f"draft vocabulary ({vocab_size(draft)}) differs from the target's "
            f"({target_vocab}); use a draft trained with the target's tokenizer, or "
            "vocab_padding=True for one tokenizer padded to two sizes"
        )
    return vocab_size(draft)


def check_prompt(prompt_ids, *, max_len: int, vocab: int) -> list[int]:
    """The prompt's token ids as a list of ints: 1-D, non-empty, shorter than ``max_len`` and
    within the vocabulary (``vocab`` ids)."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1:
            raise InvalidRequestError(
                f"prompt_ids must be 1-D (one request), got shape {tuple(prompt_ids.shape)}"
            )
        prompt_ids = prompt_ids.tolist()
    try:
        prompt = list(prompt_ids)
    except TypeError as err:
        raise InvalidRequestError(f"prompt_ids must be a sequence of token ids: {err}") from None
    not_ids = [t for t in prompt if not is_int(t)]
    if not_ids:
        raise InvalidRequestError(
            f"prompt_ids must be integer token ids; got {not_ids[0]!r} "
            f"({type(not_ids[0]).__name__})"
        )
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise InvalidRequestError("prompt_ids is empty; a request needs at least one token")
    if len(prompt) >= max_len:
        raise InvalidRequestError(
            f"prompt has {len(prompt)} tokens but max_len is {max_len}; shorten the "
            "prompt or create the engine with a larger max_len"
        )
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(
            f"prompt_ids contains {bad[0]}, outside the vocabulary [0, {vocab})"
        )
    return prompt


def check_request(*, max_new_tokens, temperature, top_p, seed, eos_token_id, vocab: int) -> None:
    """Refuse a request's settings: a token budget below 1, a negative or non-finite
    temperature, a top-p outside (0, 1], a seed that is not an integer, an EOS id outside the
    vocabulary (``vocab`` ids)."""
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise InvalidRequestError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if (
        not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise InvalidRequestError(
            f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
        )
    if not isinstance(top_p, (int, float)) or not (0 < top_p <= 1):
        raise InvalidRequestError(f"top_p must be in (0, 1], got {top_p!r}")
    if seed is not None and not is_int(seed):
        raise InvalidRequestError(f"seed must be an integer or None, got {seed!r}")
    if eos_token_id is not None and not (is_int(eos_token_id) and 0 <= eos_token_id < vocab):
        raise InvalidRequestError(
            f"eos_token_id must be a token id in [0, {vocab}) or None, got {eos_token_id!r}"
        )


def check_k(k, *, k_max: int, has_draft: bool) -> int:
    """A step's K as an int (numpy integers, a policy's action, are welcome): 0..k_max, and
    0 without a draft model."""
    if not is_int(k) or not 0 <= k <= k_max:
        raise InvalidRequestError(f"k must be an integer in 0..{k_max} (k_max), got {k!r}")
    if k > 0 and not has_draft:
        raise InvalidRequestError("k > 0 needs a draft model; this engine was built without one")
    return int(k)
