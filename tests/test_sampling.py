"""The rejection sampler against the distribution it must preserve (vLLM's statistical test)."""

from __future__ import annotations

import dataclasses
import math

import torch
from engine_helpers import DEVICE

from specrl.engine import sampling

VOCAB = 8
SAMPLES = 200_000


def _on_device(fn):
    """``fn`` run on the test device (``SPECRL_TEST_DEVICE``; experiments/gpu_check.sh runs
    this file on the GPU), its results back on the CPU. The inputs are drawn on the CPU from
    CPU generators, so every device sees the same numbers."""

    def call(*args):
        out = fn(*(a.to(DEVICE) for a in args))
        if dataclasses.is_dataclass(out):
            return dataclasses.replace(
                out, **{f.name: getattr(out, f.name).cpu() for f in dataclasses.fields(out)}
            )
        return out.cpu()

    return call


token_probs = _on_device(sampling.token_probs)
sample_inverse_cdf = _on_device(sampling.sample_inverse_cdf)
verify_block = _on_device(sampling.verify_block)


def _committed_tokens(p, q, *, force_accept: bool, seed: int = 0):
    """First committed token of a K=2 block for SAMPLES independent rows.

    ``force_accept`` is the negative control: uniforms of 0 pass every draft token whose
    target probability is non-zero, as a verifier that always accepts would.
    """
    gen = torch.Generator().manual_seed(seed)
    k = 2
    q_rows = q.expand(SAMPLES, k, VOCAB)
    p_rows = p.expand(SAMPLES, k + 1, VOCAB)
    draft = torch.stack(
        [sample_inverse_cdf(q_rows[:, j], torch.rand(SAMPLES, generator=gen)) for j in range(k)], 1
    )
    accept_u = torch.rand(SAMPLES, k, generator=gen)
    if force_accept:
        accept_u = torch.zeros_like(accept_u)
    result = verify_block(
        draft,
        q_rows,
        p_rows,
        torch.full((SAMPLES,), k),
        accept_u,
        torch.rand(SAMPLES, generator=gen),
    )
    first = torch.where(result.accepted >= 1, draft[:, 0], result.next_token)
    return first, result


def _tv(samples, probs):
    hist = torch.bincount(samples, minlength=VOCAB).double() / samples.numel()
    return 0.5 * (hist - probs.double()).abs().sum().item()


def _distributions(seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(VOCAB, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(VOCAB, generator=gen) * 1.5, -1)
    return p, q


def test_committed_tokens_follow_the_target_distribution():
    for seed in range(3):
        p, q = _distributions(seed)
        first, result = _committed_tokens(p, q, force_accept=False, seed=seed)
        # Sampling noise at 2e5 samples over 8 tokens is ~0.003 in total variation.
        assert _tv(first, p) < 0.01
        assert _tv(first, q) > 0.1, "p and q should be far apart for the test to mean anything"
        # Acceptance probability per position is sum(min(p, q)).
        expected_accept = torch.minimum(p, q).sum().item()
        observed = (result.accepted >= 1).double().mean().item()
        assert abs(observed - expected_accept) < 0.01


def test_negative_control_forced_acceptance_breaks_the_distribution():
    p, q = _distributions(0)
    first, result = _committed_tokens(p, q, force_accept=True)
    assert bool((result.accepted == 2).all())
    # The same check that passes above fails by a wide margin.
    assert _tv(first, p) > 0.1


def test_greedy_rows_and_identical_distributions_give_no_nan():
    logits = torch.randn(3, 4, VOCAB)
    probs = token_probs(logits, torch.tensor([0.0, 0.0, 1.0]), torch.ones(3))
    assert not torch.isnan(probs).any()
    assert torch.equal(probs[0].argmax(-1), logits[0].argmax(-1))
    assert torch.equal(probs[0].sum(-1), torch.ones(4))
    # p == q: the residual is all zeros; the sampler must not divide 0 by 0. Uniforms of 1.0
    # (only reachable through rounding) force the rejection path; the row then samples from p.
    p, _ = _distributions(1)
    gen = torch.Generator().manual_seed(0)
    draft = sample_inverse_cdf(p.expand(SAMPLES, VOCAB), torch.rand(SAMPLES, generator=gen))
    result = verify_block(
        draft.unsqueeze(1),
        p.expand(SAMPLES, 1, VOCAB),
        p.expand(SAMPLES, 2, VOCAB),
        torch.ones(SAMPLES, dtype=torch.long),
        torch.ones(SAMPLES, 1),
        torch.rand(SAMPLES, generator=gen),
    )
    assert bool((result.accepted == 0).all())
    assert _tv(result.next_token, p) < 0.01


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = token_probs(logits, torch.tensor([1.0]), torch.tensor([0.75]))
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


# ---- mutation gaps


def _tv_bound(n: int, delta: float = 1e-6) -> float:
    """Total variation an exact sampler exceeds with probability below ``delta`` at ``n``
    samples over VOCAB tokens: E[TV] <= sqrt((VOCAB - 1) / n) / 2, and one sample moves the
    TV by at most 1/n (McDiarmid)."""
    return 0.5 * math.sqrt((VOCAB - 1) / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def test_temperature_divides_the_logits():
    logits = torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(0))
    for t in (0.5, 2.0):
        probs = token_probs(logits, torch.full((2,), t), torch.ones(2))
        assert torch.allclose(probs, torch.softmax(logits / t, -1), atol=1e-6)


def test_top_p_stops_where_the_mass_exactly_reaches_top_p():
    # Four tokens of 0.25 (exact in float): two of them reach 0.5, a third is not needed.
    probs = token_probs(torch.zeros(1, 4), torch.ones(1), torch.tensor([0.5]))
    assert sorted(probs[0].tolist()) == [0.0, 0.0, 0.5, 0.5]


def test_inverse_cdf_takes_unnormalised_weights_and_never_picks_zero_mass():
    probs = torch.tensor([[0.0, 2.0, 0.0, 2.0]]).expand(4, 4)
    u = torch.tensor([0.0, 0.49, 0.5, 0.999])
    assert sample_inverse_cdf(probs, u).tolist() == [1, 1, 3, 3]


def test_each_block_position_and_the_bonus_follow_their_own_target_distribution():
    """p and q differ per position (as they do after different prefixes) and half the rows
    may accept only one draft token (k_eff < K, near a budget). The token at block position
    j, where the block reaches it, is distributed as p[j]: the draft token if accepted, the
    residual at the first rejection, the bonus from p[k_eff] after a full acceptance."""
    gen = torch.Generator().manual_seed(5)
    k = 2
    p = torch.softmax(torch.randn(k + 1, VOCAB, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(k, VOCAB, generator=gen) * 1.5, -1)
    k_eff = torch.tensor([2, 1]).repeat(SAMPLES // 2)
    draft = torch.stack(
        [
            sample_inverse_cdf(q[j].expand(SAMPLES, VOCAB), torch.rand(SAMPLES, generator=gen))
            for j in range(k)
        ],
        1,
    )
    result = verify_block(
        draft,
        q.expand(SAMPLES, k, VOCAB),
        p.expand(SAMPLES, k + 1, VOCAB),
        k_eff,
        torch.rand(SAMPLES, k, generator=gen),
        torch.rand(SAMPLES, generator=gen),
    )
    assert bool((result.accepted <= k_eff).all())
    assert torch.equal(result.accept_mask.sum(1), result.accepted)
    padded = torch.cat([draft, torch.zeros(SAMPLES, 1, dtype=torch.long)], 1)
    for ke in (1, 2):
        for j in range(ke + 1):
            rows = (k_eff == ke) & (result.accepted >= j)
            token = torch.where(result.accepted[rows] > j, padded[rows, j], result.next_token[rows])
            n = int(rows.sum())
            assert n > 5_000
            assert _tv(token, p[j]) < _tv_bound(n), f"position {j}, k_eff {ke}"
            assert _tv(token, p[(j + 1) % (k + 1)]) > 0.1, "positions should differ"


def test_a_uniform_that_rounds_to_one_never_picks_a_token_of_zero_probability():
    # 1 - 2^-26 rounds to 1.0 in float32: u * total == total, past every token. It used to be
    # clamped to the last vocabulary token whatever its probability (here 0).
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.2, 0.0, 0.8], [0.0, 0.0, 1.0, 0.0]])
    near_one = torch.full((3,), 1 - 2**-26, dtype=torch.float64)
    assert sample_inverse_cdf(probs, near_one).tolist() == [1, 3, 2]
    assert sample_inverse_cdf(probs, torch.zeros(3, dtype=torch.float64)).tolist() == [0, 1, 2]
