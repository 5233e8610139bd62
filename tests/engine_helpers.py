"""Tiny float64 Llama models and helpers shared by the engine tests.

float64 keeps batch-shape numerics (verifying K+1 tokens at once versus one at a time) far
below any argmax gap, so greedy equality tests check the algorithm, not rounding.
``SPECRL_TEST_DEVICE=cuda`` runs the engine tests on a GPU (experiments/gpu_check.sh).
"""

from __future__ import annotations

import copy
import os
import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specrl.engine import SpecEngine

VOCAB = 97
DEVICE = torch.device(os.environ.get("SPECRL_TEST_DEVICE", "cpu"))


def tiny_llama(seed: int, *, layers: int = 2, hidden: int = 64, vocab: int = VOCAB):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).to(device=DEVICE, dtype=torch.float64).eval()


def noisy_copy(model, seed: int, scale: float):
    """A draft that agrees with the target often but not always."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype).to(DEVICE) * scale * p.std())
    return draft


def random_prompts(n: int, seed: int, *, lo: int = 1, hi: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The independent reference: transformers' own greedy generate, batch 1, no EOS."""
    out = model.generate(
        torch.tensor([prompt], device=DEVICE),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=DEVICE),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def run_to_completion(engine: SpecEngine, k_schedule, *, arrivals=None, max_steps=100_000):
    """Step until idle. ``k_schedule(step) -> K``; ``arrivals[step]`` = callables adding work."""
    finished, stats, step = {}, [], 0
    arrivals = arrivals or {}
    while engine.has_work or any(s >= step for s in arrivals):
        for add in arrivals.get(step, []):
            add()
        if engine.has_work:
            stats.append(engine.step(k_schedule(step)))
        for f in engine.pop_finished():
            finished[f.request_id] = f
        step += 1
        assert step < max_steps
    return finished, stats
