"""Model runners: the lean Llama runner against the model's own forward, and the fallback."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_helpers import (
    DEVICE,
    VOCAB,
    hf_greedy,
    noisy_copy,
    random_prompts,
    run_to_completion,
    tiny_llama,
)

from specrl.engine import SpecEngine, position_limit
from specrl.engine.kv import SlotKVCache
from specrl.engine.runner import HFRunner, LlamaRunner, _llama_reason, make_runner
from specrl.errors import InvalidRequestError


def _steps(model):
    """Prefill of ragged right-aligned rows, a decode step, then a 4-token verify block."""
    lengths = torch.tensor([7, 3, 5], device=DEVICE)
    width = 7
    cols = torch.arange(width, device=DEVICE).unsqueeze(0)
    pad = (width - lengths).unsqueeze(1)
    ids = torch.randint(1, VOCAB, (3, width), generator=torch.Generator().manual_seed(0))
    yield ids.to(DEVICE), (cols - pad).clamp(min=0), cols >= pad, 1
    ends = lengths.unsqueeze(1)
    yield torch.tensor([[4], [5], [6]], device=DEVICE), ends, None, 0
    block = torch.tensor([[7, 8, 9, 10]] * 3, device=DEVICE)
    yield block, ends + 1 + torch.arange(4, device=DEVICE), None, 0
    block = torch.tensor([[11, 12, 13]] * 3, device=DEVICE)
    yield block, ends + 5 + torch.arange(3, device=DEVICE), None, 2


def _variant_llama():
    """Biases everywhere, llama3 rope scaling, head_dim not hidden / heads, float32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        attention_bias=True,
        mlp_bias=True,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).to(DEVICE).eval()
    with torch.no_grad():  # biases start at zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("which", ["tiny_gqa_float64", "variant_float32", "micro_float32"])
def test_llama_runner_logits_and_cache_are_bit_identical_to_the_model(which, micro_pair):
    if which == "tiny_gqa_float64":
        model = tiny_llama(0)
    elif which == "variant_float32":
        model = _variant_llama()
    else:
        model = copy.deepcopy(micro_pair.target).to(DEVICE)  # the fixture is shared
    dtype = next(model.parameters()).dtype
    caches = [
        SlotKVCache(model.config, max_batch=3, max_len=32, device=DEVICE, dtype=dtype)
        for _ in range(2)
    ]
    lean, own = LlamaRunner(model), HFRunner(model)
    with torch.inference_mode():
        for ids, positions, real, keep in _steps(model):
            out = []
            for run, cache in zip((lean, own), caches):
                mask = cache.prepare(slice(0, 3), positions, real, dtype)
                out.append(run(ids, positions, mask, cache, keep))
            assert out[0].shape == out[1].shape
            assert torch.equal(out[0], out[1])
    # Up to the trash slot: a prefill sends several of a row's padding writes to that one
    # slot in one index_put_, whose outcome CUDA leaves undefined; no query ever reads it.
    n = caches[0].max_len
    for a, b in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values):
        assert torch.equal(a[:, :, :n], b[:, :, :n])


def test_auto_picks_the_llama_runner_only_where_it_applies():
    from transformers import GPT2Config, GPT2LMHeadModel

    llama = tiny_llama(0)
    assert isinstance(make_runner(llama), LlamaRunner)
    assert isinstance(make_runner(llama, "hf"), HFRunner)
    eager = tiny_llama(0)
    eager.config._attn_implementation = "eager"
    assert isinstance(make_runner(eager), LlamaRunner)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    assert isinstance(make_runner(gpt2), HFRunner)
    with pytest.raises(ValueError, match="runner must be one of"):
        make_runner(llama, "fast")


def _refused(change) -> str:
    model = tiny_llama(0)
    change(model)
    runner = make_runner(model)
    assert isinstance(runner, HFRunner)
    return _llama_reason(model)


def test_models_the_lean_runner_would_compute_differently_are_refused():
    class LoraLinear(torch.nn.Linear):  # what adapter libraries put in place of a Linear
        pass

    def lora(model):
        old = model.model.layers[0].self_attn.q_proj
        model.model.layers[0].self_attn.q_proj = LoraLinear(old.in_features, old.out_features)

    def head_forward(model):
        model.lm_head.forward = lambda x: x

    assert "LoraLinear" in _refused(lora)
    assert "Linear" in _refused(head_forward)
    assert "quantized" in _refused(lambda m: setattr(m, "hf_quantizer", object()))
    assert "adapters" in _refused(lambda m: setattr(m, "_hf_peft_config_loaded", True))
    assert "attention implementation" in _refused(
        lambda m: setattr(m.config, "_attn_implementation", "flex_attention")
    )


def test_training_mode_after_construction_uses_the_models_forward():
    model = tiny_llama(0)
    runner = make_runner(model)
    calls = []
    model.train()  # attention dropout would apply: the lean runner must not run
    original = model.forward
    model.forward = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    cache = SlotKVCache(model.config, max_batch=1, max_len=8, device=DEVICE, dtype=torch.float64)
    positions = torch.arange(3, device=DEVICE).unsqueeze(0)
    mask = cache.prepare(slice(0, 1), positions, None, torch.float64)
    with torch.inference_mode():
        runner(torch.tensor([[1, 2, 3]], device=DEVICE), positions, mask, cache, 1)
    assert calls == [1]


def _gpt2(seed: int = 0, **sizes):
    """A tiny float64 GPT-2 (learned positions, its own attention)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa", **sizes
    )
    return GPT2LMHeadModel(config).to(device=DEVICE, dtype=torch.float64).eval()


def test_a_non_llama_model_runs_through_its_own_forward_and_matches_generate():
    """Any causal LM works: GPT-2 (learned positions, its own attention) through HFRunner."""
    target = _gpt2(n_embd=64, n_layer=2, n_head=4)
    engine = SpecEngine(target, target, max_batch=4, max_len=128, k_max=3)
    assert engine.runner_names == {"target": "hf", "draft": "hf"}
    prompts = random_prompts(4, seed=5)
    ids = [engine.add(p, max_new_tokens=40) for p in prompts]
    finished, stats = run_to_completion(engine, lambda s: s % 4)
    for rid, p in zip(ids, prompts):
        assert finished[rid].token_ids == hf_greedy(target, p, 40)
    assert sum(s.accepted for s in stats) == sum(s.drafted for s in stats) > 0


def test_a_forward_that_takes_its_cache_as_past_key_values_gets_it_there():
    """transformers 5 renamed the forward's cache argument from ``past_key_values`` to
    ``cache`` (5.17, the GPU image's version, still has the old name). A cache passed under
    the name a forward lacks lands in its ``**kwargs``, ignored; the engine passes it under
    the name the forward takes, whichever transformers is installed."""
    from transformers import GPT2LMHeadModel

    from specrl.engine.runner import cache_keyword

    reference = _gpt2(3, n_embd=32, n_layer=2, n_head=2)
    own = cache_keyword(reference)

    class OldKeyword(GPT2LMHeadModel):
        def forward(self, input_ids=None, past_key_values=None, **kwargs):
            assert not {"cache", "past_key_values"} & kwargs.keys()
            return super().forward(input_ids=input_ids, **{own: past_key_values}, **kwargs)

    old = OldKeyword(reference.config).to(device=DEVICE, dtype=torch.float64).eval()
    old.load_state_dict(reference.state_dict())
    assert cache_keyword(old) == "past_key_values"
    engine = SpecEngine(old, old, max_batch=3, max_len=64, k_max=3)
    prompts = random_prompts(3, seed=8)
    ids = [engine.add(p, max_new_tokens=20) for p in prompts]
    finished, _ = run_to_completion(engine, lambda s: s % 4)
    for rid, p in zip(ids, prompts):
        assert finished[rid].token_ids == hf_greedy(reference, p, 20)

    # Wrappers that pass **kwargs on: read through to the model, else the installed name.
    assert cache_keyword(torch.compile(old, backend="eager")) == "past_key_values"

    class Wrapper(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise AssertionError("not called")

    assert cache_keyword(Wrapper()) == own

    class Adapted(Wrapper):  # PEFT's PeftModelForCausalLM: forward(..., **kwargs)
        def get_base_model(self):
            return old

    assert cache_keyword(Adapted()) == "past_key_values"

    class NoCache(GPT2LMHeadModel):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None):
            return super().forward(input_ids, attention_mask=attention_mask)

    with pytest.raises(InvalidRequestError, match=r"NoCache.forward takes no KV cache"):
        SpecEngine(NoCache(reference.config), max_batch=1, max_len=16, k_max=1)


def test_a_position_table_model_runs_to_its_last_position():
    """GPT-2 looks positions up in a table of n_positions rows. An engine whose max_len is
    the whole table drafts and verifies past the end near a row's end (columns k_eff never
    accepts); those must not index past the table, and greedy output still equals generate.
    """
    sizes = {"n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 32}
    target = _gpt2(0, **sizes)
    drafts = {"itself": target, "another model": _gpt2(1, **sizes)}
    for name, draft in drafts.items():
        engine = SpecEngine(target, draft, max_batch=3, max_len=32, k_max=4)
        prompts = [list(range(1, 18)), list(range(40, 70)), list(range(5, 26))]
        ids = [engine.add(p, max_new_tokens=100) for p in prompts]
        sampled = engine.add(list(range(2, 22)), max_new_tokens=100, temperature=1.0, seed=3)
        finished, stats = run_to_completion(engine, lambda s: 4 if s % 3 else 2)
        for rid, p in zip(ids, prompts):
            assert finished[rid].finish_reason == "length", name
            assert finished[rid].token_ids == hf_greedy(target, p, 32 - len(p)), name
        assert len(finished[sampled].token_ids) == 32 - 20, name
        assert all(0 <= t < VOCAB for t in finished[sampled].token_ids), name
        assert sum(s.drafted for s in stats) > 0, name


def test_hooks_added_after_construction_still_fire():
    """A hook anywhere in the model sends the forward through the model's own modules."""
    target = tiny_llama(0)
    engine = SpecEngine(target, None, max_batch=2, max_len=64, k_max=0)
    assert engine.runner_names == {"target": "llama"}
    seen = []
    hook = target.model.layers[1].mlp.register_forward_hook(lambda m, a, out: seen.append(1))
    try:
        rid = engine.add([3, 4, 5], max_new_tokens=6)
        finished, _ = run_to_completion(engine, lambda s: 0)
    finally:
        hook.remove()
    assert len(seen) == 6  # the prefill and five decode steps
    assert finished[rid].token_ids == hf_greedy(target, [3, 4, 5], 6)


def _tiny(kind: str, seed: int):
    """A small random model of another architecture, weights scaled up so that its greedy
    choices are not ties, float64 as engine_helpers' Llama."""
    import transformers as tf

    torch.manual_seed(seed)
    common = {"vocab_size": VOCAB}
    rope = {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64}
    gqa = {**rope, "num_attention_heads": 4, "num_key_value_heads": 2}
    configs = {
        # learned positions with an offset of 2
        "opt": (
            tf.OPTConfig,
            {
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "ffn_dim": 64,
                "num_attention_heads": 2,
                "word_embed_proj_dim": 32,
            },
        ),
        # partial rotary, parallel residual
        "gpt_neox": (tf.GPTNeoXConfig, {**rope, "num_attention_heads": 2}),
        "qwen2": (tf.Qwen2Config, gqa),  # biases on q, k, v
        "phi": (tf.PhiConfig, {**rope, "num_attention_heads": 4}),
        "falcon": (
            tf.FalconConfig,
            {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2},
        ),
        "gptj": (tf.GPTJConfig, {"n_embd": 32, "n_layer": 2, "n_head": 2, "rotary_dim": 8}),
        "gpt_bigcode": (tf.GPTBigCodeConfig, {"n_embd": 32, "n_layer": 2, "n_head": 2}),
        # ALiBi built from positions; eager attention only
        "mpt": (tf.MptConfig, {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64}),
        # logit soft-capping, alternating sliding layers (a window longer than any row)
        "gemma2": (tf.Gemma2Config, {**gqa, "head_dim": 8, "sliding_window": 64}),
        # every layer slides, over exactly the engine's max_len
        "mistral": (tf.MistralConfig, {**gqa, "sliding_window": 48}),
    }
    config_cls, kwargs = configs[kind]
    config = config_cls(**common, **kwargs)
    model_cls = tf.MODEL_FOR_CAUSAL_LM_MAPPING[config_cls]
    # sdpa where the class has it (GPT-J gained it after transformers 5.17); Gemma 2's
    # soft-capping is eager-only
    sdpa = model_cls._supports_sdpa and kind != "gemma2"
    config._attn_implementation = "sdpa" if sdpa else "eager"
    torch.manual_seed(seed)
    model = model_cls(config).to(device=DEVICE, dtype=torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    return model


@pytest.mark.parametrize(
    "kind",
    [
        "opt",
        "gpt_neox",
        "qwen2",
        "phi",
        "falcon",
        "gptj",
        "gpt_bigcode",
        "mpt",
        "gemma2",
        "mistral",
    ],
)
def test_other_architectures_match_generate(kind):
    """Any causal LM: ragged rows, K changing every step, a draft of the same family that
    disagrees often; every row to the engine's last position, equal to greedy generate."""
    target = _tiny(kind, 0)
    draft = noisy_copy(target, 1, 1.0 if kind == "gemma2" else 0.3)  # soft-capping is robust
    engine = SpecEngine(target, draft, max_batch=3, max_len=48, k_max=3)
    assert engine.runner_names == {"target": "hf", "draft": "hf"}
    prompts = random_prompts(4, seed=7, lo=2, hi=20)
    ids = [engine.add(p, max_new_tokens=47 - len(p)) for p in prompts]
    finished, stats = run_to_completion(engine, lambda s: (0, 3, 1, 2)[s % 4])
    for rid, p in zip(ids, prompts):
        assert finished[rid].token_ids == hf_greedy(target, p, 47 - len(p)), kind
    accepted, drafted = sum(sum(s.row_accepted) for s in stats), sum(s.drafted for s in stats)
    assert 0 < accepted < drafted, kind


def test_a_sliding_window_shorter_than_max_len_is_refused():
    """The engine's masks let a query see its whole row: past a sliding window the output
    would not be the model's. Up to the window it is."""
    target = _tiny("mistral", 0)
    target.config.sliding_window = 8
    assert position_limit(target) == (8, "target", "sliding_window")
    with pytest.raises(
        InvalidRequestError,
        match=r"max_len=9 exceeds the target's sliding attention window \(8 tokens\), which "
        r"SpecEngine's per-row masks do not apply; lower max_len",
    ):
        SpecEngine(target, target, max_batch=1, max_len=9, k_max=2)
    engine = SpecEngine(target, None, max_batch=1, max_len=8, k_max=0)
    rid = engine.add([5, 6, 7], max_new_tokens=10)
    finished, _ = run_to_completion(engine, lambda s: 0)
    assert finished[rid].token_ids == hf_greedy(target, [5, 6, 7], 5)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 4096}, 32768),
        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096}, 4096),
        ({"layer_types": ["full_attention"], "sliding_window": 100}, 32768),
        ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512}, 512),
        ({"attention_layers": ["global", "local"], "window_size": 256}, 256),
        ({"attention_layers": ["global"], "window_size": 256}, 32768),
        ({"sliding_window": None}, 32768),
    ],
)
def test_position_limit_reads_sliding_windows_from_the_config(config, expected):
    from types import SimpleNamespace

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=32768, **config))
    assert position_limit(model).positions == expected


@pytest.mark.parametrize(("kind", "alibi"), [("bloom", True), ("falcon", True)])
def test_alibi_from_a_2d_mask_is_refused_by_name(kind, alibi):
    import transformers as tf

    if kind == "bloom":
        config = tf.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=2)
    else:
        config = tf.FalconConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            alibi=alibi,
        )
    config._attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(config)
    with pytest.raises(InvalidRequestError, match=f"target is a {kind} model with ALiBi, whose"):
        SpecEngine(model, None, max_batch=1, max_len=16, k_max=0)
