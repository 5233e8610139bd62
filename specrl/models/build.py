"""Build the default draft/target pair from the standard library, offline.

Steps (all seeded; deterministic for a given seed, Python version (the corpus), torch build
and CPU instruction set; training runs on one thread so the core count does not matter): train
a byte-level BPE tokenizer on the training split of :mod:`specrl.models.corpus`, train the
Llama target on next-token loss, then distill the Llama draft from the target (forward KL to
the target's logits; reported to beat data-only training by about 10 points of agreement at
equal time). Both train under bf16 autocast where the CPU computes bf16 natively, else in
float32 (see :func:`training_dtype`), and are saved as fp16 safetensors with
``save_pretrained``, each next to a copy of the tokenizer.

Layout of a pair directory::

    DIR/target/   config.json, model.safetensors, tokenizer files
    DIR/draft/    the same
    DIR/manifest.json   preset, seed, sizes, and the sha256 of every file above

The manifest is written last, so a directory without a valid manifest, or whose files no
longer match it, is half-written or corrupt and gets rebuilt.

Shipped weights: the ``small`` pair is trained once and committed under
``specrl/assets/pairs/small`` (22 MB). Training it takes about an hour on two shared CPU
cores (65 min the first time: 41 min for 3.1M target tokens, 22 min for 3.7M distillation
tokens; 58 min for the README's re-run), far too long to
ask of every user, CI job or test run, while checking the shipped files against their manifest
takes well under a second. ``build_pair("small")`` therefore uses the shipped directory in
place when it verifies; ``force=True`` (``--retrain``) reproduces it.

Draft variants (``micro-draft3``, ``small-draft3``): the base preset's target, copied byte for
byte from its verified pair directory, with a deeper draft (3 layers, the base draft's width)
distilled from it on the base draft's data, steps, learning rate and seeds, so that depth is
the only difference. They are built on demand into ``$SPECRL_HOME/pairs/<name>`` (never
shipped), with the same layout and manifest plus ``base``; a cached variant whose target no
longer matches the base pair's is rebuilt. ``force=True`` redistills the draft only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from specrl.errors import SpecrlError
from specrl.models import corpus

BOS, EOS = "<s>", "</s>"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "assets" / "pairs"


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int


@dataclass(frozen=True)
class Preset:
    """Everything that determines a built pair, besides the seed and the corpus."""

    name: str
    vocab_size: int
    target: ModelShape
    draft: ModelShape
    seq_len: int  # training window, tokens
    batch_size: int  # windows per optimizer step
    target_steps: int
    draft_steps: int
    target_lr: float
    draft_lr: float
    corpus_stride: int  # use every n-th training document (1 = all)
    draft_data: str  # "all": the target's training text; "code": with docstrings/comments removed
    max_position_embeddings: int
    base: str | None = None  # a draft variant: reuse this preset's target, train only the draft

    def __post_init__(self):
        if self.seq_len > self.max_position_embeddings:
            raise ValueError("seq_len must not exceed max_position_embeddings")


def draft_variant(base: Preset, draft_layers: int) -> Preset:
    """``base`` with a ``draft_layers``-deep draft of the same width, distilled from its target."""
    if base.base is not None:
        raise ValueError(f"{base.name} is itself a draft variant; derive from {base.base}")
    return replace(
        base,
        name=f"{base.name}-draft{draft_layers}",
        draft=replace(base.draft, num_layers=draft_layers),
        base=base.name,
    )


PRESETS = {
    "micro": Preset(
        name="micro",
        vocab_size=512,
        target=ModelShape(64, 2, 2, 192),
        draft=ModelShape(32, 1, 2, 96),
        seq_len=128,
        batch_size=8,
        target_steps=60,
        draft_steps=30,
        target_lr=3e-3,
        draft_lr=3e-3,
        corpus_stride=40,
        draft_data="all",
        max_position_embeddings=512,
    ),
    "small": Preset(
        name="small",
        vocab_size=4096,
        target=ModelShape(256, 10, 4, 768),
        draft=ModelShape(192, 1, 4, 512),
        seq_len=512,
        batch_size=8,
        target_steps=750,
        draft_steps=900,
        target_lr=2e-3,
        draft_lr=3e-3,
        corpus_stride=1,
        draft_data="code",
        max_position_embeddings=1024,
    ),
}
# Same target, a 3-layer draft: how acceptance and draft cost grow with the draft's depth.
PRESETS |= {v.name: v for v in (draft_variant(PRESETS[name], 3) for name in ("micro", "small"))}


@dataclass(frozen=True)
class PairPaths:
    target_path: str
    draft_path: str
    preset: str


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise SpecrlError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def specrl_home() -> Path:
    return Path(os.environ.get("SPECRL_HOME") or Path.home() / ".cache" / "specrl")


def default_pair_dir(preset: str) -> Path:
    return specrl_home() / "pairs" / preset


def build_pair(
    preset: str = "small",
    out: str | os.PathLike | None = None,
    *,
    seed: int = 0,
    force: bool = False,
    progress: bool = True,
) -> PairPaths:
    """Return a valid pair directory for ``preset``, building it only when needed.

    Order: ``out`` (default ``$SPECRL_HOME/pairs/<preset>``) if it verifies; else the shipped
    pair (used in place, or copied into ``out`` when ``out`` is given); else train into
    ``out``. ``force`` skips both and retrains. Shipped and cached pairs are seed 0.

    A draft variant first gets its base pair this same way (at the default place), then reuses
    ``out`` only if it also holds exactly that target; ``force`` redistills only the draft.
    """
    spec = get_preset(preset)
    out_dir = Path(out) if out is not None else default_pair_dir(preset)
    _check_replaceable(out_dir)
    if spec.base is not None:
        return _build_variant(spec, out_dir, seed=seed, force=force, progress=progress)
    if not force:
        if verify_pair_dir(out_dir, preset, seed):
            return _paths(out_dir, preset)
        shipped = SHIPPED_DIR / preset
        if seed == 0 and verify_pair_dir(shipped, preset, seed):
            if out is None:
                return _paths(shipped, preset)
            _replace_dir(out_dir, lambda tmp: shutil.copytree(shipped, tmp))
            return _paths(out_dir, preset)
    with _training_cpu_settings():
        _replace_dir(out_dir, lambda tmp: _train_pair(spec, tmp, seed=seed, progress=progress))
    return _paths(out_dir, preset)


def _build_variant(spec: Preset, out_dir: Path, *, seed: int, force: bool, progress: bool):
    base_dir = Path(build_pair(spec.base, seed=seed, progress=progress).target_path).parent
    base_target = _role_files(read_manifest(base_dir), "target")
    if (
        not force
        and verify_pair_dir(out_dir, spec.name, seed)
        and _role_files(read_manifest(out_dir), "target") == base_target
    ):
        return _paths(out_dir, spec.name)
    with _training_cpu_settings():
        _replace_dir(
            out_dir, lambda tmp: _train_variant(spec, base_dir, tmp, seed=seed, progress=progress)
        )
    return _paths(out_dir, spec.name)


@contextlib.contextmanager
def _training_cpu_settings():
    """One thread and flushed subnormals while training.

    One thread makes the result independent of the core count and keeps a shared machine
    usable: spinning OpenMP threads on a contended pair of cores run several times slower
    than one. Subnormals: early bf16 gradients are tiny and run far slower unflushed on x86
    (docs/models.md).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _paths(pair_dir: Path, preset: str) -> PairPaths:
    return PairPaths(str(pair_dir / "target"), str(pair_dir / "draft"), preset)


def _check_replaceable(out_dir: Path) -> None:
    """Refuse a pair directory that holds anything but a pair: building replaces it whole."""
    if out_dir.exists() and not out_dir.is_dir():
        raise SpecrlError(f"{out_dir} is a file, not a pair directory; give a directory path")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise SpecrlError(
            f"{out_dir} holds files that are not a specrl pair (no {MANIFEST}), and building "
            "replaces the whole directory; give a new or empty directory"
        )


def _replace_dir(out_dir: Path, fill) -> None:
    """Fill a temporary sibling of ``out_dir``, then swap it in, so readers never see half.
    :func:`build_pair` has refused an ``out_dir`` that holds anything but a pair."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        fill(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _hash_files(pair_dir: Path) -> dict[str, str]:
    files = sorted(p for sub in ("target", "draft") for p in (pair_dir / sub).rglob("*"))
    return {p.relative_to(pair_dir).as_posix(): _sha256(p) for p in files if p.is_file()}


def _role_files(manifest: dict, role: str) -> dict[str, str]:
    """The manifest's sha256 entries for one role's files (``target`` or ``draft``)."""
    return {k: v for k, v in manifest["files"].items() if k.startswith(f"{role}/")}


def read_manifest(pair_dir: Path) -> dict | None:
    try:
        return json.loads((Path(pair_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def verify_pair_dir(pair_dir: Path, preset: str | None = None, seed: int | None = None) -> bool:
    """True when ``pair_dir`` holds a complete pair whose files match its manifest."""
    manifest = read_manifest(pair_dir)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        return False
    if preset is not None and manifest.get("preset") != preset:
        return False
    if seed is not None and manifest.get("seed") != seed:
        return False
    expected = manifest.get("files")
    return isinstance(expected, dict) and bool(expected) and _hash_files(Path(pair_dir)) == expected


@contextlib.contextmanager
def _seeded(seed: int):
    """Seed torch's global RNG for model init only, restoring the caller's state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _train_pair(spec: Preset, out_dir: Path, *, seed: int, progress: bool) -> None:
    started = time.perf_counter()
    documents = corpus.training_documents()[:: spec.corpus_stride]
    texts = [d.text for d in documents]
    tokenizer = train_tokenizer(texts, spec.vocab_size)
    tokens = _encode_corpus(tokenizer, texts, progress)
    fast = _hf_tokenizer(tokenizer, spec)

    with _seeded(seed):
        target = _new_model(spec, spec.target, fast)
    _train(
        target,
        None,
        tokens,
        spec,
        spec.target_steps,
        spec.target_lr,
        torch.Generator().manual_seed(seed),
        desc=f"{spec.name}: target",
        progress=progress,
    )
    # Distill from the target exactly as shipped, with its own data stream, so the draft can be
    # retrained from a saved target with the same result (_train_variant does).
    target = _as_saved(target)
    _distill_and_save(spec, target, tokenizer, fast, texts, tokens, out_dir, seed, progress)
    _save(target, fast, out_dir / "target")  # after: saving casts the model in place
    _write_manifest(out_dir, spec, seed=seed, tokens=tokens, started=started)


def _save(model, fast, where: Path) -> None:
    """A model in fp16 safetensors with the tokenizer beside it (``.to`` casts ``model`` in
    place)."""
    model.to(torch.float16).save_pretrained(where)
    fast.save_pretrained(where)


def _distill_and_save(spec, target, tokenizer, fast, texts, tokens, out_dir, seed, progress):
    """Distill ``spec.draft`` from ``target`` (as saved) and write it to ``out_dir/draft``:
    the same for a pair and for a draft variant."""
    draft = distill_draft(
        spec,
        target,
        fast,
        draft_tokens(spec, tokenizer, texts, tokens),
        seed=seed,
        progress=progress,
    )
    _save(draft, fast, out_dir / "draft")


def _train_variant(spec: Preset, base_dir: Path, out_dir: Path, *, seed: int, progress: bool):
    """Copy the base pair's target and distill ``spec.draft`` from it, as :func:`_train_pair`
    would: the saved fp16 target is what the base draft was distilled from, and the training
    text, its tokenization and the draft's seeds are the same."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    shutil.copytree(base_dir / "target", out_dir / "target")
    copied = _role_files({"files": _hash_files(out_dir)}, "target")
    if copied != _role_files(read_manifest(base_dir), "target"):
        raise SpecrlError(
            f"the target copied from {base_dir} does not match its manifest; "
            f"rebuild the base pair (specrl models build --preset {spec.base} --retrain)"
        )
    tokenizer = Tokenizer.from_file(str(out_dir / "target" / "tokenizer.json"))
    fast = _hf_tokenizer(tokenizer, spec)
    target = _as_saved(AutoModelForCausalLM.from_pretrained(out_dir / "target"))
    texts = [d.text for d in corpus.training_documents()[:: spec.corpus_stride]]
    tokens = _encode_corpus(tokenizer, texts, progress)
    _distill_and_save(spec, target, tokenizer, fast, texts, tokens, out_dir, seed, progress)
    _write_manifest(out_dir, spec, seed=seed, tokens=tokens, started=started, base=spec.base)


def _write_manifest(out_dir: Path, spec: Preset, *, seed, tokens, started, **extra) -> None:
    """Written last: its presence with matching hashes is what makes the directory valid."""
    manifest = {
        "format": FORMAT_VERSION,
        "preset": spec.name,
        **extra,
        "seed": seed,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "training_dtype": str(training_dtype()).removeprefix("torch."),
        "training_tokens_in_corpus": int(tokens.size),
        "build_seconds": round(time.perf_counter() - started, 1),
        "spec": asdict(spec),
        "files": _hash_files(out_dir),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def training_dtype() -> torch.dtype:
    """bf16 (autocast) where the CPU has bf16 instructions (AVX512-BF16 or AMX), else float32.

    Elsewhere bf16 is emulated and far slower than float32 (docs/models.md). The two give
    different weights, so the choice is part of what a build is deterministic for (in the
    manifest).
    """
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if native else torch.float32


def _as_saved(model):
    """``model`` in float32 with every tensor rounded through fp16, as the pair is saved.

    Buffers too: a loaded model recomputes the rotary ``inv_freq`` in float32, which shifts
    the logits slightly and so the distilled draft; rounding both ways makes them agree.
    """
    return model.to(torch.float16).float().eval()


def draft_tokens(spec: Preset, tokenizer, texts: list[str], tokens: np.ndarray) -> np.ndarray:
    """What the draft is distilled on. A code-only draft (``draft_data="code"``) is a
    domain-specialised drafter, as deployments use: it agrees with the target on code and less
    on English prose, so acceptance differs by domain as it does with real pairs."""
    if spec.draft_data == "all":
        return tokens
    if spec.draft_data == "code":
        return _encode_corpus(tokenizer, [corpus.split_code_and_prose(t)[0] for t in texts], False)
    raise ValueError(f"draft_data must be 'all' or 'code', got {spec.draft_data!r}")


def distill_draft(
    spec: Preset, target, tokenizer, tokens: np.ndarray, *, seed: int, progress: bool
):
    """A fresh draft trained on forward KL to ``target``'s logits over the training tokens."""
    with _seeded(seed + 1):
        draft = _new_model(spec, spec.draft, tokenizer)
    return _train(
        draft,
        target,
        tokens,
        spec,
        spec.draft_steps,
        spec.draft_lr,
        torch.Generator().manual_seed(seed + 1),
        desc=f"{spec.name}: draft (distill)",
        progress=progress,
    )


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with ``<s>`` prepended on encode (as Llama tokenizers do)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def _hf_tokenizer(tokenizer, spec: Preset):
    """The transformers wrapper saved next to each model (built, not loaded, so that the saved
    files are the same whether the pair or only a draft variant is trained)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS)
    fast.model_max_length = spec.max_position_embeddings
    return fast


def _encode_corpus(tokenizer, texts: list[str], progress: bool) -> np.ndarray:
    """One flat array: ``<s> doc </s> <s> doc </s> ...``."""
    eos_id = tokenizer.token_to_id(EOS)
    encoded = tokenizer.encode_batch(texts)
    parts = [np.asarray(e.ids + [eos_id], dtype=np.int32) for e in encoded]
    return np.concatenate(parts)


def _new_model(spec: Preset, shape: ModelShape, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config)


def _train(model, teacher, tokens, spec, steps, peak_lr, generator, *, desc, progress):
    """Next-token training (``teacher=None``) or distillation: forward KL to teacher logits."""
    from tqdm.auto import tqdm

    model.train()
    if teacher is not None:
        teacher.eval()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=peak_lr,
        betas=(0.9, 0.95),
    )
    warmup = max(1, steps // 20)
    dtype = training_dtype()
    data = torch.from_numpy(tokens.astype(np.int64))
    window = spec.seq_len + 1
    bar = tqdm(range(steps), desc=desc, disable=not progress, unit="step", dynamic_ncols=True)
    for step in bar:
        lr = peak_lr * min(1.0, (step + 1) / warmup)
        if step >= warmup:
            frac = (step - warmup) / max(1, steps - warmup)
            lr = peak_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, data.numel() - window, (spec.batch_size,), generator=generator)
        batch = torch.stack([data[s : s + window] for s in starts.tolist()])  # [B, T+1]
        inputs, labels = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=inputs).logits  # [B, T, V]
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(input_ids=inputs).logits  # [B, T, V]
        logits = logits.float()
        if teacher is None:
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), labels.reshape(-1)
            )
        else:
            teacher_logp = torch.log_softmax(teacher_logits.float(), dim=-1)
            loss = torch.nn.functional.kl_div(
                torch.log_softmax(logits, dim=-1).reshape(-1, logits.size(-1)),
                teacher_logp.reshape(-1, logits.size(-1)),
                log_target=True,
                reduction="batchmean",
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.1e}")
    model.eval()
    return model
