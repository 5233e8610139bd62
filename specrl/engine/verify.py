"""The verify phase of a step: one target forward over every row's block, then acceptance.

Each row's block is ``[pending, d_1 .. d_K]``: its last committed token, whose cache entry
the target has not written yet, and the K draft tokens. The target's distributions p at the
K + 1 positions decide, by the rejection rule of :func:`~specrl.engine.sampling.verify_block`,
which leading draft tokens are accepted and which token follows them.
"""

from __future__ import annotations

import torch

from specrl.engine.forward import CachedModel
from specrl.engine.sampling import VerifyResult, token_probs, verify_block, verify_greedy


def verify(
    target: CachedModel,
    pending: torch.Tensor,  # [B, 1] long: each row's last committed token
    starts: torch.Tensor,  # [B] long: its position
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V]: the q each draft token was sampled from
    uniforms: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,  # draft, accept, final
    temps: torch.Tensor | None,  # [B] float
    top_ps: torch.Tensor | None,  # [B] float
    k_eff: torch.Tensor,  # [B] long: draft positions that may be accepted per row
) -> VerifyResult:
    """One target forward over ``[pending, d_1 .. d_K]`` per row, then acceptance; all
    greedy (``uniforms`` None) or sampled rows alike, the committed tokens are distributed
    exactly as the target's own."""
    verify_ids = torch.cat([pending, draft_tokens], dim=1)  # [B, K+1]
    logits = target.forward(verify_ids, starts, None)  # [B, K+1, V]
    if uniforms is None:
        # All-greedy batches (the common serving case) skip building distributions: a draft
        # token is accepted iff it is the target's argmax, and the argmax follows.
        return verify_greedy(draft_tokens, logits, k_eff)
    _, accept_u, final_u = uniforms
    # Accept d_j with probability min(1, p(d_j) / q(d_j)) (q <= p: always); at the first
    # rejection commit a token from norm(max(0, p - q)), after a full block a bonus from p.
    return verify_block(
        draft_tokens,
        draft_probs,
        token_probs(logits, temps, top_ps),
        k_eff,
        accept_u,
        final_u,
    )
