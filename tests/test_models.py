"""The model-pair layer: building, verifying, loading, bad input, and the corpus split."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specrl.errors import SpecrlError
from specrl.models import build, corpus, load_pair
from specrl.models.build import SHIPPED_DIR, build_pair, read_manifest, verify_pair_dir


def _pair_dir(paths) -> Path:
    return Path(paths.target_path).parent


def test_load_pair_returns_eval_models_sharing_the_tokenizer(micro_pair, micro_pair_paths):
    assert micro_pair.target_path == micro_pair_paths.target_path
    assert micro_pair.draft_path == micro_pair_paths.draft_path
    assert not micro_pair.target.training and not micro_pair.draft.training
    assert micro_pair.target.dtype == torch.float32
    vocab = build.PRESETS["micro"].vocab_size
    assert micro_pair.target.config.vocab_size == micro_pair.draft.config.vocab_size == vocab
    assert len(micro_pair.tokenizer) == vocab
    assert micro_pair.target.config.num_hidden_layers == build.PRESETS["micro"].target.num_layers
    assert micro_pair.draft.config.num_hidden_layers == build.PRESETS["micro"].draft.num_layers


def test_pair_loads_with_plain_transformers(micro_pair_paths):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for path in (micro_pair_paths.target_path, micro_pair_paths.draft_path):
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert (tokenizer.bos_token, tokenizer.eos_token) == (build.BOS, build.EOS)
        assert model.config.bos_token_id == tokenizer.bos_token_id
        assert model.config.eos_token_id == tokenizer.eos_token_id
        ids = tokenizer("def f(x):\n    return x\n")["input_ids"]
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == "def f(x):\n    return x\n"
        logits = model(input_ids=torch.tensor([ids])).logits
        assert logits.shape == (1, len(ids), model.config.vocab_size)


def test_vocab_mismatch_names_both_sizes(micro_pair_paths, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=300,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path / "other")
    with pytest.raises(SpecrlError, match=r"vocab size 512.*has 300"):
        load_pair(micro_pair_paths.target_path, tmp_path / "other")


def test_missing_and_half_written_dirs_are_clear_errors(micro_pair_paths, tmp_path):
    with pytest.raises(SpecrlError, match="does not exist"):
        load_pair(micro_pair_paths.target_path, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecrlError, match="no config.json"):
        load_pair(micro_pair_paths.target_path, tmp_path / "empty")
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(Path(micro_pair_paths.draft_path) / "config.json", half / "config.json")
    with pytest.raises(SpecrlError, match="could not load the draft model"):
        load_pair(micro_pair_paths.target_path, half)


def test_corrupt_or_incomplete_pair_is_detected_and_rebuilt_identically(micro_pair_paths, tmp_path):
    """Also the determinism test: a rebuild with the same seed has the same sha256 per file."""
    original = _pair_dir(micro_pair_paths)
    expected = read_manifest(original)["files"]
    copy = tmp_path / "pair"
    shutil.copytree(original, copy)
    assert verify_pair_dir(copy, "micro", 0)

    (copy / "target" / "config.json").unlink()
    assert not verify_pair_dir(copy, "micro", 0)
    shutil.copytree(original, copy, dirs_exist_ok=True)
    weights = copy / "draft" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    assert not verify_pair_dir(copy, "micro", 0)
    assert not verify_pair_dir(copy.parent / "nowhere", "micro", 0)

    paths = build_pair("micro", copy, progress=False)
    assert paths.target_path == str(copy / "target")
    assert verify_pair_dir(copy, "micro", 0)
    assert read_manifest(copy)["files"] == expected


def test_valid_pair_is_reused_without_training(micro_pair_paths, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("a valid pair must not be retrained")

    monkeypatch.setattr(build, "_train_pair", no_training)
    out = _pair_dir(micro_pair_paths)
    assert build_pair("micro", out, progress=False).draft_path == micro_pair_paths.draft_path


def test_unknown_preset_is_a_one_line_error():
    message = "unknown preset 'huge'; choose one of: micro, small, micro-draft3, small-draft3"
    with pytest.raises(SpecrlError, match=message):
        build_pair("huge")
    result = subprocess.run(
        [sys.executable, "-m", "specrl.cli", "models", "build", "--preset", "huge"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"specrl: error: {message}\n"


def test_info_json_on_micro(micro_pair_paths, monkeypatch, capsys):
    from specrl.cli import main

    monkeypatch.setenv("SPECRL_HOME", str(_pair_dir(micro_pair_paths).parent.parent))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # timing loops with 2 threads crawl on a busy 2-core machine
    try:
        assert main(["models", "info", "--preset", "micro", "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    report = json.loads(capsys.readouterr().out)
    assert report["target_path"] == micro_pair_paths.target_path
    assert report["draft_path"] == micro_pair_paths.draft_path
    assert set(report["agreement"]) == set(corpus.DOMAINS)
    assert all(0.0 <= v <= 1.0 for v in report["agreement"].values())
    assert 0.0 < report["distinct_4gram_ratio"] <= 1.0
    assert report["target_params"] > report["draft_params"] > 0
    assert report["draft_target_time_ratio_b1"] > 0


def test_held_out_files_are_not_in_the_training_split():
    training = corpus.training_documents()
    held_out = corpus.held_out_files()
    assert len(held_out) >= 20 and len(training) > 20 * len(held_out)
    training_paths = {d.path for d in training}
    assert training_paths.isdisjoint(d.path for d in held_out)
    assert all(corpus.is_held_out(d.path) for d in held_out)
    training_texts = {d.text for d in training}
    assert not any(d.text in training_texts for d in held_out)


def test_held_out_domains_are_deterministic_and_validated():
    for domain in corpus.DOMAINS:
        docs = corpus.held_out_documents(domain)
        assert docs and docs == corpus.held_out_documents(domain)
    assert not any(doc.lstrip().startswith('"""') for doc in corpus.held_out_documents("code"))
    with pytest.raises(SpecrlError, match="unknown domain 'poetry'; choose one of: code, prose,"):
        corpus.held_out_documents("poetry")


def test_split_code_and_prose():
    source = (
        '"""Module doc."""\n# a comment\nx = 1  # trailing\n\n\n'
        'def f():\n    """F doc."""\n    return x\n'
    )
    code, prose = corpus.split_code_and_prose(source)
    assert code == "x = 1  # trailing\n\n\ndef f():\n    return x\n"
    assert prose == "Module doc.\n\na comment\n\ntrailing\n\nF doc."


@pytest.mark.skipif(not (SHIPPED_DIR / "small").exists(), reason="shipped small pair absent")
def test_shipped_small_pair_verifies_and_loads_plainly(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shipped = SHIPPED_DIR / "small"
    assert verify_pair_dir(shipped, "small", 0)
    total = sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file())
    assert total <= 40 * 2**20
    monkeypatch.setenv("SPECRL_HOME", str(tmp_path))
    paths = build_pair("small", progress=False)
    assert paths.target_path == str(shipped / "target")
    copied = build_pair("small", tmp_path / "copy", progress=False)
    assert verify_pair_dir(tmp_path / "copy", "small", 0)
    model = AutoModelForCausalLM.from_pretrained(copied.draft_path)
    tokenizer = AutoTokenizer.from_pretrained(copied.draft_path)
    assert model.config.vocab_size == len(tokenizer) == build.PRESETS["small"].vocab_size


def test_building_into_a_directory_that_is_not_a_pair_is_refused_and_keeps_its_files(tmp_path):
    notes = tmp_path / "d" / "notes" / "thesis.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("x")
    with pytest.raises(SpecrlError, match=r"holds files that are not a specrl pair.*new or empty"):
        build_pair("micro", out=tmp_path / "d")
    assert notes.read_text() == "x"
    (tmp_path / "f").write_text("y")
    with pytest.raises(SpecrlError, match="is a file, not a pair directory"):
        build_pair("micro", out=tmp_path / "f")
    assert (tmp_path / "f").read_text() == "y"
