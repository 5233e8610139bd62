"""``specrl bench engine``: SpecEngine against transformers' own generation, side by side.

All figures come from one run on one machine. Every repeat runs each configuration once, the
pairs that are compared next to each other (HF ``generate``, K=0, no draft, then K=1..k_max;
every other repeat in reverse order), after one untimed warm-up repeat. A job shorter than
``min_sample_s`` runs back to back until its sample spans that long, so every sample averages
over a similar stretch of the machine's noise. Tokens/s is the median over repeats; each
ratio is the median of the ratios measured within a repeat, so a busy spell on a shared
machine slows both sides of a ratio instead of one. Engine tokens/s is wall time from
queueing the requests to the last step (the engine and its caches are built beforehand, as a
server builds them once); ``generate`` is timed whole.

1. ``k0_vs_hf_generate``: SpecEngine at K=0 over ``generate(do_sample=False)`` of the target.
2. ``k0_draft_overhead``: an engine with no draft over one at K=0 with the draft loaded.
3. ``tokens_per_s``: SpecEngine tokens/s for every K, per batch size.
4. ``b1_best_k_vs_hf_assisted``: at batch 1, SpecEngine at its best K over
   ``generate(assistant_model=draft)`` (transformers' assisted generation, default schedule).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from specrl import files
from specrl.errors import SpecrlError
from specrl.workload.prompts import token_streams


@dataclass
class EngineBenchmark:
    batch_sizes: list[int]
    k_max: int
    prompt_len: int
    new_tokens: int
    repeats: int
    min_sample_s: float = 0.0
    """Short jobs ran back to back until each sample spanned this many seconds."""
    tokens_per_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """``tokens_per_s[str(batch)][str(k)]``; K as a string for JSON."""
    hf_generate_tokens_per_s: dict[str, float] = field(default_factory=dict)
    no_draft_tokens_per_s: dict[str, float] = field(default_factory=dict)
    hf_assisted_b1_tokens_per_s: float = 0.0
    k0_vs_hf_generate: dict[str, float] = field(default_factory=dict)
    k0_draft_overhead: dict[str, float] = field(default_factory=dict)
    k_vs_k0: dict[str, dict[str, float]] = field(default_factory=dict)
    b1_best_k: int = 0
    b1_best_k_vs_hf_assisted: float = 0.0
    hf_assisted_not_run: str = ""
    """Why the assisted-generation comparison did not run (empty when it ran or batch 1 was
    not measured)."""


def code_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """``n`` equal-length prompts cut from the held-out code stream (no padding needed)."""

    stream = token_streams(tokenizer, domains=("code",))["code"]
    stride = max(length, (len(stream) - length) // max(n, 1))
    return [stream[i * stride : i * stride + length] for i in range(n)]


def _engine_rate(pair, prompts, new_tokens, k, k_max, *, with_draft=True) -> float:
    from specrl.engine import SpecEngine

    engine = SpecEngine(
        pair.target,
        pair.draft if with_draft else None,
        max_batch=len(prompts),
        max_len=len(prompts[0]) + new_tokens + 1,
        k_max=k_max,
        vocab_padding=pair.vocab_padding,
    )
    _sync(engine.device)
    start = time.perf_counter()
    for p in prompts:
        engine.add(p, max_new_tokens=new_tokens)
    committed = 0
    while engine.has_work:
        committed += engine.step(k).committed
    engine.pop_finished()
    _sync(engine.device)
    return committed / (time.perf_counter() - start)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def _hf_rate(pair, prompts, new_tokens, *, assisted: bool = False) -> float:
    model = pair.target
    ids = torch.tensor(prompts, device=model.device)
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        attention_mask=torch.ones_like(ids),
        pad_token_id=pair.tokenizer.eos_token_id,
        eos_token_id=None,
    )
    if assisted:
        kwargs["assistant_model"] = pair.draft
    _sync(model.device)
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    _sync(model.device)
    elapsed = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed


def run_engine_benchmark(
    pair,
    *,
    batch_sizes=(1, 4, 16, 64),
    k_max: int = 4,
    prompt_len: int = 128,
    new_tokens: int = 64,
    repeats: int = 5,
    min_sample_s: float = 0.0,
    progress: bool = True,
) -> EngineBenchmark:
    from specrl.engine import position_limit

    limit = position_limit(pair.target, pair.draft)
    if limit is not None and prompt_len + new_tokens + 1 > limit.positions:
        raise SpecrlError(
            f"--prompt-len {prompt_len} + --new-tokens {new_tokens} + 1 needs "
            f"{prompt_len + new_tokens + 1} positions but {limit.has}; lower --prompt-len or "
            "--new-tokens"
        )
    result = EngineBenchmark(
        list(batch_sizes), k_max, prompt_len, new_tokens, repeats, min_sample_s
    )
    jobs = _jobs(pair, result, batch_sizes, k_max, prompt_len, new_tokens)
    samples = _samples(jobs, repeats, min_sample_s, progress)
    median = {key: statistics.median(v) for key, v in samples.items()}

    def paired(num, den) -> float:
        """Median over repeats of num / den measured in the same repeat."""
        return statistics.median(a / b for a, b in zip(samples[num], samples[den], strict=True))

    for batch in batch_sizes:
        b = str(batch)
        per_k = {str(k): median[(batch, k)] for k in range(k_max + 1)}
        result.tokens_per_s[b] = per_k
        result.hf_generate_tokens_per_s[b] = median[(batch, "hf")]
        result.no_draft_tokens_per_s[b] = median[(batch, "nodraft")]
        result.k0_vs_hf_generate[b] = paired((batch, 0), (batch, "hf"))
        result.k0_draft_overhead[b] = paired((batch, "nodraft"), (batch, 0))
        result.k_vs_k0[b] = {str(k): paired((batch, k), (batch, 0)) for k in range(k_max + 1)}
    if 1 in batch_sizes:
        b1 = result.tokens_per_s["1"]
        best = max(b1, key=b1.get)
        result.b1_best_k = int(best)
    if 1 in batch_sizes and not result.hf_assisted_not_run:
        result.hf_assisted_b1_tokens_per_s = median[(1, "assisted")]
        result.b1_best_k_vs_hf_assisted = paired((1, int(best)), (1, "assisted"))
    return result


def _jobs(pair, result: EngineBenchmark, batch_sizes, k_max, prompt_len, new_tokens) -> list:
    """``(batch, name, run)`` for every measurement: HF generate, the engine at each K, the
    engine without its draft, and at batch 1 HF's assisted generation where it runs."""
    prompts = code_prompts(pair.tokenizer, max(batch_sizes), prompt_len)
    jobs = []
    for batch in batch_sizes:
        rows = prompts[:batch]
        jobs.append((batch, "hf", lambda rows=rows: _hf_rate(pair, rows, new_tokens)))
        jobs.append((batch, 0, lambda rows=rows: _engine_rate(pair, rows, new_tokens, 0, k_max)))
        jobs.append(
            (
                batch,
                "nodraft",
                lambda rows=rows: _engine_rate(pair, rows, new_tokens, 0, k_max, with_draft=False),
            )
        )
        for k in range(1, k_max + 1):
            jobs.append(
                (batch, k, lambda rows=rows, k=k: _engine_rate(pair, rows, new_tokens, k, k_max))
            )
        if batch == 1 and pair.vocab_padding:
            result.hf_assisted_not_run = (
                "transformers' assisted generation refuses a draft padded to another vocab size"
            )
        elif batch == 1:
            jobs.append(
                (1, "assisted", lambda rows=rows: _hf_rate(pair, rows, new_tokens, assisted=True))
            )
    return jobs


def _samples(jobs: list, repeats: int, min_sample_s: float, progress: bool) -> dict:
    """Each job's tokens/s in every repeat after a warm-up one: ``{(batch, name): [rate]}``."""
    samples: dict[tuple, list[float]] = {}
    runs_per_sample: dict[tuple, int] = {}
    bar = tqdm(total=len(jobs) * (repeats + 1), desc="bench engine", disable=not progress)
    for rep in range(repeats + 1):  # repeat 0 is the warm-up
        # Odd repeats run the jobs in reverse, so a machine speeding up or slowing down
        # through a repeat favours neither side of a ratio.
        for batch, name, run in jobs if rep % 2 == 0 else jobs[::-1]:
            if rep == 0:
                started = time.perf_counter()
                run()
                took = time.perf_counter() - started
                runs_per_sample[batch, name] = max(1, math.ceil(min_sample_s / took))
            else:
                # A short job runs back to back until its sample spans min_sample_s, so every
                # sample averages over a similar stretch of the machine's noise.
                rates = [run() for _ in range(runs_per_sample[batch, name])]
                samples.setdefault((batch, name), []).append(len(rates) / sum(1 / r for r in rates))
            bar.update()
    bar.close()
    return samples


def format_report(result: EngineBenchmark) -> str:
    ks = [str(k) for k in range(result.k_max + 1)]
    lines = [
        f"prompt {result.prompt_len} tokens, {result.new_tokens} new tokens per row, greedy; "
        f"medians of {result.repeats} interleaved repeats (samples >= {result.min_sample_s:g} s), "
        "ratios paired within a repeat",
        "",
        "batch  HF generate tok/s  engine K=0 tok/s  K=0 / HF  no-draft / K=0",
    ]
    for b in map(str, result.batch_sizes):
        lines.append(
            f"{b:>5}  {result.hf_generate_tokens_per_s[b]:>17.1f}  "
            f"{result.tokens_per_s[b]['0']:>16.1f}  {result.k0_vs_hf_generate[b]:>8.3f}  "
            f"{result.k0_draft_overhead[b]:>14.3f}"
        )
    lines += [
        "",
        "tokens/s relative to K=0 (engine):",
        "batch  " + "  ".join(f"K={k:<4}" for k in ks),
    ]
    for b in map(str, result.batch_sizes):
        lines.append(f"{b:>5}  " + "  ".join(f"{result.k_vs_k0[b][k]:<6.3f}" for k in ks))
    if result.hf_assisted_b1_tokens_per_s:
        lines += [
            "",
            f"batch 1: engine at best K={result.b1_best_k} "
            f"{result.tokens_per_s['1'][str(result.b1_best_k)]:.1f} tok/s vs HF assisted "
            f"generation {result.hf_assisted_b1_tokens_per_s:.1f} tok/s: "
            f"{result.b1_best_k_vs_hf_assisted:.3f}x",
        ]
    if result.hf_assisted_not_run:
        lines += ["", f"HF assisted generation not run: {result.hf_assisted_not_run}"]
    return "\n".join(lines)


def write_json(result: EngineBenchmark, path: str) -> None:
    """The figures as JSON, written atomically (a stop leaves the old file or none)."""

    files.write_json(path, asdict(result))
