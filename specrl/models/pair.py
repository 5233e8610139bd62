"""Load a draft/target pair: any two Hugging Face causal LMs that share a vocabulary."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specrl.device import require_device
from specrl.errors import SpecrlError


@dataclass
class ModelPair:
    """A target, its draft and their shared tokenizer; both models in eval mode."""

    target: Any  # transformers PreTrainedModel
    draft: Any
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    target_path: str
    draft_path: str
    preset: str | None = None
    """The default pair's preset (:func:`load_default_pair`); None for a pair given by path."""
    vocab_padding: bool = False
    """The two models pad one tokenizer to different vocab sizes (Qwen2.5 0.5B-3B against 7B
    and larger); engines built for the pair pass it to :class:`~specrl.engine.SpecEngine`."""


def load_pair(
    target: str | os.PathLike,
    draft: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> ModelPair:
    """Load ``target`` and ``draft`` (Hub ids or local directories) with ``from_pretrained``.

    ``device`` is checked first (:func:`~specrl.device.require_device`) and the vocabularies
    are compared from the configs before any weights load, so either mistake fails fast.
    Vocab sizes that differ are accepted only where the two tokenizers are the same and fit
    both sizes (one tokenizer padded to two sizes): ``ModelPair.vocab_padding``.
    ``dtype=None`` means float32 on CPU (fp16 matmuls are slow there) and the
    checkpoint's own dtype elsewhere. The tokenizer is the target's.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    require_device(device)
    target, draft = str(target), str(draft)
    target_config = _load_config(AutoConfig, target, "target")
    draft_config = _load_config(AutoConfig, draft, "draft")
    target_vocab = getattr(target_config, "vocab_size", None)
    draft_vocab = getattr(draft_config, "vocab_size", None)
    tokenizer = load_tokenizer(target)  # small, and read before any weights
    if len(tokenizer) > target_vocab:
        raise SpecrlError(
            f"the tokenizer of {target} has {len(tokenizer)} tokens but the model's vocab size "
            f"is {target_vocab}; use the tokenizer that came with the model"
        )
    vocab_padding = target_vocab != draft_vocab
    if vocab_padding and not _one_tokenizer_padded(tokenizer, draft, target_vocab, draft_vocab):
        raise SpecrlError(
            f"draft and target must share a vocabulary: target {target} has vocab size "
            f"{target_vocab}, draft {draft} has {draft_vocab}, and their tokenizers are not one "
            "tokenizer that fits both (a family padding one tokenizer to two sizes, as "
            "Qwen2.5 does, is accepted); pick a draft from the same family"
        )
    if dtype is None:
        dtype = torch.float32 if torch.device(device).type == "cpu" else "auto"
    models = []
    for role, path in (("target", target), ("draft", draft)):
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError, RuntimeError) as err:
            raise SpecrlError(
                f"could not load the {role} model from {path}: {_first_line(err)}; "
                "rebuild it (specrl models build) or check the path"
            ) from None
        models.append(model.to(device).eval())
    return ModelPair(models[0], models[1], tokenizer, target, draft, vocab_padding=vocab_padding)


def _one_tokenizer_padded(target_tokens, draft: str, target_vocab, draft_vocab) -> bool:
    """The draft's tokenizer loads, maps every token to the target's id, and the tokenizer
    fits the draft's vocab size (``load_pair`` has checked the target's)."""
    if not all(isinstance(v, int) for v in (target_vocab, draft_vocab)):
        return False
    try:
        draft_tokens = load_tokenizer(draft)
    except SpecrlError:
        return False
    return (
        target_tokens.get_vocab() == draft_tokens.get_vocab() and len(target_tokens) <= draft_vocab
    )


def load_tokenizer(path: str | os.PathLike):
    """``AutoTokenizer.from_pretrained(path)`` (a Hub id or a local directory), with a
    one-line error naming the path."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise SpecrlError(
            f"could not load the tokenizer from {path}: {_first_line(err)}; "
            "rebuild it (specrl models build) or check the path"
        ) from None


def load_default_pair(
    preset: str = "small",
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> ModelPair:
    """The offline stdlib pair (built or taken from the shipped weights on first use)."""
    from specrl.models.build import build_pair

    require_device(device)
    paths = build_pair(preset)
    pair = load_pair(paths.target_path, paths.draft_path, device=device, dtype=dtype)
    pair.preset = preset
    return pair


def _load_config(auto_config, path: str, role: str):
    local = Path(path).expanduser()
    if not local.exists() and (local.is_absolute() or path.startswith((".", "~"))):
        raise SpecrlError(
            f"{role} directory {path} does not exist; build it (specrl models build) "
            "or give a Hugging Face model id"
        )
    if local.exists() and not (local / "config.json").is_file():
        raise SpecrlError(
            f"{role} directory {path} has no config.json (missing or half-written); "
            "rebuild it (specrl models build) or point to a directory saved with save_pretrained"
        )
    try:
        return auto_config.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise SpecrlError(
            f"could not read the {role} config from {path}: {_first_line(err)}; "
            "check the model id or directory"
        ) from None


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
