"""Token distributions, inverse-CDF sampling and the lossless rejection sampler.

Every row carries its own temperature and top-p. A row with temperature 0 is greedy: its
distribution is the one-hot of the argmax, so the same rejection rule reduces to exact-match
verification and the recovered/bonus token is the target's argmax. Randomness comes in as
per-row uniforms drawn from each request's own generator, so a row's tokens do not depend on
which other rows share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def token_probs(
    logits: torch.Tensor,  # [B, ..., V]
    temperature: torch.Tensor,  # [B] float, 0 = greedy
    top_p: torch.Tensor,  # [B] float in (0, 1]
) -> torch.Tensor:  # [B, ..., V] float32
    """The distribution each row samples from: softmax(logits / T) cut to the top-p nucleus.

    Greedy rows get the one-hot of their argmax, never a softmax of a division by zero.
    """
    logits = logits.float()
    extra = (1,) * (logits.dim() - 2)
    temp = temperature.float().view(-1, *extra, 1)
    greedy = temp == 0
    probs = torch.softmax(logits / torch.where(greedy, torch.ones_like(temp), temp), dim=-1)
    if bool((top_p < 1).any()):
        probs = _top_p_filter(probs, top_p.float().view(-1, *extra, 1))
    one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy, one_hot, probs)


def _top_p_filter(
    probs: torch.Tensor,  # [B, ..., V]
    top_p: torch.Tensor,  # [B, ..., 1]
) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    # A token stays if the mass strictly before it is below top_p; the argmax always stays.
    keep_sorted = mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


def sample_inverse_cdf(
    probs: torch.Tensor,  # [N, V]
    uniforms: torch.Tensor,  # [N] in [0, 1)
) -> torch.Tensor:  # [N] long
    """Token i such that cdf[i-1] <= u * total < cdf[i]: one uniform per row, no hidden RNG.

    A u within rounding of 1 (about 1 - 2^-25 in float32) gives u * total = total, past every
    token; it takes the token where the cdf reaches its total (the last of nonzero
    probability, up to rounding), never one of zero (a token cut by top_p, say), so sampling
    stays lossless there too."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:].contiguous()  # searchsorted copies a strided value tensor
    index = torch.searchsorted(cdf, uniforms.to(cdf.dtype).unsqueeze(-1) * total, right=True)
    # Where the cdf first reaches the total: a step up, so a token of nonzero probability.
    last_possible = torch.searchsorted(cdf, total)
    return torch.minimum(index, last_possible).squeeze(-1)


@dataclass
class VerifyResult:
    accepted: torch.Tensor  # [B] long: leading draft tokens accepted per row
    accept_mask: torch.Tensor  # [B, K] bool: draft position j accepted (and all before it)
    next_token: torch.Tensor  # [B] long: the recovered token, or the bonus on full acceptance


def verify_block(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor,  # [B, K, V]: the q each draft token was sampled from
    target_probs: torch.Tensor,  # [B, K+1, V]: p at each draft position, plus the bonus position
    k_eff: torch.Tensor,  # [B] long: draft positions that may be accepted per row (<= K)
    accept_uniforms: torch.Tensor,  # [B, K] in [0, 1): 0 for greedy rows
    final_uniforms: torch.Tensor,  # [B] in [0, 1): 0 for greedy rows
) -> VerifyResult:
    """Standard speculative rejection sampling (Leviathan et al.; Chen et al.), batched.

    Draft token x at position j is accepted with probability min(1, p(x) / q(x)). At the first
    rejection the row commits a token from the residual norm(max(0, p - q)); if all k_eff
    tokens pass it commits a bonus token from p at position k_eff. The committed tokens are
    distributed exactly as the target's own samples.
    """
    batch, k = draft_tokens.shape
    rows = torch.arange(batch, device=draft_tokens.device)
    if k:
        p_x = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        q_x = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        # p(x) >= q(x): always accept. Otherwise accept with probability p(x) / q(x).
        ok = accept_uniforms * q_x < p_x
        allowed = torch.arange(k, device=ok.device).unsqueeze(0) < k_eff.unsqueeze(1)
        accept_mask = (ok & allowed).long().cumprod(dim=1).bool()
        accepted = accept_mask.sum(dim=1)
    else:
        accept_mask = torch.zeros(batch, 0, dtype=torch.bool, device=draft_tokens.device)
        accepted = torch.zeros(batch, dtype=torch.long, device=draft_tokens.device)

    p_next = target_probs[rows, accepted]  # [B, V]
    rejected = accepted < k_eff
    if k:
        q_next = draft_probs[rows, accepted.clamp(max=k - 1)]
        residual = (p_next - q_next).clamp_(min=0)
        mass = residual.sum(-1, keepdim=True)
        # p == q leaves no residual mass (a rejection then has probability 0); fall back to p
        # rather than dividing 0 by 0.
        residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_next)
        p_next = torch.where(rejected.unsqueeze(-1), residual, p_next)
    next_token = sample_inverse_cdf(p_next, final_uniforms)
    return VerifyResult(accepted=accepted, accept_mask=accept_mask, next_token=next_token)


def verify_greedy(
    draft_tokens: torch.Tensor,  # [B, K] long
    target_logits: torch.Tensor,  # [B, K+1, V]
    k_eff: torch.Tensor,  # [B] long
) -> VerifyResult:
    """Exact-match verification for a batch of greedy rows, without building distributions.

    Equal to :func:`verify_block` on one-hot distributions: a draft token is accepted iff it is
    the target's argmax; the next token is the target's argmax after the accepted prefix.
    """
    batch, k = draft_tokens.shape
    choice = target_logits.argmax(-1)  # [B, K+1]
    allowed = torch.arange(k, device=choice.device).unsqueeze(0) < k_eff.unsqueeze(1)
    accept_mask = ((draft_tokens == choice[:, :k]) & allowed).long().cumprod(dim=1).bool()
    accepted = accept_mask.sum(dim=1)
    rows = torch.arange(batch, device=choice.device)
    return VerifyResult(
        accepted=accepted, accept_mask=accept_mask, next_token=choice[rows, accepted]
    )
