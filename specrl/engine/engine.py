"""SpecEngine: continuous-batching speculative decoding with K chosen per step.

One step for the running batch:

1. **admit**: waiting requests take free slots; the target prefills their whole prompts and
   commits each one's first token from the prefill's last logits (as ``generate`` does, so a
   request costs one prefill and ``max_new_tokens - 1`` decode forwards). A request that ends
   on that token (EOS, or ``max_new_tokens=1``) leaves before the decode.
2. **draft** (K > 0): the draft first catches up on committed tokens it has not read (a new
   prompt, or everything committed while K was 0), then proposes K tokens per row.
3. **verify**: one target forward over ``[pending, d_1 .. d_K]`` per row.
4. **accept**: rejection sampling (exact match for greedy rows) commits the accepted prefix
   plus one recovered or bonus token; EOS and the token budget cut a row's block short.
5. **retire**: finished rows leave; the last live rows move into their slots so the running
   batch always occupies slots ``0 .. B-1`` and every forward works on cache views.

Invariants per row: the target cache holds positions ``0 .. seq_len-2`` (the last committed
token is pending); the draft cache holds ``0 .. draft_len-1`` with ``draft_len <= seq_len``.
With K = 0 the draft does not run at all and its ``draft_len`` falls behind.
"""

from __future__ import annotations

import math
import numbers
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from specrl.engine.kv import SlotKVCache
from specrl.engine.runner import check_runner, make_runner
from specrl.engine.sampling import (
    sample_inverse_cdf,
    token_probs,
    verify_block,
    verify_greedy,
)
from specrl.engine.stats import Finished, StepStats
from specrl.errors import InvalidRequestError


@dataclass
class _Request:
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


def _is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _vocab_size(model) -> int:
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
    if slides and _is_int(window) and window > 0:
        windows.append(int(window))
    local = getattr(text, "window_size", None)
    if "local" in (getattr(text, "attention_layers", None) or ()) and _is_int(local):
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


class SpecEngine:
    """A batched draft/target speculative decoding engine over Hugging Face causal LMs.

    :param target: the model whose output distribution is preserved.
    :param draft: the proposer; ``None`` builds a target-only engine (only ``k=0`` allowed).
    :param max_batch: slots in the running batch; further requests wait in a queue.
    :param max_len: most tokens (prompt + generated) per request; caches are sized by it.
    :param k_max: the largest K a step may ask for.
    :param device: where models and caches live; default: the target's device.
    :param max_waiting: queue limit; ``add`` refuses requests beyond it.
    :param seed: seeds the generators of sampled requests added without a seed.
    :param runner: how forwards are called: ``"auto"`` runs Llama-architecture models through
        :class:`~specrl.engine.runner.LlamaRunner` (same kernels and logits as the model's own
        forward, without its per-call Python) and any other model through its own forward;
        ``"hf"`` always calls the model's own forward. ``runner_names`` says which was chosen.
    :param vocab_padding: let the draft's vocab size differ from the target's, as a family's
        models padded to different sizes do (one tokenizer; Qwen2.5 0.5B-3B pad it to
        151,936 ids, 7B and larger to 152,064). The draft proposes only ids both models have
        (its distribution is given zero mass above them, so verification stays exact) and reads
        an id only the target has as the last id it has. Only for a pair that shares a
        tokenizer: :func:`~specrl.models.load_pair` checks that and sets
        ``ModelPair.vocab_padding``.
    """

    def __init__(
        self,
        target,
        draft=None,
        *,
        max_batch: int,
        max_len: int,
        k_max: int,
        device: str | torch.device | None = None,
        max_waiting: int = 4096,
        seed: int = 0,
        runner: str = "auto",
        vocab_padding: bool = False,
    ):
        for name, value, low in (
            ("max_batch", max_batch, 1),
            ("max_len", max_len, 2),
            ("k_max", k_max, 0),
            ("max_waiting", max_waiting, 0),
        ):
            if not _is_int(value) or value < low:
                raise InvalidRequestError(f"{name} must be an integer >= {low}, got {value!r}")
        check_runner(runner)
        # Every refusal below reads configs and shapes only: before the models are moved to
        # the device or put in eval mode.
        self.vocab_size = _vocab_size(target)
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
        self._draft_vocab = None  # the ids the draft has, when fewer or more than the target's
        if draft is not None and _vocab_size(draft) != self.vocab_size:
            if not vocab_padding:
                raise InvalidRequestError(
                    f"draft vocabulary ({_vocab_size(draft)}) differs from the target's "
                    f"({self.vocab_size}); use a draft trained with the target's tokenizer, or "
                    "vocab_padding=True for one tokenizer padded to two sizes"
                )
            self._draft_vocab = _vocab_size(draft)
        self.device = torch.device(device) if device is not None else target.device
        self.target = target.to(self.device).eval()
        self.draft = draft.to(self.device).eval() if draft is not None else None
        self.max_batch, self.max_len, self.k_max, self.max_waiting = (
            int(max_batch),
            int(max_len),
            int(k_max),
            int(max_waiting),
        )
        self._target_run = make_runner(self.target, runner)
        self._draft_run = make_runner(self.draft, runner) if self.draft is not None else None
        self._target_cache = self._new_cache(self.target)
        self._draft_cache = self._new_cache(self.draft) if self.draft is not None else None
        self._running: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._finished: list[Finished] = []
        self._next_id = 0
        self._seed_source = torch.Generator().manual_seed(seed)

    def _new_cache(self, model) -> SlotKVCache:
        dtype = next(model.parameters()).dtype
        return SlotKVCache(
            model.config,
            max_batch=self.max_batch,
            max_len=self.max_len,
            device=self.device,
            dtype=dtype,
        )

    # ------------------------------------------------------------------ public API

    @property
    def runner_names(self) -> dict[str, str]:
        """Which runner calls each model: ``llama`` (lean) or ``hf`` (the model's forward)."""
        names = {"target": self._target_run.name}
        if self._draft_run is not None:
            names["draft"] = self._draft_run.name
        return names

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def add(
        self,
        prompt_ids,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        eos_token_id: int | None = None,
    ) -> int:
        """Queue a request; it joins the running batch at the next step with a free slot.

        Returns the request id. Invalid arguments raise :class:`InvalidRequestError` and leave
        the engine unchanged.
        """
        prompt = self._check_prompt(prompt_ids)
        if not _is_int(max_new_tokens) or max_new_tokens < 1:
            raise InvalidRequestError(
                f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}"
            )
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
        if seed is not None and not _is_int(seed):
            raise InvalidRequestError(f"seed must be an integer or None, got {seed!r}")
        if eos_token_id is not None and not (
            _is_int(eos_token_id) and 0 <= eos_token_id < self.vocab_size
        ):
            raise InvalidRequestError(
                f"eos_token_id must be a token id in [0, {self.vocab_size}) or None, got "
                f"{eos_token_id!r}"
            )
        if len(self._waiting) >= self.max_waiting:
            raise InvalidRequestError(
                f"the queue is full ({self.max_waiting} waiting requests); step the engine "
                "until requests finish, or create it with a larger max_waiting"
            )
        generator = None
        if temperature > 0:
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
            generator = torch.Generator().manual_seed(seed)
        request = _Request(
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
        self._waiting.append(request)
        return request.request_id

    def pop_finished(self) -> list[Finished]:
        """Requests completed since the last call, in completion order."""
        done, self._finished = self._finished, []
        return done

    @torch.inference_mode()
    def step(self, k: int) -> StepStats:
        """Run one engine step for the whole running batch with ``k`` draft tokens per row."""
        if not _is_int(k) or not 0 <= k <= self.k_max:
            raise InvalidRequestError(f"k must be an integer in 0..{self.k_max} (k_max), got {k!r}")
        k = int(k)  # numpy integers (a policy's action) are welcome
        if k > 0 and self.draft is None:
            raise InvalidRequestError(
                "k > 0 needs a draft model; this engine was built without one"
            )
        t_start = self._now()
        stats = StepStats(batch_size=0, k=k)
        self._admit(stats)
        t_prefilled = self._now()
        stats.prefill_time = t_prefilled - t_start
        rows = self._running
        stats.batch_size = len(rows)
        if not rows:
            stats.total_time = self._now() - t_start
            return stats
        contexts = [r.seq_len for r in rows]
        stats.mean_context = sum(contexts) / len(contexts)
        stats.max_context = max(contexts)
        stats.row_request_ids = [r.request_id for r in rows]
        stats.row_generated = [r.generated for r in rows]

        k_eff = [
            max(0, min(k, r.max_new_tokens - r.generated - 1, self.max_len - r.seq_len - 1))
            for r in rows
        ]
        stats.row_drafted = k_eff
        uniforms = self._step_uniforms(rows, k, k_eff)
        k_eff_t = torch.tensor(k_eff, device=self.device) if k or uniforms is not None else None
        temps = top_ps = None  # all-greedy batches need no distributions
        if uniforms is not None:
            temps = torch.tensor([r.temperature for r in rows], device=self.device)
            top_ps = torch.tensor([r.top_p for r in rows], device=self.device)

        pending = torch.tensor([[r.tokens[-1]] for r in rows], device=self.device)
        starts = torch.tensor([r.seq_len - 1 for r in rows], device=self.device)
        if k == 0 and uniforms is None:
            # Plain greedy decoding: one forward, and the argmax is the whole verification.
            t_drafted = self._now()
            logits = self._forward(self._target_run, self._target_cache, pending, starts, None)
            drafts, accepted = None, [0] * len(rows)
            next_tokens = logits[:, -1].argmax(-1).tolist()
        else:
            if k > 0:
                draft_tokens, draft_probs = self._propose(k, uniforms, temps, top_ps, stats)
            else:
                draft_tokens = torch.zeros(len(rows), 0, dtype=torch.long, device=self.device)
                draft_probs = torch.zeros(len(rows), 0, self.vocab_size, device=self.device)
            t_drafted = self._now()
            result = self._verify(
                pending, starts, draft_tokens, draft_probs, uniforms, temps, top_ps, k_eff_t
            )
            if k > 0:
                stats.accepted_per_position = result.accept_mask.sum(0).tolist()
                stats.drafted_per_position = (
                    (torch.arange(k, device=self.device).unsqueeze(0) < k_eff_t.unsqueeze(1))
                    .sum(0)
                    .tolist()
                )
                stats.drafted = sum(k_eff)
            drafts = draft_tokens.tolist()
            accepted = result.accepted.tolist()
            next_tokens = result.next_token.tolist()
        t_verified = self._now()
        stats.draft_time = t_drafted - t_prefilled
        stats.verify_time = t_verified - t_drafted
        stats.committed += self._commit(rows, k, k_eff, drafts, accepted, next_tokens, stats)
        stats.finished += self._retire()
        stats.total_time = self._now() - t_start
        return stats

    def _verify(self, pending, starts, draft_tokens, draft_probs, uniforms, temps, top_ps, k_eff_t):
        """One target forward over ``[pending, d_1 .. d_K]`` per row, then acceptance."""
        verify_ids = torch.cat([pending, draft_tokens], dim=1)  # [B, K+1]
        logits = self._forward(self._target_run, self._target_cache, verify_ids, starts, None)
        if uniforms is None:
            # All-greedy batches (the common serving case) skip building distributions.
            result = verify_greedy(draft_tokens, logits, k_eff_t)
        else:
            _, accept_u, final_u = uniforms
            result = verify_block(
                draft_tokens,
                draft_probs,
                token_probs(logits, temps, top_ps),
                k_eff_t,
                accept_u,
                final_u,
            )
        return result

    # ------------------------------------------------------------------ validation

    def _check_prompt(self, prompt_ids) -> list[int]:
        if isinstance(prompt_ids, torch.Tensor):
            if prompt_ids.dim() != 1:
                raise InvalidRequestError(
                    f"prompt_ids must be 1-D (one request), got shape {tuple(prompt_ids.shape)}"
                )
            prompt_ids = prompt_ids.tolist()
        try:
            prompt = list(prompt_ids)
        except TypeError as err:
            raise InvalidRequestError(
                f"prompt_ids must be a sequence of token ids: {err}"
            ) from None
        not_ids = [t for t in prompt if not _is_int(t)]
        if not_ids:
            raise InvalidRequestError(
                f"prompt_ids must be integer token ids; got {not_ids[0]!r} "
                f"({type(not_ids[0]).__name__})"
            )
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise InvalidRequestError("prompt_ids is empty; a request needs at least one token")
        if len(prompt) >= self.max_len:
            raise InvalidRequestError(
                f"prompt has {len(prompt)} tokens but max_len is {self.max_len}; shorten the "
                "prompt or create the engine with a larger max_len"
            )
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt_ids contains {bad[0]}, outside the vocabulary [0, {self.vocab_size})"
            )
        return prompt

    # ------------------------------------------------------------------ the step's parts

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _step_uniforms(self, rows: list[_Request], k: int, k_eff: list[int]):
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
        return draft_u.to(self.device), accept_u.to(self.device), final_u.to(self.device)

    def _forward(
        self,
        run,  # the model's runner (specrl.engine.runner)
        cache: SlotKVCache,
        input_ids: torch.Tensor,  # [B, P] long
        starts: torch.Tensor,  # [B] long: position of each row's first input token
        n_real: torch.Tensor | None,  # [B] long: real tokens per row (None: every column)
        rows: slice | torch.Tensor | None = None,  # slots; default: the running batch
        logits_to_keep: int = 0,
        right_aligned: bool = False,
    ) -> torch.Tensor:  # [B, P, V] (or the last logits_to_keep columns)
        """One forward over ragged rows. Left-aligned (default): filler columns follow the
        real tokens and repeat the row's last real position. Right-aligned (``_ragged(...,
        right=True)``): fillers come first at the row's first position, so the last column
        is every row's last real token. Fillers' writes go to the trash slot."""
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
        mask = cache.prepare(rows, positions, real, run.dtype)
        if cache.past_end:
            # Columns at or past max_len (a verify block near the end of a row) are drafts
            # that k_eff never accepts; the cache sends them to the trash slot. A model with
            # learned positions (GPT-2's wpe) has no row for them, so it reads max_len - 1.
            positions = positions.clamp(max=self.max_len - 1)
        return run(input_ids, positions, mask, cache, logits_to_keep)

    def _ragged(
        self, seqs: list[list[int]], rows: list[_Request], *, right: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``[B, P]``, left-aligned (or right-aligned). Short rows are filled with a
        real token of their own (the last one given, the first when right-aligned, else the
        row's last committed one), never a pad id."""
        width = max(1, max(len(s) for s in seqs))
        if right:
            ids = [[s[0]] * (width - len(s)) + s for s in seqs]
        else:
            ids = [
                s + [s[-1] if s else r.tokens[-1]] * (width - len(s)) for s, r in zip(seqs, rows)
            ]
        lengths = torch.tensor([len(s) for s in seqs], device=self.device)
        return torch.tensor(ids, device=self.device), lengths

    def _admit(self, stats: StepStats) -> None:
        """Prefill the waiting requests that fit and commit their first tokens."""
        free = self.max_batch - len(self._running)
        new = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        if not new:
            return
        first = len(self._running)
        self._running.extend(new)
        ids, lengths = self._ragged([r.prompt for r in new], new, right=True)
        logits = self._forward(
            self._target_run,
            self._target_cache,
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
                device=self.device,
            )
            temps = torch.tensor([r.temperature for r in new], device=self.device)
            top_ps = torch.tensor([r.top_p for r in new], device=self.device)
            tokens = sample_inverse_cdf(token_probs(logits, temps, top_ps), uniforms)
        for r, token in zip(new, tokens.tolist()):
            r.tokens.append(token)
            if token == r.eos_token_id:
                r.finish_reason = "eos"
            elif r.max_new_tokens == 1 or r.seq_len >= self.max_len:
                r.finish_reason = "length"
        stats.admitted = len(new)
        stats.prefill_tokens = int(lengths.sum())
        stats.committed = len(new)
        stats.finished = self._retire()

    def _propose(self, k, uniforms, temps, top_ps, stats: StepStats):
        """Draft k tokens per row: tokens [B, k] and the q they were sampled from [B, k, V]
        (None for an all-greedy batch, ``uniforms is None``, which takes the argmax).
        Records the catch-up."""
        rows = self._running
        t_start = self._now()
        stats.catchup_tokens, stats.catchup_padded_tokens = self._catch_up()
        stats.catchup_time = self._now() - t_start
        # Each row now has one or two unread tokens (two after a fully accepted block).
        seqs = [r.tokens[r.draft_len :] for r in rows]
        ids, lengths = self._ragged(seqs, rows)
        starts = torch.tensor([r.draft_len for r in rows], device=self.device)
        ids = self._draft_ids(ids)
        logits = self._forward(self._draft_run, self._draft_cache, ids, starts, n_real=lengths)
        last = self._draft_logits(logits[torch.arange(len(rows), device=self.device), lengths - 1])
        for r in rows:
            r.draft_len = r.seq_len
        seq_lens = torch.tensor([r.seq_len for r in rows], device=self.device)
        tokens, probs = [], []
        for j in range(k):
            if uniforms is None:
                token = last.argmax(-1)
            else:
                q = token_probs(last, temps, top_ps)  # [B, V]
                token = sample_inverse_cdf(q, uniforms[0][:, j])
                probs.append(q)
            tokens.append(token)
            if j < k - 1:
                last = self._forward(
                    self._draft_run,
                    self._draft_cache,
                    token.unsqueeze(1),  # -inf padding: never an id the draft lacks
                    seq_lens + j,
                    n_real=None,
                )[:, -1]
                last = self._draft_logits(last)
        return torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None

    def _draft_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """With ``vocab_padding``, an id the draft lacks (a padding id the target committed)
        is read as the last id the draft has."""
        if self._draft_vocab is None or self._draft_vocab >= self.vocab_size:
            return ids
        return ids.clamp(max=self._draft_vocab - 1)

    def _draft_logits(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V_draft] -> [B, V]
        """With ``vocab_padding``, the draft's logits over the target's ids: cut to them, or
        extended with -inf (exactly zero probability at any temperature; the dtype's lowest
        value is not, in fp16 at a temperature of 1e5) for ids only the target has.
        Verification then sees a q over the target's vocabulary, as p is."""
        if self._draft_vocab is None:
            return logits
        if self._draft_vocab > self.vocab_size:
            return logits[:, : self.vocab_size]
        return torch.nn.functional.pad(
            logits, (0, self.vocab_size - self._draft_vocab), value=float("-inf")
        )

    def _catch_up(self) -> tuple[int, int]:
        """Feed the draft the committed tokens it missed, leaving one unread token per row.
        Returns the tokens read and the forward's padded size (rows x widest row)."""
        behind = [b for b, r in enumerate(self._running) if r.seq_len - r.draft_len > 2]
        if not behind:
            return 0, 0
        lagging = [self._running[b] for b in behind]
        seqs = [r.tokens[r.draft_len : -1] for r in lagging]
        ids, lengths = self._ragged(seqs, lagging)
        starts = torch.tensor([r.draft_len for r in lagging], device=self.device)
        if behind == list(range(behind[0], behind[-1] + 1)):
            slots = slice(behind[0], behind[-1] + 1)
        else:
            slots = torch.tensor(behind, device=self.device)
        self._forward(
            self._draft_run,
            self._draft_cache,
            self._draft_ids(ids),
            starts,
            n_real=lengths,
            rows=slots,
            logits_to_keep=1,
        )
        for r in lagging:
            r.draft_len = r.seq_len - 1
        return int(lengths.sum()), int(ids.numel())

    def _commit(self, rows, k, k_eff, drafts, accepted, next_tokens, stats: StepStats) -> int:
        """Append each row's accepted draft tokens (``drafts``: lists, None when K=0) and its
        next token, cut at EOS and the token budget."""
        stats.row_accepted = accepted
        committed = 0
        for b, r in enumerate(rows):
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

    def _retire(self) -> int:
        rows = self._running
        done = [b for b, r in enumerate(rows) if r.finish_reason is not None]
        if not done:
            return 0
        for b in done:
            r = rows[b]
            self._finished.append(
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
            self._target_cache.move_row(src, hole, r.seq_len)
            if self._draft_cache is not None:
                self._draft_cache.move_row(src, hole, r.draft_len)
            rows[hole] = r
        del rows[live:]
        return len(done)
