"""SpecEngine: continuous-batching speculative decoding with K chosen per step.

One step for the running batch, each phase in a module of its own:

1. **admit** (:mod:`~specrl.engine.batch`): waiting requests take free slots; the target
   prefills their whole prompts and commits each one's first token.
2. **draft** (:mod:`~specrl.engine.draft`, K > 0): the draft first catches up on committed
   tokens it has not read, then proposes K tokens per row.
3. **verify** (:mod:`~specrl.engine.verify`): one target forward over ``[pending, d_1 .. d_K]``
   per row.
4. **accept**: rejection sampling (exact match for greedy rows) commits the accepted prefix
   plus one recovered or bonus token; EOS and the token budget cut a row's block short.
5. **retire** (:mod:`~specrl.engine.batch`): finished rows leave; the last live rows move into
   their slots so the running batch always occupies slots ``0 .. B-1`` and every forward
   works on cache views.

Invariants per row: the target cache holds positions ``0 .. seq_len-2`` (the last committed
token is pending); the draft cache holds ``0 .. draft_len-1`` with ``draft_len <= seq_len``.
With K = 0 the draft does not run at all and its ``draft_len`` falls behind.

What a step costs is measured here, not estimated: each phase is timed between device
synchronizations (:class:`~specrl.engine.stats.StepStats`).
"""

from __future__ import annotations

import time

import torch

from specrl.engine.batch import Batch, EngineRequest, prefill, step_uniforms
from specrl.engine.checks import (
    check_k,
    check_models,
    check_prompt,
    check_request,
    check_sizes,
    vocab_size,
)
from specrl.engine.draft import Drafter
from specrl.engine.forward import CachedModel
from specrl.engine.runner import check_runner
from specrl.engine.stats import Finished, StepStats
from specrl.engine.verify import verify


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
        check_sizes(max_batch=max_batch, max_len=max_len, k_max=k_max, max_waiting=max_waiting)
        check_runner(runner)
        # Every refusal reads configs and shapes only: before the models are moved to the
        # device or put in eval mode.
        self.vocab_size = vocab_size(target)
        draft_vocab = check_models(target, draft, max_len=max_len, vocab_padding=vocab_padding)
        self.device = torch.device(device) if device is not None else target.device
        self.target = target.to(self.device).eval()
        self.draft = draft.to(self.device).eval() if draft is not None else None
        self.max_batch, self.max_len, self.k_max, self.max_waiting = (
            int(max_batch),
            int(max_len),
            int(k_max),
            int(max_waiting),
        )
        sizes = {"max_batch": self.max_batch, "max_len": self.max_len, "device": self.device}
        self._target = CachedModel(self.target, runner=runner, **sizes)
        self._drafter = None
        if self.draft is not None:
            drafting = CachedModel(self.draft, runner=runner, **sizes)
            self._drafter = Drafter(drafting, vocab_size=self.vocab_size, draft_vocab=draft_vocab)
        self._batch = Batch(
            max_batch=self.max_batch, max_len=self.max_len, max_waiting=self.max_waiting, seed=seed
        )

    # ------------------------------------------------------------------ public API

    @property
    def runner_names(self) -> dict[str, str]:
        """Which runner calls each model: ``llama`` (lean) or ``hf`` (the model's forward)."""
        names = {"target": self._target.run.name}
        if self._drafter is not None:
            names["draft"] = self._drafter.model.run.name
        return names

    @property
    def num_running(self) -> int:
        return len(self._batch.running)

    @property
    def num_waiting(self) -> int:
        return len(self._batch.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._batch.running or self._batch.waiting)

    def running_rows(self) -> list[tuple[int, int]]:
        """``(request id, tokens generated so far)`` of each running row, in slot order: the
        rows the next step decodes, before it admits any."""
        return [(r.request_id, r.generated) for r in self._batch.running]

    def waiting_rows(self) -> list[tuple[int, int]]:
        """``(request id, max_new_tokens)`` of each waiting request, in the order steps admit
        them."""
        return [(r.request_id, r.max_new_tokens) for r in self._batch.waiting]

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
        prompt = check_prompt(prompt_ids, max_len=self.max_len, vocab=self.vocab_size)
        settings = {
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "eos_token_id": eos_token_id,
        }
        check_request(**settings, vocab=self.vocab_size)
        return self._batch.add(prompt, **settings)

    def pop_finished(self) -> list[Finished]:
        """Requests completed since the last call, in completion order."""
        return self._batch.pop_finished()

    @torch.inference_mode()
    def step(self, k: int) -> StepStats:
        """Run one engine step for the whole running batch with ``k`` draft tokens per row."""
        k = check_k(k, k_max=self.k_max, has_draft=self.draft is not None)
        t_start = self._now()
        stats = StepStats(batch_size=0, k=k)
        self._admit(stats)
        t_prefilled = self._now()
        stats.prefill_time = t_prefilled - t_start
        rows = self._batch.running
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
        drafts, accepted, next_tokens = self._decode(rows, k, k_eff, stats, t_prefilled)
        stats.row_accepted = accepted
        stats.committed += self._batch.commit(k, k_eff, drafts, accepted, next_tokens)
        stats.finished += self._retire()
        stats.total_time = self._now() - t_start
        return stats

    # ------------------------------------------------------------------ the step's parts

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _admit(self, stats: StepStats) -> None:
        """Prefill the waiting requests that fit and commit their first tokens."""
        first, new = self._batch.admit()
        if not new:
            return
        tokens, stats.prefill_tokens = prefill(self._target, new, first)
        self._batch.start(new, tokens)
        stats.admitted = len(new)
        stats.committed = len(new)
        stats.finished = self._retire()

    def _decode(
        self,
        rows: list[EngineRequest],
        k: int,
        k_eff: list[int],
        stats: StepStats,
        t_prefilled: float,
    ) -> tuple[list[list[int]] | None, list[int], list[int]]:
        """Draft and verify one block per row; records the draft and verify times. Returns
        each row's draft tokens (lists; None for plain decoding), how many leading ones were
        accepted, and the token that follows them."""
        uniforms = step_uniforms(rows, k, k_eff, self.device)
        pending = torch.tensor([[r.tokens[-1]] for r in rows], device=self.device)
        starts = torch.tensor([r.seq_len - 1 for r in rows], device=self.device)
        if k == 0 and uniforms is None:
            # Plain greedy decoding: one forward, and the argmax is the whole verification.
            t_drafted = self._now()
            logits = self._target.forward(pending, starts, None)
            drafts, accepted = None, [0] * len(rows)
            next_tokens = logits[:, -1].argmax(-1).tolist()
        else:
            k_eff_t = torch.tensor(k_eff, device=self.device)
            temps = top_ps = None  # all-greedy batches need no distributions
            if uniforms is not None:
                temps = torch.tensor([r.temperature for r in rows], device=self.device)
                top_ps = torch.tensor([r.top_p for r in rows], device=self.device)
            if k > 0:
                draft_u = None if uniforms is None else uniforms[0]
                draft_tokens, draft_probs = self._draft(rows, k, draft_u, temps, top_ps, stats)
            else:
                draft_tokens = torch.zeros(len(rows), 0, dtype=torch.long, device=self.device)
                draft_probs = torch.zeros(len(rows), 0, self.vocab_size, device=self.device)
            t_drafted = self._now()
            result = verify(
                self._target,
                pending,
                starts,
                draft_tokens,
                draft_probs,
                uniforms,
                temps,
                top_ps,
                k_eff_t,
            )
            if k > 0:
                _count_positions(stats, result.accept_mask, k, k_eff, k_eff_t)
            drafts = draft_tokens.tolist()
            accepted = result.accepted.tolist()
            next_tokens = result.next_token.tolist()
        t_verified = self._now()
        stats.draft_time = t_drafted - t_prefilled
        stats.verify_time = t_verified - t_drafted
        return drafts, accepted, next_tokens

    def _draft(self, rows, k, uniforms, temps, top_ps, stats: StepStats):
        """The draft phase: catch-up (timed on its own), then k tokens per row."""
        t_start = self._now()
        stats.catchup_tokens, stats.catchup_padded_tokens = self._drafter.catch_up(rows)
        stats.catchup_time = self._now() - t_start
        return self._drafter.propose(rows, k, uniforms, temps, top_ps)

    def _retire(self) -> int:
        draft_cache = self._drafter.model.cache if self._drafter is not None else None
        return self._batch.retire(self._target.cache, draft_cache)


def _count_positions(
    stats: StepStats,
    accept_mask: torch.Tensor,  # [B, K] bool
    k: int,
    k_eff: list[int],
    k_eff_t: torch.Tensor,  # [B] long
) -> None:
    """Rows that drafted, and rows that had accepted, each draft position; tokens drafted."""
    stats.accepted_per_position = accept_mask.sum(0).tolist()
    stats.drafted_per_position = (
        (torch.arange(k, device=k_eff_t.device).unsqueeze(0) < k_eff_t.unsqueeze(1)).sum(0).tolist()
    )
    stats.drafted = sum(k_eff)
