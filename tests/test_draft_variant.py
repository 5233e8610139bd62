"""Draft variants: the base preset's target, byte for byte, with a deeper distilled draft."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from engine_helpers import hf_greedy, run_to_completion

from specrl.engine import SpecEngine
from specrl.models import build, load_default_pair
from specrl.models.build import PRESETS, build_pair, draft_variant, read_manifest, verify_pair_dir


def _pair_dir(paths) -> Path:
    return Path(paths.target_path).parent


def _role_files(pair_dir: Path, role: str) -> dict[str, str]:
    files = read_manifest(pair_dir)["files"]
    return {name: sha for name, sha in files.items() if name.startswith(f"{role}/")}


@pytest.fixture
def micro_home(micro_pair_paths, monkeypatch) -> Path:
    """The session's SPECRL_HOME, which already holds the micro pair (the variants' base)."""
    home = _pair_dir(micro_pair_paths).parent.parent
    monkeypatch.setenv("SPECRL_HOME", str(home))
    return home


@pytest.fixture
def draft3_dir(micro_home) -> Path:
    return _pair_dir(build_pair("micro-draft3", progress=False))


def test_variant_presets_differ_from_their_base_only_in_draft_depth():
    for name, base in (("micro-draft3", "micro"), ("small-draft3", "small")):
        variant = PRESETS[name]
        assert variant.base == base
        assert variant.draft.num_layers == 3
        assert variant == draft_variant(PRESETS[base], 3)
        renamed = {"name": base, "draft": PRESETS[base].draft, "base": None}
        assert replace(variant, **renamed) == PRESETS[base]
    with pytest.raises(ValueError, match="itself a draft variant"):
        draft_variant(PRESETS["micro-draft3"], 4)


def test_micro_draft3_reuses_the_micro_target_and_has_a_3_layer_draft(
    draft3_dir, micro_home, micro_pair_paths
):
    from transformers import AutoConfig

    assert draft3_dir == micro_home / "pairs" / "micro-draft3"
    assert verify_pair_dir(draft3_dir, "micro-draft3", 0)
    manifest = read_manifest(draft3_dir)
    assert manifest["base"] == "micro"
    base_dir = _pair_dir(micro_pair_paths)
    assert _role_files(draft3_dir, "target") == _role_files(base_dir, "target")
    for name in _role_files(base_dir, "target"):
        assert (draft3_dir / name).read_bytes() == (base_dir / name).read_bytes()
    config = AutoConfig.from_pretrained(draft3_dir / "draft")
    assert config.num_hidden_layers == 3
    assert config.hidden_size == PRESETS["micro"].draft.hidden_size
    assert (draft3_dir / "draft" / "tokenizer.json").read_bytes() == (
        base_dir / "target" / "tokenizer.json"
    ).read_bytes()


def test_one_layer_variant_reproduces_the_base_draft_byte_for_byte(
    micro_home, micro_pair_paths, monkeypatch, tmp_path
):
    """The variant path is the base build's distillation: same target, data and seeds, so the
    only difference a deeper variant has is its depth."""
    monkeypatch.setitem(PRESETS, "micro-draft1", draft_variant(PRESETS["micro"], 1))
    paths = build_pair("micro-draft1", tmp_path / "draft1", progress=False)
    assert (
        read_manifest(_pair_dir(paths))["files"]
        == read_manifest(_pair_dir(micro_pair_paths))["files"]
    )


def test_tampered_variant_is_detected_and_rebuilt_identically(draft3_dir, tmp_path):
    """Also the determinism test: a rebuild with the same seed has the same sha256 per file."""
    expected = read_manifest(draft3_dir)["files"]
    copy = tmp_path / "pair"
    shutil.copytree(draft3_dir, copy)
    weights = copy / "target" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    assert not verify_pair_dir(copy, "micro-draft3", 0)
    shutil.copytree(draft3_dir, copy, dirs_exist_ok=True)
    (copy / "draft" / "config.json").write_text("{}")
    assert not verify_pair_dir(copy, "micro-draft3", 0)
    assert not verify_pair_dir(draft3_dir, "micro", 0)

    build_pair("micro-draft3", copy, progress=False)
    assert verify_pair_dir(copy, "micro-draft3", 0)
    assert read_manifest(copy)["files"] == expected


class _Retrained(Exception):
    pass


def test_valid_variant_is_reused_and_one_with_another_target_is_redistilled(
    draft3_dir, monkeypatch, tmp_path
):
    def no_training(*args, **kwargs):
        raise _Retrained

    monkeypatch.setattr(build, "_train_pair", no_training)
    monkeypatch.setattr(build, "_train_variant", no_training)
    assert build_pair("micro-draft3", draft3_dir, progress=False).draft_path == str(
        draft3_dir / "draft"
    )
    # A complete, self-consistent variant whose target is not the base pair's is stale.
    stale = tmp_path / "stale"
    shutil.copytree(draft3_dir, stale)
    (stale / "target" / "generation_config.json").write_text("{}\n")
    manifest = read_manifest(stale)
    manifest["files"] = build._hash_files(stale)
    (stale / build.MANIFEST).write_text(json.dumps(manifest))
    assert verify_pair_dir(stale, "micro-draft3", 0)
    with pytest.raises(_Retrained):
        build_pair("micro-draft3", stale, progress=False)


def test_load_default_pair_micro_draft3_speculates_losslessly(draft3_dir):
    # float64: verifying K+1 tokens at once matches one at a time far below any argmax gap.
    pair = load_default_pair("micro-draft3", dtype=torch.float64)
    assert pair.draft_path == str(draft3_dir / "draft")
    assert pair.draft.config.num_hidden_layers == 3
    engine = SpecEngine(pair.target, pair.draft, max_batch=2, max_len=128, k_max=3)
    prompts = [pair.tokenizer(text)["input_ids"] for text in ("def add(a, b):\n", "import os\n")]
    ids = [engine.add(prompt, max_new_tokens=24) for prompt in prompts]
    finished, stats = run_to_completion(engine, lambda step: 3)
    assert sum(s.drafted for s in stats) > 0
    for request_id, prompt in zip(ids, prompts):
        assert finished[request_id].token_ids == hf_greedy(pair.target, prompt, 24)


def test_profile_fingerprint_tells_the_variant_from_its_base(draft3_dir, micro_pair):
    from specrl.profile.fingerprint import pair_fingerprint

    variant = pair_fingerprint(load_default_pair("micro-draft3"), k_max=3)
    base = pair_fingerprint(micro_pair, k_max=3)
    assert variant["target_sha256"] == base["target_sha256"]
    assert variant["draft_sha256"] != base["draft_sha256"]
    assert variant["draft_id"] == str(draft3_dir / "draft")
