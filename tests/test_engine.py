"""SpecEngine against independent references, one test per bug class in ANCHORS.md."""

from __future__ import annotations

import random

import numpy as np
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
from specrl.errors import InvalidRequestError

K_MAX = 4
NEW_TOKENS = 128


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def drafts(target):
    return {
        "same": target,
        "noisy": noisy_copy(target, seed=1, scale=0.08),
        "random": tiny_llama(7, layers=1, hidden=32),
    }


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(32, seed=3)


@pytest.fixture(scope="module")
def reference(target, prompts):
    # Requests get different budgets so they leave the batch at different steps.
    budgets = [NEW_TOKENS + (i % 5) * 3 for i in range(len(prompts))]
    return budgets, [hf_greedy(target, p, n) for p, n in zip(prompts, budgets)]


def _serve(target, draft, prompts, budgets, k_schedule, *, max_batch, stagger=False, runner="auto"):
    engine = SpecEngine(target, draft, max_batch=max_batch, max_len=256, k_max=K_MAX, runner=runner)
    ids = {}
    if stagger:
        # Requests join mid-run, two every three steps, while others are decoding.
        arrivals = {}
        for i, (p, n) in enumerate(zip(prompts, budgets)):
            arrivals.setdefault(3 * (i // 2), []).append(
                lambda i=i, p=p, n=n: ids.__setitem__(i, engine.add(p, max_new_tokens=n))
            )
        finished, stats = run_to_completion(engine, k_schedule, arrivals=arrivals)
    else:
        for i, (p, n) in enumerate(zip(prompts, budgets)):
            ids[i] = engine.add(p, max_new_tokens=n)
        finished, stats = run_to_completion(engine, k_schedule)
    return [finished[ids[i]] for i in range(len(prompts))], stats


@pytest.mark.parametrize("k", range(K_MAX + 1))
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_greedy_matches_hf_generate_for_fixed_k(target, drafts, prompts, reference, k, batch):
    budgets, expected = reference
    n = {1: 2, 8: 12, 32: 32}[batch]
    outs, _ = _serve(
        target,
        drafts["noisy"],
        prompts[:n],
        budgets[:n],
        lambda s: k,
        max_batch=batch,
        stagger=batch > 1,
    )
    for i, out in enumerate(outs):
        assert out.token_ids == expected[i], f"request {i} diverged at K={k}, batch {batch}"
        assert out.finish_reason == "length"


@pytest.mark.parametrize(("seed", "runner"), [(0, "auto"), (1, "auto"), (2, "hf")])
def test_greedy_matches_hf_generate_for_random_k_sequences(
    target, drafts, prompts, reference, seed, runner
):
    # runner="hf" calls the models' own forwards; "auto" takes the lean Llama runner.
    budgets, expected = reference
    rng = random.Random(seed)
    schedule = [rng.randint(0, K_MAX) for _ in range(10_000)]
    outs, stats = _serve(
        target,
        drafts["noisy"],
        prompts,
        budgets,
        schedule.__getitem__,
        max_batch=16,
        stagger=True,
        runner=runner,
    )
    assert [o.token_ids for o in outs] == expected
    assert {s.k for s in stats} == set(range(K_MAX + 1))
    assert sum(s.committed for s in stats) == sum(budgets)


@pytest.mark.parametrize("k", range(1, K_MAX + 1))
def test_same_model_draft_accepts_everything(target, drafts, prompts, k):
    budget = 1 + 20 * (k + 1)
    outs, stats = _serve(
        target, drafts["same"], prompts[:8], [budget] * 8, lambda s: k, max_batch=8
    )
    full = [s for s in stats if s.drafted == k * s.batch_size and s.batch_size]
    mean_accepted_length = sum(s.committed for s in full) / sum(s.batch_size for s in full)
    assert mean_accepted_length >= 0.98 * (k + 1)
    assert sum(o.accepted for o in outs) == sum(o.drafted for o in outs)


def test_random_draft_accepts_almost_nothing_and_output_stays_greedy(
    target, drafts, prompts, reference
):
    budgets, expected = reference
    outs, stats = _serve(
        target, drafts["random"], prompts[:8], budgets[:8], lambda s: K_MAX, max_batch=8
    )
    assert [o.token_ids for o in outs] == expected[:8]
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    assert drafted > 1000
    assert accepted / drafted < 0.1


def test_eos_inside_an_accepted_block_ends_the_request_there(target, drafts, prompts, reference):
    budgets, expected = reference
    ref = expected[0]
    # A token whose first occurrence falls in the middle of a K=4 block (positions 1..3 of 5;
    # token 0 comes from the prefill, so blocks start at 1, 6, 11, ...).
    index = next(
        i
        for i, t in enumerate(ref)
        if i >= 1 and (i - 1) % (K_MAX + 1) in (1, 2, 3) and ref.index(t) == i
    )
    eos = ref[index]
    engine = SpecEngine(target, drafts["same"], max_batch=2, max_len=256, k_max=K_MAX)
    rid = engine.add(prompts[0], max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    other = engine.add(prompts[1], max_new_tokens=40)
    finished, stats = run_to_completion(engine, lambda s: K_MAX)
    assert finished[rid].token_ids == ref[: index + 1]
    assert finished[rid].finish_reason == "eos"
    assert finished[other].token_ids == expected[1][:40]
    assert sum(s.committed for s in stats) == index + 1 + 40


def test_max_len_boundary_clamps_k(target, drafts, prompts, reference):
    budgets, expected = reference
    prompt = prompts[2]
    for room, committed, drafted in (
        # 1 token from the prefill + 5 at K=4 with everything accepted, then K clamped to the
        # 3 free positions: 2 draft tokens + 1.
        (9, [6, 3], [4, 2]),
        # 6, then 5 (K=4 fits exactly), then the last free position: K clamped to 0.
        (12, [6, 5, 1], [4, 4, 0]),
    ):
        engine = SpecEngine(
            target, drafts["same"], max_batch=1, max_len=len(prompt) + room, k_max=K_MAX
        )
        rid = engine.add(prompt, max_new_tokens=500)
        finished, stats = run_to_completion(engine, lambda s: K_MAX)
        assert finished[rid].token_ids == expected[2][:room]
        assert finished[rid].finish_reason == "length"
        assert [s.committed for s in stats] == committed
        assert [s.drafted for s in stats] == drafted


def test_prefill_commits_the_first_token_and_may_finish_the_request(
    target, drafts, prompts, reference
):
    budgets, expected = reference
    engine = SpecEngine(target, drafts["same"], max_batch=4, max_len=256, k_max=K_MAX)
    one = engine.add(prompts[0], max_new_tokens=1)
    eos = engine.add(prompts[1], max_new_tokens=50, eos_token_id=expected[1][0])
    rest = engine.add(prompts[2], max_new_tokens=7)
    first = engine.step(K_MAX)
    # Both short requests end on the prefill's token and never reach the decode forward.
    assert first.admitted == 3 and first.batch_size == 1 and first.finished == 2
    assert first.prefill_tokens == len(prompts[0]) + len(prompts[1]) + len(prompts[2])
    assert first.committed == 3 + first.accepted + 1
    done = {f.request_id: f for f in engine.pop_finished()}
    assert done[one].token_ids == expected[0][:1] and done[one].finish_reason == "length"
    assert done[eos].token_ids == expected[1][:1] and done[eos].finish_reason == "eos"
    assert done[one].steps == 0 and done[eos].steps == 0
    finished, _ = run_to_completion(engine, lambda s: K_MAX)
    assert finished[rest].token_ids == expected[2][:7]


def test_no_placeholder_ids_reach_models_or_outputs(target, drafts, prompts):
    seen: list[torch.Tensor] = []

    def record(module, args, kwargs):
        seen.append(kwargs["input_ids"].clone())

    draft = drafts["same"]
    # One-token prompts have nothing to prefill; long and short prompts make ragged inputs.
    batch_prompts = [[5], prompts[0], [9], *prompts[1:4]]
    assert 0 not in {t for p in batch_prompts for t in p}
    hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for m in (target, draft)]
    try:
        k = 3
        budgets = [1 + 10 * (k + 1)] * len(batch_prompts)
        outs, _ = _serve(
            target, draft, batch_prompts, budgets, lambda s: k, max_batch=4, stagger=True
        )
    finally:
        for hook in hooks:
            hook.remove()
    # Every draft token is accepted here (same model), so every id a model ever saw is a prompt
    # or output token: no pad, filler or placeholder id from anywhere else.
    real = {t for p in batch_prompts for t in p} | {t for o in outs for t in o.token_ids}
    fed = {int(t) for ids in seen for t in ids.flatten()}
    assert fed <= real
    assert all(0 <= t < VOCAB for o in outs for t in o.token_ids)


def test_k0_does_not_run_the_draft_and_it_catches_up(target, drafts, prompts):
    calls = []
    draft = drafts["noisy"]
    hook = draft.register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw["input_ids"].shape), with_kwargs=True
    )
    try:
        budgets = [120] * 8
        paused, paused_stats = _serve(
            target, draft, prompts[:8], budgets, lambda s: 0 if s < 30 else 3, max_batch=8
        )
    finally:
        hook.remove()
    assert calls, "the draft never ran after speculation resumed"
    k0_steps = [s for s in paused_stats if s.k == 0]
    assert len(k0_steps) == 30
    first_resumed = next(s for s in paused_stats if s.k > 0)
    assert first_resumed.catchup_tokens > 0
    # The catch-up forward's size: the rows it read for times the widest of them.
    catchup_shapes = [shape for shape in calls if shape[1] > 2]
    assert first_resumed.catchup_padded_tokens == catchup_shapes[0][0] * catchup_shapes[0][1]
    assert first_resumed.catchup_padded_tokens >= first_resumed.catchup_tokens

    steady, steady_stats = _serve(target, draft, prompts[:8], budgets, lambda s: 3, max_batch=8)
    resumed = [s for s in paused_stats if s.k > 0]
    rate_resumed = sum(s.accepted for s in resumed) / sum(s.drafted for s in resumed)
    rate_steady = sum(s.accepted for s in steady_stats) / sum(s.drafted for s in steady_stats)
    assert 0.2 < rate_steady < 0.95, "the noisy draft should agree often, not always"
    assert abs(rate_resumed - rate_steady) < 0.1
    assert [o.token_ids for o in paused] == [o.token_ids for o in steady]


def test_draft_never_runs_at_k0(target, drafts, prompts):
    calls = []
    draft = drafts["noisy"]
    hook = draft.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        _serve(target, draft, prompts[:4], [30] * 4, lambda s: 0, max_batch=4)
    finally:
        hook.remove()
    assert calls == []


def test_sampling_is_seeded_and_independent_of_batch_mates(target, drafts, prompts):
    def sample(batch_prompts, k, seeds):
        engine = SpecEngine(target, drafts["noisy"], max_batch=8, max_len=256, k_max=K_MAX)
        ids = [
            engine.add(p, max_new_tokens=60, temperature=0.9, top_p=0.95, seed=s)
            for p, s in zip(batch_prompts, seeds)
        ]
        finished, _ = run_to_completion(engine, lambda s: k)
        return [finished[i].token_ids for i in ids]

    alone = sample(prompts[:1], 3, [11])[0]
    assert sample(prompts[:1], 3, [11])[0] == alone
    crowded = sample(prompts[:6], 3, [11, 1, 2, 3, 4, 5])[0]
    assert crowded == alone
    assert sample(prompts[:1], 3, [12])[0] != alone


def test_bad_input_is_refused_and_the_engine_keeps_working(target, drafts, prompts, reference):
    budgets, expected = reference
    engine = SpecEngine(
        target, drafts["noisy"], max_batch=2, max_len=64, k_max=K_MAX, max_waiting=3
    )
    kept = engine.add(prompts[0], max_new_tokens=20)
    cases = [
        (lambda: engine.add(list(range(1, 65)), max_new_tokens=5), "max_len"),
        (lambda: engine.add([], max_new_tokens=5), "empty"),
        (lambda: engine.add([1, 2], max_new_tokens=5, temperature=float("nan")), "temperature"),
        (lambda: engine.add([1, 2], max_new_tokens=0), "max_new_tokens"),
        (lambda: engine.add([1, VOCAB], max_new_tokens=5), "vocabulary"),
        (lambda: engine.add([1, 2], max_new_tokens=5, top_p=0.0), "top_p"),
        (lambda: engine.step(K_MAX + 1), "k_max"),
        (lambda: engine.step(-1), "k must be"),
        (lambda: engine.step(2.0), "k must be an integer"),
        (
            lambda: SpecEngine(target, None, max_batch=1, max_len=10**6, k_max=0),
            r"max_len=1000000 exceeds the target's max_position_embeddings \(\d+\); lower",
        ),
        (
            lambda: SpecEngine(target, None, max_batch=1, max_len=8, k_max=0, runner="fast"),
            "runner must be one of",
        ),
    ]
    for call, word in cases:
        with pytest.raises(InvalidRequestError, match=word):
            call()
    engine.add(prompts[1], max_new_tokens=20)
    engine.add(prompts[2], max_new_tokens=20)
    with pytest.raises(InvalidRequestError, match="queue is full"):
        engine.add(prompts[3], max_new_tokens=20)
    finished, _ = run_to_completion(engine, lambda s: np.int64(2))  # a policy's numpy action
    assert len(finished) == 3
    assert finished[kept].token_ids == expected[0][:20]


def test_a_draft_with_fewer_positions_sets_the_pairs_limit(target, drafts, monkeypatch):
    draft = drafts["noisy"]
    assert position_limit(target, draft) == (1024, "target", "max_position_embeddings")
    assert position_limit(target, None) == (1024, "target", "max_position_embeddings")
    monkeypatch.setattr(draft.config, "max_position_embeddings", 96)
    assert position_limit(target, draft) == (96, "draft", "max_position_embeddings")
    assert position_limit(target, None) == (1024, "target", "max_position_embeddings")
    with pytest.raises(
        InvalidRequestError, match=r"max_len=128 exceeds the draft's max_position_embeddings \(96\)"
    ):
        SpecEngine(target, draft, max_batch=1, max_len=128, k_max=2)
    SpecEngine(target, draft, max_batch=1, max_len=96, k_max=2)
    assert position_limit(object()) is None  # a model whose config does not say


def test_target_only_engine_refuses_k_above_zero(target, prompts, reference):
    budgets, expected = reference
    engine = SpecEngine(target, None, max_batch=2, max_len=256, k_max=K_MAX)
    rid = engine.add(prompts[0], max_new_tokens=16)
    with pytest.raises(InvalidRequestError, match="draft"):
        engine.step(1)
    finished, _ = run_to_completion(engine, lambda s: 0)
    assert finished[rid].token_ids == expected[0][:16]


def test_vocabulary_mismatch_is_refused(target):
    with pytest.raises(
        InvalidRequestError,
        match=r"draft vocabulary \(50\).*\(97\); use a draft trained with the target's "
        r"tokenizer, or vocab_padding=True for one tokenizer padded to two sizes",
    ):
        SpecEngine(target, tiny_llama(3, vocab=50), max_batch=1, max_len=32, k_max=2)
    with pytest.raises(InvalidRequestError, match="vocab_padding must be True or False, got 1"):
        SpecEngine(target, target, max_batch=1, max_len=32, k_max=2, vocab_padding=1)


@pytest.mark.parametrize("draft_vocab", [90, 110])
def test_a_draft_padded_to_another_vocab_size_matches_generate(target, draft_vocab):
    """One tokenizer padded to two sizes (Qwen2.5): the draft is a noisy copy of the target
    over the ids they share, so it agrees often; ids it lacks are read as its last id."""
    draft = tiny_llama(0, vocab=draft_vocab)
    with torch.no_grad():
        shared = min(draft_vocab, VOCAB)
        for mine, theirs in zip(draft.parameters(), target.parameters()):
            if mine.shape == theirs.shape:
                mine.copy_(theirs)
        draft.model.embed_tokens.weight[:shared] = target.model.embed_tokens.weight[:shared]
        draft.lm_head.weight[:shared] = target.lm_head.weight[:shared]
    draft = noisy_copy(draft, seed=1, scale=0.08)
    engine = SpecEngine(target, draft, max_batch=4, max_len=96, k_max=3, vocab_padding=True)
    prompts = random_prompts(6, seed=11)
    prompts[0][-1] = VOCAB - 1  # an id a 90-id draft lacks, in the prompt
    ids = [engine.add(p, max_new_tokens=40) for p in prompts]
    finished, stats = run_to_completion(engine, lambda s: (3, 0, 2)[s % 3])
    for rid, p in zip(ids, prompts):
        assert finished[rid].token_ids == hf_greedy(target, p, 40)
    assert 0 < sum(sum(s.row_accepted) for s in stats) < sum(s.drafted for s in stats)
    if draft_vocab < VOCAB:  # the target committed ids the draft lacks
        assert any(t >= draft_vocab for f in finished.values() for t in f.token_ids)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_batch", True),
        ("max_batch", 2.0),
        ("max_len", "32"),
        ("k_max", False),
        ("k_max", -1),
        ("max_waiting", True),
    ],
)
def test_engine_sizes_must_be_integers(target, field, value):
    sizes = {"max_batch": 2, "max_len": 32, "k_max": 2, "max_waiting": 8, field: value}
    with pytest.raises(InvalidRequestError, match=f"{field} must be an integer >= "):
        SpecEngine(target, target, **sizes)


def test_engine_sizes_may_be_numpy_integers(target):
    engine = SpecEngine(target, target, max_batch=np.int64(2), max_len=np.int32(32), k_max=2)
    assert (type(engine.max_batch), type(engine.max_len)) == (int, int)
    rid = engine.add([3, 4, 5], max_new_tokens=4)
    finished, _ = run_to_completion(engine, lambda s: 2)
    assert finished[rid].token_ids == hf_greedy(target, [3, 4, 5], 4)


def test_engine_benchmark_reports_the_stable_keys(tmp_path, micro_pair):
    import json

    from specrl.bench.engine import run_engine_benchmark, write_json

    result = run_engine_benchmark(
        micro_pair,
        batch_sizes=(1, 2),
        k_max=2,
        prompt_len=8,
        new_tokens=6,
        repeats=2,
        min_sample_s=0.05,
        progress=False,
    )
    write_json(result, tmp_path / "bench.json")
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["batch_sizes"] == [1, 2]
    for key in ("k0_vs_hf_generate", "k0_draft_overhead"):
        assert set(data[key]) == {"1", "2"} and all(v > 0 for v in data[key].values())
    assert {b: set(v) for b, v in data["tokens_per_s"].items()} == {
        "1": {"0", "1", "2"},
        "2": {"0", "1", "2"},
    }
    assert data["b1_best_k_vs_hf_assisted"] > 0
    assert data["k_vs_k0"]["2"]["0"] == 1.0
    assert data["repeats"] == 2 and data["min_sample_s"] == 0.05


# ---- mutation gaps


def _peaked_llama(seed: int, scale: float, vocab: int = 8, **kwargs):
    """A tiny model over 8 tokens whose next-token distributions are far from uniform."""
    model = tiny_llama(seed, vocab=vocab, **kwargs)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def _top_p_reference(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """softmax(logits / T) cut to the smallest nucleus whose mass reaches top_p, written
    independently of specrl.engine.sampling."""
    probs = torch.softmax(logits.double() / temperature, -1)
    ordered, order = probs.sort(-1, descending=True)
    keep_ordered = ordered.cumsum(-1) - ordered < top_p
    keep = torch.zeros_like(keep_ordered).scatter(-1, order, keep_ordered)
    probs = probs * keep
    return probs / probs.sum(-1, keepdim=True)


def _chi_square_exceeds(counts: torch.Tensor, probs: torch.Tensor, p_value: float = 1e-6):
    """Pearson's statistic over cells, those expecting fewer than 5 samples pooled, divided by
    its chi-square quantile at ``p_value`` (Wilson-Hilferty); above 1 means "not from probs"."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    c = torch.cat([counts[~small], counts[small].sum().view(1)])
    e = torch.cat([expected[~small], expected[small].sum().view(1)])
    c, e = c[e > 0], e[e > 0]
    statistic = ((c - e) ** 2 / e).sum().item()
    dof = len(e) - 1
    z = {1e-6: 4.7534}[p_value]
    quantile = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    return statistic / quantile


@pytest.mark.parametrize("draft_vocab", [8, 6, 10])
def test_sampled_engine_output_has_the_targets_exact_distribution(draft_vocab):
    """Lossless: 20k seeded requests of 4 tokens with K=2 (one prefill token, then draft
    blocks with acceptance, residual and bonus tokens), temperature 0.6 and top-p 0.9, against
    the target's exact distribution over every pair of consecutive tokens, enumerated with the
    model's own forward. A few greedy requests share the batches and must stay greedy.
    With ``vocab_padding`` the draft has fewer ids than the target (6: it reads ids 6 and 7,
    which the target commits, as 5, and never proposes them) or more (10)."""
    vocab, new, n = 8, 4, 20_000
    temperature, top_p = 0.6, 0.9
    target = _peaked_llama(0, 4.0)
    draft = _peaked_llama(5, 4.0, vocab=draft_vocab, layers=1, hidden=32)
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():  # exact joint distribution of the 4 tokens, prefix by prefix
        joint = torch.ones(1, dtype=torch.float64)
        for length in range(new):
            prefixes = torch.cartesian_prod(*[torch.arange(vocab)] * length) if length else None
            if length == 1:
                prefixes = prefixes.unsqueeze(1)
            context = torch.tensor([prompt]).expand(vocab**length, -1)
            if prefixes is not None:
                context = torch.cat([context, prefixes], 1)
            step = _top_p_reference(
                target(context.to(DEVICE)).logits[:, -1].cpu(), temperature, top_p
            )
            joint = (joint.unsqueeze(1) * step).reshape(-1)
    joint = joint.view(*[vocab] * new)

    engine = SpecEngine(
        target,
        draft,
        max_batch=512,
        max_len=16,
        k_max=2,
        max_waiting=2 * n,
        vocab_padding=draft_vocab != vocab,
    )
    sampled, greedy = [], []
    for i in range(n):
        if i % 1000 == 0:
            greedy.append(engine.add(prompt, max_new_tokens=new))
        sampled.append(
            engine.add(prompt, max_new_tokens=new, temperature=temperature, top_p=top_p, seed=i)
        )
    finished, stats = run_to_completion(engine, lambda s: 2)
    assert sum(s.accepted for s in stats) > 0.2 * sum(s.drafted for s in stats)
    expected_greedy = hf_greedy(target, prompt, new)
    assert all(finished[r].token_ids == expected_greedy for r in greedy)
    tokens = torch.tensor([finished[r].token_ids for r in sampled])
    for j in range(new - 1):
        pair = joint.sum(dim=tuple(d for d in range(new) if d not in (j, j + 1))).reshape(-1)
        counts = torch.bincount(tokens[:, j] * vocab + tokens[:, j + 1], minlength=vocab**2)
        assert int(counts[pair == 0].sum()) == 0, f"impossible pair at tokens {j}, {j + 1}"
        assert _chi_square_exceeds(counts.double(), pair) < 1, f"tokens {j}, {j + 1}"
    if draft_vocab < vocab:  # the target commits ids the draft lacks
        assert int((tokens >= draft_vocab).sum()) > 0.05 * tokens.numel()


def test_greedy_rows_in_a_sampled_batch_match_hf_generate(target, drafts, prompts, reference):
    # Greedy rows that share a step with sampled ones go through the rejection sampler with
    # one-hot distributions and zero uniforms; they must still be exactly greedy.
    budgets, expected = reference
    engine = SpecEngine(target, drafts["noisy"], max_batch=6, max_len=256, k_max=K_MAX)
    greedy = {}
    for i in range(12):
        if i % 2:
            engine.add(prompts[i], max_new_tokens=30 + i, temperature=1.0, seed=i)
        else:
            greedy[i] = engine.add(prompts[i], max_new_tokens=40)
    rng = random.Random(4)
    schedule = [rng.randint(0, K_MAX) for _ in range(10_000)]
    finished, stats = run_to_completion(engine, schedule.__getitem__)
    assert {s.k for s in stats} == set(range(K_MAX + 1))
    for i, rid in greedy.items():
        assert finished[rid].token_ids == expected[i][:40], f"greedy request {i}"


def _check_step_counts(stats):
    for s in stats:
        assert s.drafted == sum(s.row_drafted)
        assert s.accepted == sum(s.row_accepted)
        for i in range(s.k):
            assert s.drafted_per_position[i] == sum(d > i for d in s.row_drafted)
            assert s.accepted_per_position[i] == sum(a > i for a in s.row_accepted)
        assert all(a <= d for a, d in zip(s.row_accepted, s.row_drafted))


def test_same_model_draft_accepts_everything_across_pauses_and_moves(target, prompts, reference):
    # The draft is the target: any draft-cache position that is stale, skipped or lost (in
    # the catch-up after K=0 steps, or when a row moves to a freed slot) shows as a rejection.
    budgets, expected = reference
    outs, stats = _serve(
        target,
        target,
        prompts[:12],
        budgets[:12],
        lambda s: (0, 0, 3, 4, 0, 0, 0, 2, 4, 1, 0, 4, 3)[s % 13],
        max_batch=4,
        stagger=True,
    )
    assert [o.token_ids for o in outs] == expected[:12]
    assert sum(s.drafted for s in stats) > 500
    assert sum(s.accepted for s in stats) == sum(s.drafted for s in stats)
    assert sum(o.accepted for o in outs) == sum(o.drafted for o in outs)
    _check_step_counts(stats)


def test_steady_speculation_needs_no_catch_up_and_counts_per_position(target, prompts):
    engine = SpecEngine(target, target, max_batch=8, max_len=256, k_max=K_MAX)
    for p in prompts[:8]:
        engine.add(p, max_new_tokens=50)
    finished, stats = run_to_completion(engine, lambda s: 3)
    # The first step reads each new prompt (all but its last token, kept for the proposal);
    # afterwards every step leaves the draft at most two unread tokens: no catch-up.
    assert stats[0].catchup_tokens == sum(len(p) for p in prompts[:8] if len(p) >= 2)
    assert [s.catchup_tokens for s in stats[1:]] == [0] * (len(stats) - 1)
    _check_step_counts(stats)


def test_the_token_budget_clamps_k_like_max_len_does(target, prompts, reference):
    budgets, expected = reference
    engine = SpecEngine(target, target, max_batch=1, max_len=256, k_max=K_MAX)
    # 1 token from the prefill + 5 at K=4, then 3 left: 2 draft tokens + 1 (a third draft
    # token could only replace the bonus).
    rid = engine.add(prompts[2], max_new_tokens=9)
    finished, stats = run_to_completion(engine, lambda s: K_MAX)
    assert finished[rid].token_ids == expected[2][:9]
    assert [s.committed for s in stats] == [6, 3]
    assert [s.drafted for s in stats] == [4, 2]
    assert stats[1].drafted_per_position == [1, 1, 0, 0]
    assert (finished[rid].drafted, finished[rid].accepted) == (6, 6)


def test_an_eos_cut_block_still_counts_its_accepted_draft_tokens(target, prompts, reference):
    budgets, expected = reference
    ref = expected[0]
    index = next(
        i
        for i, t in enumerate(ref)
        if i >= 1 and (i - 1) % (K_MAX + 1) in (1, 2, 3) and ref.index(t) == i
    )
    engine = SpecEngine(target, target, max_batch=1, max_len=256, k_max=K_MAX)
    rid = engine.add(prompts[0], max_new_tokens=NEW_TOKENS, eos_token_id=ref[index])
    finished, stats = run_to_completion(engine, lambda s: K_MAX)
    assert finished[rid].token_ids == ref[: index + 1]
    # The same model agrees with every draft token, the ones after the EOS included.
    assert finished[rid].drafted == sum(s.drafted for s in stats) == K_MAX * len(stats)
    assert finished[rid].accepted == finished[rid].drafted


def test_more_bad_input_is_refused_and_leaves_the_engine_unchanged(target, drafts):
    engine = SpecEngine(target, drafts["noisy"], max_batch=2, max_len=64, k_max=K_MAX)
    cases = [
        (lambda: engine.add([1, 2], max_new_tokens=5, temperature=-0.5), "temperature"),
        (lambda: engine.add([1, 2], max_new_tokens=5, eos_token_id=VOCAB), "eos_token_id"),
        (lambda: engine.add([1, 2], max_new_tokens=5, eos_token_id=-1), "eos_token_id"),
        (lambda: engine.add([1, 2], max_new_tokens=5, temperature=1.0, seed="7"), "seed"),
        (lambda: engine.add([1, 2], max_new_tokens=5, temperature=1.0, seed=1.5), "seed"),
        (lambda: engine.step(True), "k must be"),
        # Before: a TypeError, a silent never-matching EOS, a truncated prompt, a bool
        # accepted as a count, and a torch RuntimeError from a bool seed.
        (lambda: engine.add([1, 2], max_new_tokens=5, eos_token_id="3"), "eos_token_id must"),
        (lambda: engine.add([1, 2], max_new_tokens=5, eos_token_id=2.5), "eos_token_id must"),
        (lambda: engine.add([1.7, 2], max_new_tokens=5), r"integer token ids; got 1\.7"),
        (lambda: engine.add([True, 2], max_new_tokens=5), "integer token ids; got True"),
        (lambda: engine.add([1, 2], max_new_tokens=True), "max_new_tokens must"),
        (lambda: engine.add([1, 2], max_new_tokens=5, temperature=1.0, seed=True), "seed"),
    ]
    for call, word in cases:
        with pytest.raises(InvalidRequestError, match=word):
            call()
    assert not engine.has_work and engine.pop_finished() == []
    # numpy integers (a token array's items) are token ids.
    engine.add(np.array([1, 2]), max_new_tokens=1, eos_token_id=np.int64(3), seed=np.int64(4))


def test_a_prompt_one_short_of_max_len_gets_exactly_one_token(target, drafts, reference):
    engine = SpecEngine(target, drafts["noisy"], max_batch=2, max_len=16, k_max=K_MAX)
    prompt = list(range(1, 16))
    rid = engine.add(prompt, max_new_tokens=10)
    finished, stats = run_to_completion(engine, lambda s: K_MAX)
    assert finished[rid].token_ids == hf_greedy(target, prompt, 1)
    assert finished[rid].finish_reason == "length"
    assert [s.committed for s in stats] == [1]


def test_sampled_rows_respect_max_len_and_accept_no_more_than_they_drafted(target, prompts):
    prompt = prompts[2]
    for seed in range(3):
        engine = SpecEngine(target, target, max_batch=1, max_len=len(prompt) + 9, k_max=K_MAX)
        rid = engine.add(prompt, max_new_tokens=500, temperature=1.0, seed=seed)
        finished, stats = run_to_completion(engine, lambda s: K_MAX)
        assert len(finished[rid].token_ids) == 9
        assert finished[rid].finish_reason == "length"
        _check_step_counts(stats)


def test_a_global_forward_hook_sends_forwards_through_the_models_own_modules(
    target, prompts, reference
):
    budgets, expected = reference
    engine = SpecEngine(target, None, max_batch=1, max_len=64, k_max=0)
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(type(module).__name__)
    )
    try:
        rid = engine.add(prompts[0], max_new_tokens=3)
        finished, _ = run_to_completion(engine, lambda s: 0)
    finally:
        handle.remove()
    assert seen.count("LlamaForCausalLM") == 3  # the prefill and two decode steps
    assert finished[rid].token_ids == expected[0][:3]


def test_a_padded_draft_never_proposes_an_id_it_lacks_at_any_temperature():
    """fp16's lowest value divided by a large temperature is no longer "zero probability";
    the padding must be, or the draft is fed an id outside its embedding table."""
    target = tiny_llama(0).half()
    draft = tiny_llama(1, vocab=90).half()
    engine = SpecEngine(target, draft, max_batch=2, max_len=64, k_max=4, vocab_padding=True)
    rids = [engine.add([1, 2, 3], max_new_tokens=30, temperature=t, seed=0) for t in (1e5, 3.0)]
    finished, stats = run_to_completion(engine, lambda s: 4)
    assert sorted(finished) == rids and all(len(finished[r].token_ids) == 30 for r in rids)
    assert sum(s.drafted for s in stats) > 0
