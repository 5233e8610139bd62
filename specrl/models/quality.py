"""Measurements that say whether a pair is fit for speculative decoding on this machine.

- ``agreement``: teacher-forced greedy agreement, the fraction of positions where the draft's
  argmax equals the target's argmax given the same true prefix. It is the acceptance rate of
  greedy speculation with K=1, per evaluation domain.
- ``distinct_4gram_ratio``: distinct / total 4-grams of the target's sampled continuations
  (temperature 0.8) of held-out code prompts, averaged over samples; near 0 means looping.
- ``forward_ms``: median wall time of one decode forward with a ``StaticCache`` after a
  64-token prefill, at a given batch size and number of new tokens per row.
"""

from __future__ import annotations

import statistics
import time

import torch

from specrl.errors import SpecrlError
from specrl.models import corpus

PREFILL = 64


def encode_windows(tokenizer, documents: list[str], window: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping ``window``-token slices of the documents, in order."""
    rows = []
    for text in documents:
        ids = tokenizer(text, verbose=False)["input_ids"]  # long docs are sliced below
        for start in range(0, len(ids) - window + 1, window):
            rows.append(ids[start : start + window])
            if len(rows) == max_windows:
                return torch.tensor(rows)
    return torch.tensor(rows, dtype=torch.long).reshape(-1, window)


@torch.inference_mode()
def agreement(pair, domain: str, *, window: int = 256, max_windows: int = 16) -> float:
    windows = encode_windows(
        pair.tokenizer, corpus.held_out_documents(domain), window, max_windows
    )  # [N, window]
    if windows.numel() == 0:
        return float("nan")
    matches = total = 0
    for batch in windows.split(8):
        target_top = pair.target(input_ids=batch).logits.argmax(-1)  # [b, window]
        draft_top = pair.draft(input_ids=batch).logits.argmax(-1)
        matches += (target_top == draft_top).sum().item()
        total += target_top.numel()
    return matches / total


@torch.inference_mode()
def sample(
    model, prompts: torch.Tensor, new_tokens: int, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    """Plain ancestral sampling with a KV cache; returns the new tokens ``[B, new_tokens]``."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    logits = model(input_ids=prompts, cache=cache, use_cache=True).logits[:, -1]  # [B, V]
    out = []
    for _ in range(new_tokens):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        token = torch.multinomial(probs, 1, generator=generator)  # [B, 1]
        out.append(token)
        logits = model(input_ids=token, cache=cache, use_cache=True).logits[:, -1]
    return torch.cat(out, dim=1)


def distinct_4gram_ratio(
    pair,
    *,
    n_prompts: int = 8,
    prompt_len: int = 64,
    new_tokens: int = 128,
    temperature: float = 0.8,
    seed: int = 0,
) -> float:
    prompts = encode_windows(
        pair.tokenizer, corpus.held_out_documents("code"), prompt_len, n_prompts
    )  # [B, prompt_len]
    generated = sample(
        pair.target, prompts, new_tokens, temperature, torch.Generator().manual_seed(seed)
    )
    ratios = []
    for row in generated.tolist():
        grams = [tuple(row[i : i + 4]) for i in range(len(row) - 3)]
        ratios.append(len(set(grams)) / len(grams))
    return sum(ratios) / len(ratios)


@torch.inference_mode()
def forward_ms(model, batch: int, new_tokens: int, *, calls: int = 40, warmup: int = 5) -> float:
    from transformers import StaticCache

    from specrl.engine.runner import cache_keyword

    cache = StaticCache(config=model.config, max_cache_len=PREFILL + new_tokens)
    keyword = cache_keyword(model)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prefill = torch.randint(0, vocab, (batch, PREFILL), generator=generator)
    step = torch.randint(0, vocab, (batch, new_tokens), generator=generator)
    position_ids = torch.arange(PREFILL, PREFILL + new_tokens).expand(batch, -1)
    model(input_ids=prefill, use_cache=True, **{keyword: cache})
    times = []
    for i in range(warmup + calls):
        start = time.perf_counter()
        model(input_ids=step, position_ids=position_ids, use_cache=True, **{keyword: cache})
        if i >= warmup:
            times.append(time.perf_counter() - start)
        # Roll back, as after a fully rejected verify step, so every call does the same work.
        _roll_back(cache, new_tokens)
    return 1000 * statistics.median(times)


def _roll_back(cache, tokens: int) -> None:
    """``cache.crop(-tokens)``; transformers 5.17's static layers have no ``crop``, only the
    length counter that theirs moves back."""
    if all(hasattr(layer, "crop") for layer in cache.layers):
        cache.crop(-tokens)
        return
    for layer in cache.layers:
        if not hasattr(layer, "cumulative_length"):
            raise SpecrlError(
                f"cannot roll back this transformers' {type(layer).__name__} (no crop, no "
                "cumulative_length) to time a forward; use transformers 5.17 or later"
            )
        layer.cumulative_length.sub_(tokens)


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def measure(pair, *, timing_calls: int = 40) -> dict:
    """All figures of ``specrl models info``."""
    target_b1 = forward_ms(pair.target, 1, 1, calls=timing_calls)
    draft_b1 = forward_ms(pair.draft, 1, 1, calls=timing_calls)
    target_b1_k5 = forward_ms(pair.target, 1, 5, calls=timing_calls)
    b64_calls = max(5, timing_calls // 4)
    target_b64 = forward_ms(pair.target, 64, 1, calls=b64_calls)
    target_b64_k5 = forward_ms(pair.target, 64, 5, calls=b64_calls)
    return {
        "target_params": parameter_count(pair.target),
        "draft_params": parameter_count(pair.draft),
        "target_forward_ms_b1": round(target_b1, 3),
        "draft_forward_ms_b1": round(draft_b1, 3),
        "draft_target_time_ratio_b1": round(draft_b1 / target_b1, 4),
        "verify5_vs_1_ratio_b1": round(target_b1_k5 / target_b1, 3),
        "verify5_vs_1_ratio_b64": round(target_b64_k5 / target_b64, 3),
        "agreement": {d: round(agreement(pair, d), 4) for d in corpus.DOMAINS},
        "distinct_4gram_ratio": round(distinct_4gram_ratio(pair), 4),
    }
