"""Model runners: how the engine calls a model's forward.

A serving engine does not go through a model's generic ``forward`` on every decode step: at
small batch a step is short, and transformers' per-call work (module ``__call__`` for about
nine modules per layer, output dataclasses, mask preprocessing, config lookups) is a large
share of it, all of which ``generate`` pays (docs/engine.md: how large, for the default
pair).

:class:`LlamaRunner` runs a Llama-architecture model (``LlamaForCausalLM`` with the stock
transformers modules) as one Python function over the model's own parameters. It calls the
same kernels, in the same order, with the same arguments as transformers' modules do (its
RMSNorm, rotary and attention code is transformers' own), so its logits are bit-identical to
``model(...)`` (tested); only the Python around the kernels is gone. Any other model (a
subclassed, quantized, adapted or compiled layer, another attention backend), or
``runner="hf"``, uses :class:`HFRunner`, which calls the model itself; so does every call made
while the model has hooks or is in training mode. The runner reads the parameters it found
when the engine was built: replace weights or add adapters after that and build a new engine.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch.nn.modules import module as torch_module

from specrl.errors import InvalidRequestError

RUNNERS = ("auto", "hf")
"""``runner=`` values: ``auto`` (lean runner where supported, else the model's forward),
``hf`` (always the model's own forward)."""


def check_runner(runner: str) -> None:
    if runner not in RUNNERS:
        raise InvalidRequestError(f"runner must be one of {RUNNERS}, got {runner!r}")


def _cache_parameter(forward) -> str | None:
    """Which of ``cache`` (preferred) and ``past_key_values`` ``forward`` names, if either."""
    params = inspect.signature(forward).parameters
    return next((k for k in ("cache", "past_key_values") if k in params), None)


def cache_keyword(model) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` in recent transformers
    5 releases, ``past_key_values`` before them (5.17 still had it). One the forward does
    not name would land in its ``**kwargs`` and be ignored, each step then seeing only its
    own tokens. A wrapper (``torch.compile``'s module, a PEFT model) is read through to the
    model it wraps; a forward with neither name that takes ``**kwargs`` gets the installed
    transformers' name, and one without ``**kwargs`` is refused."""
    inner = getattr(model, "_orig_mod", None)  # torch.compile
    get_base = getattr(model, "get_base_model", None)  # PEFT
    if inner is None and callable(get_base):
        inner = get_base()
    if isinstance(inner, torch.nn.Module) and inner is not model:
        return cache_keyword(inner)
    forward = type(model).forward
    keyword = _cache_parameter(forward)
    if keyword is not None:
        return keyword
    params = inspect.signature(forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        from transformers import LlamaForCausalLM  # the installed release's stock name

        return _cache_parameter(LlamaForCausalLM.forward) or "past_key_values"
    raise InvalidRequestError(
        f"{type(model).__name__}.forward takes no KV cache (neither `cache` nor "
        "`past_key_values`, nor **kwargs to pass one on); SpecEngine needs a causal LM that does"
    )


class HFRunner:
    """Calls the model's own forward with the engine's cache and 4D mask."""

    name = "hf"

    def __init__(self, model):
        self.model = model
        self.dtype = next(model.parameters()).dtype
        self._cache_keyword = cache_keyword(model)

    def __call__(self, input_ids, positions, mask, cache, logits_to_keep: int = 0):
        return self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **{self._cache_keyword: cache},
        ).logits


def _has_hooks(modules) -> bool:
    """Whether a forward hook is registered on any of ``modules`` or globally."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _llama_reason(model) -> str | None:
    """Why ``model`` cannot take the lean Llama path, or None when it can."""
    from transformers.models.llama import modeling_llama as llama

    if type(model) is not llama.LlamaForCausalLM:
        return f"{type(model).__name__} is not LlamaForCausalLM"
    impl = model.config._attn_implementation
    if impl not in ("sdpa", "eager"):
        return f"attention implementation {impl!r}"
    if getattr(model, "hf_quantizer", None) is not None:
        return "the model is quantized"
    if getattr(model, "_hf_peft_config_loaded", False):
        return "adapters (PEFT/LoRA) are loaded"
    base = model.model
    linear, embedding = torch.nn.Linear, torch.nn.Embedding
    stock = [
        (base.norm, llama.LlamaRMSNorm),
        (base.rotary_emb, llama.LlamaRotaryEmbedding),
        (base.embed_tokens, embedding),
        (model.lm_head, linear),
    ]
    if len(base.layers) != model.config.num_hidden_layers:
        return "layer count differs from the config"
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        stock += [
            (layer, llama.LlamaDecoderLayer),
            (attn, llama.LlamaAttention),
            (mlp, llama.LlamaMLP),
            (layer.input_layernorm, llama.LlamaRMSNorm),
            (layer.post_attention_layernorm, llama.LlamaRMSNorm),
        ]
        stock += [(p, linear) for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)]
        stock += [(p, linear) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
    for module, cls in stock:
        # A subclass (a LoRA or quantized layer), a forward replaced on the instance (kernel
        # hubs do this) or a compiled module computes something this runner does not.
        if (
            type(module) is not cls
            or "forward" in vars(module)
            or getattr(module, "_compiled_call_impl", None) is not None
        ):
            return f"{type(module).__name__} is not the stock, uncompiled transformers module"
    if base.embed_tokens.max_norm is not None:
        return "the embedding renormalises (max_norm)"
    if any(hasattr(m, "_hf_hook") for m in model.modules()):
        return "accelerate hooks (device_map offloading) move tensors between modules"
    return None


class LlamaRunner:
    """The Llama decoder as one function over the model's parameters (see the module doc)."""

    name = "llama"

    def __init__(self, model):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.llama import modeling_llama as llama

        self.model = model
        self.dtype = next(model.parameters()).dtype
        self.hf = HFRunner(model)
        self._modules = list(model.modules())
        self._rotate = llama.apply_rotary_pos_emb
        # transformers' own RMSNorm, called without nn.Module.__call__ (the reason check made
        # sure every norm is a stock LlamaRMSNorm).
        self._rms_norm = llama.LlamaRMSNorm.forward
        self._attention_functions = ALL_ATTENTION_FUNCTIONS
        self._eager_attention = llama.eager_attention_forward
        base = model.model
        self._embed = base.embed_tokens
        self._rotary = base.rotary_emb
        self._norm = base.norm
        self._head = (model.lm_head.weight, model.lm_head.bias)
        self._layers = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self._layers.append(
                (
                    attn,
                    layer.input_layernorm,
                    *((p.weight, p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj)),
                    (attn.o_proj.weight, attn.o_proj.bias),
                    layer.post_attention_layernorm,
                    *((p.weight, p.bias) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)),
                    mlp.act_fn,
                )
            )

    def __call__(self, input_ids, positions, mask, cache, logits_to_keep: int = 0):
        if self.model.training or _has_hooks(self._modules):
            # Hooks observe or change module calls, and training mode turns on attention
            # dropout: only the model's own forward does either.
            return self.hf(input_ids, positions, mask, cache, logits_to_keep)
        batch, width = input_ids.shape
        rms_norm = self._rms_norm
        x = F.embedding(input_ids, self._embed.weight, self._embed.padding_idx)
        cos, sin = self._rotary(x, positions)
        # Looked up per call, as transformers does: a registered attention function or a
        # changed implementation applies here too.
        attention = self._attention_functions.get_interface(
            self.model.config._attn_implementation, self._eager_attention
        )
        for attn, ln1, q_p, k_p, v_p, o_p, ln2, gate, up, down, act in self._layers:
            h = rms_norm(ln1, x)
            shape = (batch, width, -1, attn.head_dim)
            q = F.linear(h, *q_p).view(shape).transpose(1, 2)
            k = F.linear(h, *k_p).view(shape).transpose(1, 2)
            v = F.linear(h, *v_p).view(shape).transpose(1, 2)
            q, k = self._rotate(q, k, cos, sin)
            k, v = cache.update(k, v, attn.layer_idx)
            out, _ = attention(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
            out = out.reshape(batch, width, -1).contiguous()
            x = x + F.linear(out, *o_p)
            h = rms_norm(ln2, x)
            x = x + F.linear(act(F.linear(h, *gate)) * F.linear(h, *up), *down)
        x = rms_norm(self._norm, x)  # over every column, then sliced, as transformers does
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return F.linear(x, *self._head)


def make_runner(model, runner: str = "auto"):
    """The runner the engine uses for ``model``: :class:`LlamaRunner` where it applies and
    ``runner="auto"``, else :class:`HFRunner`."""
    check_runner(runner)
    if runner == "auto" and _llama_reason(model) is None:
        return LlamaRunner(model)
    return HFRunner(model)
