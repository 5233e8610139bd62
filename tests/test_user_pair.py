"""Your own pair: prompts files, traces built from them, `specrl profile --target --draft
--prompts`, and `--device cuda` where no GPU is visible."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from specrl.cli import main
from specrl.device import require_device
from specrl.errors import SpecrlError
from specrl.profile import load_profile
from specrl.workload import load_trace, preset_trace, resolve_prompt
from specrl.workload.trace import LengthDist
from specrl.workload.user_prompts import load_prompts, prompts_trace, tokenize_prompts

PROMPTS = [
    {"prompt": "def add(a, b):\n    return a + b\n", "domain": "sql", "max_new_tokens": 6},
    {"prompt": "Write a haiku about the sea.", "temperature": 0.7, "top_p": 0.9},
    {"prompt": "SELECT name FROM users WHERE", "domain": "sql", "temperature": 1.0},
]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")


def _write(tmp_path: Path, text: str | bytes, name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _jsonl(rows) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


GOOD = '{"prompt": "a"}\n'


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (GOOD + "not json\n", 2, r"not a JSON object.*JSON Lines: one object per line"),
        ('{\n  "prompt": "a"\n}\n', 1, r"not a JSON object.*over several lines\?.*JSON Lines"),
        (GOOD + "[1, 2]\n", 2, r"a JSON list, not an object.*JSON Lines"),
        (GOOD + "\n\n" + '{"domain": "sql"}\n', 4, r'missing "prompt"; every line needs one'),
        (GOOD + '{"prompt": ""}\n', 2, r'"prompt" is empty; give the prompt text'),
        (GOOD + '{"prompt": "   "}\n', 2, r'"prompt" is only whitespace; give the prompt text'),
        (GOOD + '{"prompt": "a\\ud800b"}\n', 2, r'"prompt" is not valid Unicode \(surrogates'),
        ('{"prompt": 5}\n', 1, r'"prompt" must be a string, got int'),
        ('{"prompt": null}\n', 1, r'"prompt" must be a string, got null'),
        (
            GOOD + '{"prompt": "a", "temperature": "hot"}\n',
            2,
            r'"temperature" must .*got "hot"',
        ),
        ('{"prompt": "a", "temperature": NaN}\n', 1, r'"temperature" must be a finite number'),
        ('{"prompt": "a", "temperature": -0.5}\n', 1, r'"temperature" must be >= 0'),
        ('{"prompt": "a", "top_p": 0}\n', 1, r'"top_p" must be in \(0, 1\]'),
        ('{"prompt": "a", "top_p": 1.5}\n', 1, r'"top_p" must be in \(0, 1\]'),
        ('{"prompt": "a", "max_new_tokens": 0}\n', 1, r'"max_new_tokens" must be an integer'),
        ('{"prompt": "a", "max_new_tokens": 2.5}\n', 1, r'"max_new_tokens" must be an integer'),
        (
            '{"prompt": "a", "max_new_tokens": true}\n',
            1,
            r'"max_new_tokens" .*got true$',
        ),
        ('{"prompt": "a", "domain": "a b"}\n', 1, r"domain 'a b' is not a valid name; use"),
        ('{"prompt": "a", "domain": 7}\n', 1, r"domain 7 is not a valid name"),
        (GOOD * 2 + '{"prompt": "a", "temprature": 1}\n', 3, r"unknown key 'temprature'"),
        (GOOD.encode() + b'{"prompt": "\xff"}\n', 2, r"not UTF-8 text.*save the file as UTF-8"),
    ],
)
def test_bad_prompts_file_names_the_line_and_the_fix(tmp_path, text, line, message):
    path = _write(tmp_path, text)
    with pytest.raises(SpecrlError, match=message) as err:
        load_prompts(path)
    assert f"{path}, line {line}:" in str(err.value)


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_empty_prompts_file_is_refused(tmp_path, text):
    with pytest.raises(SpecrlError, match=r"has no prompts.*one JSON object per line"):
        load_prompts(_write(tmp_path, text))


def test_missing_prompts_file(tmp_path):
    with pytest.raises(SpecrlError, match=r"prompts file .*none.jsonl not found"):
        load_prompts(tmp_path / "none.jsonl")


def test_prompts_file_defaults_lines_and_groups(tmp_path):
    text = "\ufeff" + json.dumps(PROMPTS[0]) + "\n\n" + _jsonl(PROMPTS[1:])
    prompts = load_prompts(_write(tmp_path, text))
    first, second, third = prompts.prompts
    assert [p.line for p in prompts.prompts] == [1, 3, 4]
    assert (first.domain, first.temperature, first.top_p, first.max_new_tokens) == (
        "sql",
        0.0,
        1.0,
        6,
    )
    assert (second.domain, second.temperature, second.top_p, second.max_new_tokens) == (
        "user",
        0.7,
        0.9,
        None,
    )
    assert prompts.domains == ("sql", "user")
    assert prompts.bands == ("greedy", "chat", "default")
    assert [p.band for p in prompts.prompts] == ["greedy", "chat", "default"]
    assert prompts.record()["count"] == 3 and len(prompts.sha256) == 64


def test_file_output_lengths_count_lines_without_one_at_the_presets_lengths(tmp_path):
    from specrl.workload.user_prompts import file_output_lengths

    given = _jsonl([{"prompt": "a", "max_new_tokens": n} for n in (10, 20, 40)])
    assert file_output_lengths(load_prompts(_write(tmp_path, given))) == LengthDist(
        median=20.0, sigma=round(float(np.std(np.log([10, 20, 40]))), 4), lo=10, hi=40
    )
    assert file_output_lengths(load_prompts(_write(tmp_path, GOOD * 3))) is None
    # Lines without one: the presets' lengths at the quantiles 1/6, 1/2 and 5/6.
    mixed = _write(tmp_path, given + GOOD * 3)
    drawn = [round(48 * np.exp(0.6 * z)) for z in (-0.967422, 0.0, 0.967422)]
    assert drawn == [27, 48, 86]
    lengths = [10, 20, 40, *drawn]
    assert file_output_lengths(load_prompts(mixed)) == LengthDist(
        median=float(np.median(lengths)),
        sigma=round(float(np.std(np.log(lengths))), 4),
        lo=8,
        hi=160,
    )


def test_trace_from_prompts_file(micro_pair, tmp_path):
    prompts = load_prompts(_write(tmp_path, _jsonl(PROMPTS)))
    tok = micro_pair.tokenizer
    trace = prompts_trace(prompts, tok, preset="poisson", seed=5, n_requests=5)
    drawn = preset_trace("poisson", seed=5, n_requests=5)
    order = [0, 1, 2, 0, 1]
    assert [r.domain for r in trace.requests] == ["sql", "user", "sql", "sql", "user"]
    assert [r.temperature for r in trace.requests] == [0.0, 0.7, 1.0, 0.0, 0.7]
    assert [r.top_p for r in trace.requests] == [1.0, 0.9, 1.0, 1.0, 0.9]
    lengths = [len(tok.encode(PROMPTS[i]["prompt"])) for i in order]
    assert [r.prompt_len for r in trace.requests] == lengths
    # max_new_tokens from the file where given, else the preset's draw for that request.
    expected = [6 if i == 0 else d.max_new_tokens for i, d in zip(order, drawn.requests)]
    assert [r.max_new_tokens for r in trace.requests] == expected
    assert [r.arrival_s for r in trace.requests] == [r.arrival_s for r in drawn.requests]
    assert trace.load == drawn.load
    assert trace.domains == {"sql": 0.6, "user": 0.4}
    assert trace.sampling == {"greedy": 0.4, "chat": 0.4, "default": 0.2}
    assert trace.prompts["domains"] == ["sql", "user"]
    # The references resolve to the prompts' own tokens.
    streams = tokenize_prompts(prompts, tok).streams
    assert [resolve_prompt(streams, r) for r in trace.requests] == [
        tok.encode(PROMPTS[i]["prompt"]) for i in order
    ]
    trace.save(tmp_path / "t.json")
    assert load_trace(tmp_path / "t.json").to_json() == trace.to_json()
    closed = prompts_trace(prompts, tok, preset="ramp", peak=4)
    assert len(closed.requests) == 3
    assert closed.load == preset_trace("ramp", n_requests=3, peak=4).load


def test_trace_may_only_use_its_prompts_files_domains(micro_pair, tmp_path):
    prompts = load_prompts(_write(tmp_path, _jsonl(PROMPTS)))
    obj = prompts_trace(prompts, micro_pair.tokenizer).to_json()
    obj["requests"][0]["domain"] = "code"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(SpecrlError, match=r"requests\[0\]\.domain: unknown domain 'code'"):
        load_trace(path)


def test_workload_command_builds_a_trace_from_prompts(micro_pair_paths, tmp_path, capsys):
    path = _write(tmp_path, _jsonl(PROMPTS))
    out = tmp_path / "trace.json"
    args = ["workload", "--prompts", str(path), "--out", str(out)]
    assert main(args) == 2
    assert "--prompts needs --tokenizer" in capsys.readouterr().err
    assert (
        main(
            [
                *args,
                "--tokenizer",
                micro_pair_paths.target_path,
                "--preset",
                "steady-8",
                "--peak",
                "2",
            ]
        )
        == 0
    )
    trace = load_trace(out)
    assert [r.domain for r in trace.requests] == ["sql", "user", "sql"]
    assert trace.load == {"kind": "closed", "schedule": [[0, 2]]}


@NO_GPU
def test_device_cuda_without_a_gpu_fails_before_any_model_loads(tmp_path, capsys, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("a model was built or loaded")

    monkeypatch.setattr("specrl.models.build.build_pair", no_build)
    expected = (
        "--device cuda: no CUDA device is visible to torch (torch.cuda.is_available() is "
        "False); run on a GPU machine or use --device cpu"
    )
    out = str(tmp_path / "p.json")
    assert main(["profile", "--device", "cuda", "--out", out]) == 2
    assert expected in capsys.readouterr().err
    missing = str(tmp_path / "nowhere")
    args = ["profile", "--target", missing, "--draft", missing, "--device", "cuda", "--out", out]
    assert main(args) == 2
    assert expected in capsys.readouterr().err
    with pytest.raises(SpecrlError, match=r"--device cuda:1: no CUDA device is visible"):
        require_device("cuda:1")
    with pytest.raises(SpecrlError, match=r"--device gpu: not a torch device"):
        require_device("gpu")
    require_device("cpu")


def test_profile_of_a_given_pair_on_your_prompts(micro_pair_paths, micro_pair, tmp_path, capsys):
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    prompts = _write(tmp_path, _jsonl(PROMPTS))
    out = tmp_path / "mine.json"
    grid = ["--batch-sizes", "1", "--contexts", "8", "--reps", "1", "--k-max", "2"]
    args = ["profile", "--target", target, "--draft", draft, "--prompts", str(prompts)]
    assert main([*args, *grid, "--acceptance-rows", "2", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert list(profile.acceptance) == ["sql", "user"]
    assert profile.bands == ["greedy", "chat", "default"]
    assert (profile.fingerprint["target_id"], profile.fingerprint["draft_id"]) == (target, draft)
    assert profile.meta["prompts"]["file"] == str(prompts)
    # Its rows came from the file: nothing a check can rebuild, so no cell medians.
    assert profile.cell_s is None and profile.cell_spread is None
    assert profile.meta["preset"] is None
    # sql has a greedy and a default prompt; its chat group ran at the band's own setting.
    assert profile.meta["prompt_counts"] == {
        "sql": {"greedy": 1, "chat": 0, "default": 1},
        "user": {"greedy": 0, "chat": 1, "default": 0},
    }
    for by_band in profile.acceptance_counts.values():
        assert all(c["drafted_per_position"][0] > 0 for c in by_band.values())
    # The file's lengths: its prompts in target tokens, and the one max_new_tokens given.
    from specrl.workload.user_prompts import fitted_lengths, load_prompts, tokenize_prompts

    ids = tokenize_prompts(load_prompts(prompts), micro_pair.tokenizer).ids
    assert profile.meta["prompt_lengths_dist"] == dataclasses.asdict(
        fitted_lengths([len(t) for t in ids])
    )
    # One line gives max_new_tokens (6); the other two count at the presets' output lengths
    # (median 48, sigma 0.6) at their quartiles, 32 and 72 tokens, as a trace of the file
    # would draw them; the bounds reach the presets' 8-160.
    sigma = round(float(np.std(np.log([6, 32, 72]))), 4)
    assert profile.meta["output_lengths_dist"] == {
        "median": 32.0,
        "sigma": sigma,
        "lo": 6,
        "hi": 160,
    }
    # The surrogate (and so `specrl train`) runs its presets on the file's domains, bands
    # and lengths.
    from specrl.envs import SurrogateSpecEnv

    env = SurrogateSpecEnv(profile=out, workload="ramp", max_batch=8)
    env.reset(seed=0)
    assert {r.domain for r in env.trace.requests} == {"sql", "user"}
    lo, hi = min(len(t) for t in ids), max(len(t) for t in ids)
    assert all(lo <= r.prompt_len <= hi for r in env.trace.requests)
    outputs = [r.max_new_tokens for r in env.trace.requests]
    assert 6 <= min(outputs) and max(outputs) <= 160 and len(set(outputs)) > 3
    done = False
    while not done:
        *_, done, _, _ = env.step(2)
    # The live env serves the held-out corpus: a profile of your prompts is refused there,
    # before any timing, unless your prompts' token streams are given.
    from specrl.envs import LiveSpecEnv

    with pytest.raises(SpecrlError, match="measured on the prompts file .* without --prompts"):
        LiveSpecEnv(pair=micro_pair, profile=out, k_max=2, max_batch=8)
    capsys.readouterr()
    assert main(["profile", "--show", str(out)]) == 0
    assert f"target {target}, draft {draft}; acceptance on {prompts}" in capsys.readouterr().out


def test_profile_refuses_a_draft_of_another_vocabulary_before_loading_weights(
    micro_pair_paths, tmp_path, capsys
):
    from transformers import LlamaConfig

    # A config and no weights: the refusal must come from the configs alone.
    LlamaConfig(vocab_size=300, hidden_size=16, num_attention_heads=2).save_pretrained(
        tmp_path / "other"
    )
    args = ["profile", "--target", micro_pair_paths.target_path, "--draft"]
    assert main([*args, str(tmp_path / "other"), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "must share a vocabulary" in err and "vocab size 512" in err and "has 300" in err
    assert not (tmp_path / "p.json").exists()


def test_profile_pair_options_go_together(micro_pair_paths, tmp_path, capsys):
    out = ["--out", str(tmp_path / "p.json")]
    assert main(["profile", "--target", micro_pair_paths.target_path, *out]) == 2
    assert "give --target and --draft together" in capsys.readouterr().err
    pair = ["--target", micro_pair_paths.target_path, "--draft", micro_pair_paths.draft_path]
    assert main(["profile", *pair, "--preset", "micro", *out]) == 2
    assert "not both" in capsys.readouterr().err


def _stale(source: Path, out: Path, factor: float) -> None:
    """A copy of profile ``source`` whose step times are ``factor`` times its own."""
    data = json.loads(source.read_text())
    for key in ("verify_s", "draft_s", "overhead_s", "cell_s"):
        data[key] = (np.asarray(data[key]) * factor).tolist()
    out.write_text(json.dumps(data))


TINY_GRID = ["--batch-sizes", "1", "--contexts", "8", "--reps", "1", "--k-max", "2"]


def test_check_times_the_pair_the_profile_names(micro_pair_paths, tmp_path, capsys):
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    mine = tmp_path / "mine.json"
    pair = ["--target", target, "--draft", draft]
    assert main(["profile", *pair, *TINY_GRID, "--acceptance-rows", "2", "--out", str(mine)]) == 0
    # Without --target/--draft the check loads the pair the profile names (not the default
    # small pair): ten times the measured step times reads stale, and the command it names
    # re-measures this pair.
    stale = tmp_path / "stale.json"
    _stale(mine, stale, 10.0)
    capsys.readouterr()
    assert main(["profile", "--check", str(stale)]) == 1
    printed = capsys.readouterr().out
    assert "| 1 | 0 |" in printed and "now / profile" in printed
    assert f"re-measure with `specrl profile --target {target} --draft {draft} --out" in printed
    # Another pair's weights: refused before any timing, naming the profile's pair.
    assert main(["profile", "--check", str(mine), "--preset", "small"]) == 2
    captured = capsys.readouterr()
    assert f"measured on another target and draft (target {target}, draft {draft};" in captured.err
    assert "now / profile" not in captured.out
    # Moved: the pair's directories are gone, so it says to pass --target and --draft.
    moved = json.loads(mine.read_text())
    moved["fingerprint"]["target_id"] = str(tmp_path / "gone")
    (tmp_path / "moved.json").write_text(json.dumps(moved))
    assert main(["profile", "--check", str(tmp_path / "moved.json")]) == 2
    err = capsys.readouterr().err
    assert f"target directory {tmp_path / 'gone'} does not exist" in err
    assert "where they are elsewhere now, pass --target and --draft" in err


def test_check_of_a_preset_profile_loads_that_preset(micro_pair_paths, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRL_HOME", str(Path(micro_pair_paths.target_path).parents[2]))
    out = tmp_path / "micro.json"
    grid = [*TINY_GRID, "--acceptance-rows", "2"]
    assert main(["profile", "--preset", "micro", *grid, "--out", str(out)]) == 0
    _stale(out, tmp_path / "stale.json", 10.0)
    # The profile says preset micro; before, the check timed the small pair against it.
    assert main(["profile", "--check", str(tmp_path / "stale.json")]) == 1


def test_profile_refuses_contexts_beyond_the_targets_positions(
    micro_pair_paths, tmp_path, capsys, monkeypatch
):
    import specrl.profile.timing as timing

    timed = []
    monkeypatch.setattr(timing, "TimingCell", lambda *a, **k: timed.append(1))
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    out = tmp_path / "p.json"
    argv = ["profile", "--target", target, "--draft", draft, "--acceptance-rows", "1"]
    # A cell's rows generate 2 + 3 + 1 * (1 + 1 + 1 + 3 + 2 + 3) = 16 tokens at K=2, one
    # round, which leaves 512 - 16 = 496 positions for the prompt.
    grid = ["--batch-sizes", "1", "--reps", "1", "--k-max", "2", "--contexts"]
    assert main([*argv, *grid, "8,497", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs 513 positions (prompt + output) but the target has 512" in err
    assert "(max_position_embeddings): use shorter --contexts (at most 496 at --k-max 2" in err
    assert timed == [] and not out.exists()
    # The default grid, one context: its cells above batch 8 step each K>0 twice a round, so
    # 2 + 5 + 5 * (1 + 1 + 1 + 5 + 2 * (2 + 3 + 4 + 5)) = 187 tokens at K=4, five rounds.
    assert main([*argv, "--contexts", "396", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs 583 positions" in err and "(at most 325 at --k-max 4 --reps 5)" in err
    assert timed == [] and not out.exists()


def test_profile_runs_contexts_that_fill_the_targets_positions_exactly(
    micro_pair_paths, tmp_path, monkeypatch
):
    """496 + 16 = 512: the cell's engine is sized to the target's 512 positions, not past
    them, and no row's K is cut by that size (the engine stops K at the token budget)."""
    import specrl.profile.timing as timing

    made, stepped = [], []
    real_engine = timing.build_engine

    def engine(pair, **kw):
        made.append(kw["max_len"])
        e = real_engine(pair, **kw)
        step = e.step

        def spy(k):
            stats = step(k)
            stepped.append((kw["max_len"], k, stats.row_drafted))
            return stats

        e.step = spy
        return e

    monkeypatch.setattr(timing, "build_engine", engine)
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    grid = ["--batch-sizes", "1", "--reps", "1", "--k-max", "2", "--contexts", "8,496"]
    out = tmp_path / "p.json"
    argv = ["profile", "--target", target, "--draft", draft, "--acceptance-rows", "1", *grid]
    assert main([*argv, "--out", str(out)]) == 0
    assert len(load_profile(out).contexts) == 2
    assert max(made) == 512 and 8 + 16 + 4 in made  # room where the pair has it
    # Each replica's admission on a lone engine (one step), then, built again, its admission,
    # its catch-up at K=2 and one round of _round(2).
    cell = [(k, drafted) for max_len, k, drafted in stepped if max_len == 512]
    replicas = timing.REPLICAS
    assert sorted(k for k, _ in cell) == sorted([0, 0, 2, *timing._round(2)] * replicas)
    assert all(drafted == [k] for k, drafted in cell)


def test_profile_refuses_a_pair_too_short_for_the_corpus_before_timing(
    micro_pair_paths, tmp_path, capsys, monkeypatch
):
    """The held-out corpus's acceptance pass draws prompts and outputs of up to 160 tokens
    each; a pair without room for both fails before the timing, not after it."""
    import specrl.profile.timing as timing

    timed = []
    monkeypatch.setattr(timing, "TimingCell", lambda *a, **k: timed.append(1))
    target = tmp_path / "short-target"
    shutil.copytree(micro_pair_paths.target_path, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 300}))
    grid = ["--batch-sizes", "1", "--contexts", "8", "--reps", "1", "--k-max", "2"]
    argv = ["profile", "--target", str(target), "--draft", micro_pair_paths.draft_path, *grid]
    assert main([*argv, "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "acceptance on the held-out corpus needs 320 positions (prompts up to 160" in err
    assert "but the target has 300 (max_position_embeddings): measure on your own prompts" in err
    assert timed == []


def test_profile_names_a_draft_with_fewer_positions_than_the_target(
    micro_pair_paths, tmp_path, capsys
):
    draft = tmp_path / "short-draft"
    shutil.copytree(micro_pair_paths.draft_path, draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    grid = ["--batch-sizes", "1", "--contexts", "8,100", "--reps", "1", "--k-max", "2"]
    out = tmp_path / "p.json"
    argv = ["profile", "--target", micro_pair_paths.target_path, "--draft", str(draft), *grid]
    assert main([*argv, "--acceptance-rows", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "but the draft has 64 (max_position_embeddings): use shorter --contexts" in err
    assert not out.exists()


def test_profile_refuses_a_prompt_too_long_for_the_target_before_timing(
    micro_pair_paths, tmp_path, capsys, monkeypatch
):
    import specrl.profile.timing as timing

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "x = 1", "max_new_tokens": 1000}\n')
    timed = []
    monkeypatch.setattr(timing, "TimingCell", lambda *a, **k: timed.append(1))
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    argv = ["profile", "--target", target, "--draft", draft, "--prompts", str(prompts)]
    assert main([*argv, "--batch-sizes", "1", "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert f"{prompts}, line 2: the prompt" in err
    assert "with max_new_tokens 1000 needs" in err
    assert "the target has 512 (max_position_embeddings); shorten the prompt" in err
    assert timed == []
    # A line without max_new_tokens draws outputs of up to 160 tokens, as a trace would.
    words = " ".join(f"w{i}" for i in range(120))
    prompts.write_text(json.dumps({"prompt": words}) + "\n")
    assert main([*argv, "--batch-sizes", "1", "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert f"{prompts}, line 1: the prompt (" in err
    assert "with no max_new_tokens (outputs up to 160 tokens are drawn) needs" in err
    assert "shorten the prompt or give a lower max_new_tokens" in err
    assert timed == []


def test_profile_fits_each_prompt_not_the_longest_prompt_plus_the_longest_output(
    micro_pair_paths, tmp_path
):
    """A long prompt with a short output and a short prompt with a long output each fit the
    target's 512 positions; the acceptance engine is sized per request, not by their sum."""
    prompts = tmp_path / "p.jsonl"
    words = " ".join(f"w{i}" for i in range(100))  # 291 tokens
    lines = [{"prompt": words, "max_new_tokens": 4}, {"prompt": "x = 1", "max_new_tokens": 400}]
    prompts.write_text(_jsonl(lines))
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    from specrl.models import load_pair

    ids = tokenize_prompts(load_prompts(prompts), load_pair(target, draft).tokenizer).ids
    assert len(ids[0]) + 400 + 2 + 2 > 512 >= len(ids[0]) + 4 + 4  # only the sum overflows
    grid = ["--batch-sizes", "1", "--contexts", "8", "--reps", "1", "--k-max", "2"]
    out = tmp_path / "o.json"
    argv = ["profile", "--target", target, "--draft", draft, "--prompts", str(prompts), *grid]
    assert main([*argv, "--acceptance-rows", "1", "--out", str(out)]) == 0
    assert load_profile(out).meta["prompt_counts"] == {"user": {"greedy": 2}}


def test_measure_profile_refuses_zero_repetitions(micro_pair_paths):
    from specrl.models import load_pair
    from specrl.profile.measure import measure_profile

    pair = load_pair(micro_pair_paths.target_path, micro_pair_paths.draft_path)
    with pytest.raises(SpecrlError, match=r"reps must be an integer >= 1 .*got 0"):
        measure_profile(pair, reps=0, batch_sizes=[1], contexts=[16], progress=False)


def test_bench_engine_refuses_lengths_beyond_the_pairs_positions_before_timing(
    micro_pair_paths, capsys, monkeypatch
):
    import specrl.bench.engine as bench

    def timed(*args, **kwargs):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(bench, "code_prompts", timed)
    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    argv = ["bench", "engine", "--target", target, "--draft", draft, "--device", "cpu"]
    assert main([*argv, "--prompt-len", "448", "--new-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert "--prompt-len 448 + --new-tokens 64 + 1 needs 513 positions but the target " in err
    assert "has 512 (max_position_embeddings); lower --prompt-len or --new-tokens" in err
    with pytest.raises(AssertionError, match="the benchmark started"):  # 512 fit
        main([*argv, "--prompt-len", "447", "--new-tokens", "64"])


def test_one_tokenizer_padded_to_two_vocab_sizes_is_a_pair(micro_pair_paths, tmp_path, capsys):
    """Qwen2.5's 0.5B-3B and 7B+ pad one tokenizer to 151,936 and 152,064 ids. Here: the
    micro target padded to 640 ids, its 512-id draft; the profile and the benchmark run, and
    transformers' assisted generation, which refuses such a pair, is reported as not run."""
    from specrl.bench.engine import format_report, run_engine_benchmark
    from specrl.models import load_pair

    target, draft = micro_pair_paths.target_path, micro_pair_paths.draft_path
    base = load_pair(target, draft)
    padded = tmp_path / "padded-target"
    base.target.resize_token_embeddings(640, mean_resizing=False)
    base.target.save_pretrained(padded)
    base.tokenizer.save_pretrained(padded)
    pair = load_pair(padded, draft)
    assert pair.vocab_padding and not base.vocab_padding
    assert (pair.target.config.vocab_size, pair.draft.config.vocab_size) == (640, 512)
    out = tmp_path / "p.json"
    grid = ["--batch-sizes", "1", "--contexts", "8", "--reps", "1", "--k-max", "2"]
    argv = ["profile", "--target", str(padded), "--draft", draft, *grid, "--acceptance-rows", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    assert all(
        c["drafted_per_position"][0] > 0
        for by_band in load_profile(out).acceptance_counts.values()
        for c in by_band.values()
    )
    result = run_engine_benchmark(
        pair, batch_sizes=(1,), k_max=2, prompt_len=8, new_tokens=6, repeats=1, progress=False
    )
    assert result.hf_assisted_not_run and result.hf_assisted_b1_tokens_per_s == 0.0
    assert result.b1_best_k in (0, 1, 2)
    assert "HF assisted generation not run: transformers' assisted" in format_report(result)
    # Two tokenizers that differ are refused, before any weights load.
    other = tmp_path / "other-draft"
    shutil.copytree(draft, other)
    (other / "model.safetensors").unlink()
    tokenizer = load_pair(target, draft).tokenizer
    tokenizer.add_tokens(["<not-in-the-target>"])
    tokenizer.save_pretrained(other)
    capsys.readouterr()
    assert main([*argv[:2], str(padded), "--draft", str(other), *grid, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "target " in err and "has vocab size 640" in err and "has 512, and their" in err
    assert "tokenizers are not one tokenizer that fits both" in err
