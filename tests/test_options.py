"""Numeric command-line options refuse bad values while the command line is parsed: one
argparse line naming the option and its range, exit status 2, nothing run."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from test_experiments import load as load_script

import specrl.cli
from specrl import dataclass_cli, options
from specrl.cli import build_parser, main

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = ("train_ppo", "compare", "seeds", "draft_size")
SEED_RANGE = "expected an integer in 0..4294967295"
THREADS_RANGE = "expected an integer in 1..1024"
COUNT = "expected an integer >= 1"
K_RANGE = "expected an integer in 1..16"
DEVICES = "expected cpu, cuda or cuda:N"

PROFILE = ["profile", "--out", "OUT"]
EXPORT = ["export", "--run", "RUN", "--out", "OUT"]
VALIDATE = ["validate-surrogate", "--profile", "OUT"]

CASES = [
    # seeds: integers >= 0
    (["workload", "--seed", "-1", "--out", "OUT"], "--seed", SEED_RANGE),
    (["compare", "--seed", "-1"], "--seed", SEED_RANGE),
    ([*PROFILE, "--seed", "-1"], "--seed", SEED_RANGE),
    ([*VALIDATE, "--seed", "-1"], "--seed", SEED_RANGE),
    (["train", "--out", "OUT", "--seed", "4294967296"], "--seed", SEED_RANGE),
    (["models", "build", "--seed", "-3"], "--seed", SEED_RANGE),
    # threads: >= 1 (0 is not "the default")
    ([*PROFILE, "--threads", "-1"], "--threads", THREADS_RANGE),
    ([*PROFILE, "--threads", "0"], "--threads", THREADS_RANGE),
    (["profile", "--check", "OUT", "--threads", "-1"], "--threads", THREADS_RANGE),
    (["compare", "--env", "live", "--threads", "-1"], "--threads", THREADS_RANGE),
    ([*VALIDATE, "--threads", "-1"], "--threads", THREADS_RANGE),
    (["demo", "--threads", "0"], "--threads", THREADS_RANGE),
    (["demo", "--threads", "100000"], "--threads", THREADS_RANGE),
    # counts and sizes
    (["decode", "--batch", "-1"], "--batch", "expected an integer in 1..65536"),
    (["decode", "--k", "17"], "--k", "expected an integer in 0..16"),
    (["decode", "--new-tokens", "0"], "--new-tokens", COUNT),
    (["decode", "--temperature", "nan"], "--temperature", "expected a finite number >= 0"),
    (
        ["workload", "--n-requests", "99999999999999999999", "--out", "OUT"],
        "--n-requests",
        "expected an integer in 1..100000",
    ),
    (["workload", "--peak", "0", "--out", "OUT"], "--peak", "expected an integer in 1..65536"),
    (["compare", "--n-requests", "0"], "--n-requests", "expected an integer in 1..100000"),
    (["compare", "--episodes", "0"], "--episodes", COUNT),
    (["compare", "--max-batch", "0"], "--max-batch", "expected an integer in 1..65536"),
    (["compare", "--k-max", "0"], "--k-max", K_RANGE),
    (["train", "--out", "OUT", "--timesteps", "0"], "--timesteps", COUNT),
    (["demo", "--live-episodes", "0"], "--live-episodes", COUNT),
    ([*EXPORT, "--episodes", "0"], "--episodes", COUNT),
    ([*EXPORT, "--episodes", "-1"], "--episodes", COUNT),
    ([*EXPORT, "--k-max", "-1"], "--k-max", K_RANGE),
    ([*EXPORT, "--context-len", "-1"], "--context-len", COUNT),
    ([*EXPORT, "--acceptance", "1.5"], "--acceptance", "expected a number in [0, 1]"),
    ([*VALIDATE, "--live-repeats", "0"], "--live-repeats", COUNT),
    ([*VALIDATE, "--surrogate-seeds", "0"], "--surrogate-seeds", COUNT),
    ([*VALIDATE, "--trace-seeds", "0"], "--trace-seeds", COUNT),
    (["bench", "engine", "--repeats", "0"], "--repeats", COUNT),
    (["bench", "engine", "--new-tokens", "0"], "--new-tokens", COUNT),
    (["bench", "engine", "--prompt-len", "0"], "--prompt-len", COUNT),
    (["bench", "engine", "--prompt-len", "-1"], "--prompt-len", COUNT),
    (["bench", "engine", "--k-max", "0"], "--k-max", K_RANGE),
    (["bench", "engine", "--min-sample-s", "nan"], "--min-sample-s", "a finite number >= 0"),
    (["bench", "engine", "--min-sample-s", "inf"], "--min-sample-s", "a finite number >= 0"),
    (["bench", "surrogate", "--steps", "-1"], "--steps", COUNT),
    (["bench", "controller", "--calls", "0"], "--calls", COUNT),
    ([*PROFILE, "--reps", "0"], "--reps", COUNT),
    ([*PROFILE, "--reps", "-1"], "--reps", COUNT),
    ([*PROFILE, "--k-max", "300"], "--k-max", K_RANGE),
    ([*PROFILE, "--acceptance-rows", "0"], "--acceptance-rows", COUNT),
    ([*PROFILE, "--reps", "2.5"], "--reps", COUNT),
    ([*PROFILE, "--batch-sizes", "1,0"], "--batch-sizes", "expected integers from 1 to 65536"),
    ([*PROFILE, "--contexts", "x"], "--contexts", "expected integers like 1,4,16"),
    (["bench", "engine", "--batch-sizes", "1,70000"], "--batch-sizes", "from 1 to 65536"),
    # model presets: a misspelt pair is not silently ignored or found late
    (["train", "--out", "OUT", "--env", "live", "--preset", "nope"], "--preset", "micro"),
    (["compare", "--preset", "nope"], "--preset", "expected a model preset (micro, small"),
    ([*VALIDATE, "--preset", "nope"], "--preset", "expected a model preset"),
    ([*PROFILE, "--preset", "nope"], "--preset", "expected a model preset"),
    (["demo", "--preset", "nope"], "--preset", "expected a model preset"),
    # devices the engine runs on
    ([*PROFILE, "--device", "mps"], "--device", DEVICES),
    (["decode", "--device", "mps"], "--device", DEVICES),
    (["bench", "engine", "--device", "cuda:x"], "--device", DEVICES),
    (["compare", "--device", "tpu"], "--device", DEVICES),
]


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail the test if a command got past parsing (main enters _plain_warnings to run it)."""

    def ran():
        raise AssertionError("the command ran")

    monkeypatch.setattr(specrl.cli, "_plain_warnings", ran)


def _refused(capsys, call, option: str, fragment: str) -> str:
    with pytest.raises(SystemExit) as exc:
        call()
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert f"error: argument {option}: " in last and fragment in last, err
    return last


@pytest.mark.parametrize(
    "argv, option, fragment", CASES, ids=[" ".join(argv) for argv, _, _ in CASES]
)
def test_a_bad_value_is_refused_at_parse_time(
    argv, option, fragment, tmp_path, capsys, nothing_runs
):
    out = tmp_path / "out.json"
    argv = [str(out) if a == "OUT" else a for a in argv]
    _refused(capsys, lambda: main(argv), option, fragment)
    assert not out.exists()


def test_an_unknown_workload_is_the_error_not_n_requests(capsys):
    # Checked first in the command, before a trace is drawn or a profile read.
    assert main(["compare", "--workload", "nope", "--n-requests", "4"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("specrl: error: workload 'nope' is neither a preset (")
    assert "--n-requests" not in err and len(err.splitlines()) == 1


def test_messages_quote_the_value_and_name_the_range(capsys, nothing_runs):
    last = _refused(capsys, lambda: main(["compare", "--seed", "-1"]), "--seed", SEED_RANGE)
    assert last == (
        "specrl compare: error: argument --seed: expected an integer in 0..4294967295, got '-1'"
    )


def _parsers(parser: argparse.ArgumentParser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_no_numeric_option_takes_a_bare_int_or_float():
    unchecked = [
        f"{' '.join(path)} {action.option_strings[0]}"
        for path, parser in _parsers(build_parser())
        for action in parser._actions
        if action.type in (int, float)
    ]
    assert not unchecked, "numeric options without a range: " + ", ".join(unchecked)


def test_defaults_and_good_values_still_parse():
    parser = build_parser()
    args = parser.parse_args(["compare"])
    assert (args.seed, args.episodes, args.n_requests, args.k_max, args.threads) == (
        0,
        4,
        None,
        4,
        None,
    )
    assert (args.device, args.workload) == ("cpu", "mixed")
    args = parser.parse_args(["profile", "--out", "p.json"])
    assert (args.reps, args.k_max, args.threads, args.device) == (5, 4, None, "cpu")
    args = parser.parse_args(["bench", "engine", "--min-sample-s", "2", "--device", "cuda:1"])
    assert (args.min_sample_s, args.device, args.repeats) == (2.0, "cuda:1", 5)
    args = parser.parse_args(["decode", "--k", "0", "--temperature", "0.8"])
    assert (args.k, args.temperature, args.batch) == (0, 0.8, 4)
    args = parser.parse_args(["export", "--run", "R", "--out", "o", "--acceptance", "0"])
    assert (args.acceptance, args.episodes, args.k_max) == (0.0, None, None)


@pytest.mark.parametrize(
    "kind, text, message",
    [
        (options.int_in(1), "x", "expected an integer >= 1, got 'x'"),
        (options.int_in(1), "1.0", "expected an integer >= 1, got '1.0'"),
        (options.int_in(0, 3), "4", "expected an integer in 0..3, got '4'"),
        (options.positive_float, "0", "expected a finite number > 0, got '0'"),
        (options.positive_float, "-inf", "expected a finite number > 0, got '-inf'"),
        (options.nonnegative_float, "nan", "expected a finite number >= 0, got 'nan'"),
        (options.probability, "NaN", "expected a number in [0, 1], got 'NaN'"),
        (options.float_in(0, 1, low_open=True), "0", "expected a number in (0, 1], got '0'"),
        (options.device, "mps", "expected cpu, cuda or cuda:N"),
        (options.device, "cuda:", "expected cpu, cuda or cuda:N"),
    ],
)
def test_types_refuse_with_the_range(kind, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=rf"^{_escape(message)}"):
        kind(text)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_types_accept_their_range():
    assert options.int_in(0, 3)("3") == 3 and options.positive_int("7") == 7
    assert options.probability("1") == 1.0 and options.nonnegative_float("0") == 0.0
    assert [options.device(d) for d in ("cpu", "cuda", "cuda:0")] == ["cpu", "cuda", "cuda:0"]
    assert options.SEED(str(options.SEED_MAX)) == options.SEED_MAX


# ----------------------------------------------------------------------------- experiments


SCRIPT_CASES = [
    (
        "seeds",
        ["--seeds", ""],
        "--seeds",
        "expected a non-empty comma list, each an integer in 0..4294967295, got ''",
    ),
    ("seeds", ["--seeds", "0,-1"], "--seeds", SEED_RANGE + ", got '-1' (in the list '0,-1')"),
    ("seeds", ["--episodes", "0"], "--episodes", COUNT),
    ("seeds", ["--eval-every", "-1"], "--eval-every", "expected an integer >= 0"),
    ("seeds", ["--net-arch", "64,0"], "--net-arch", COUNT),
    ("seeds", ["--batch-size", "1"], "--batch-size", "expected an integer >= 2"),
    ("seeds", ["--eval-workloads", "ramp,nope"], "--eval-workloads", "a workload preset"),
    ("compare", ["--seed", "-1"], "--seed", SEED_RANGE),
    ("compare", ["--episodes", "0"], "--episodes", COUNT),
    ("compare", ["--n-requests", "-1"], "--n-requests", "expected an integer in 0..100000"),
    ("compare", ["--wandb", "nope"], "--wandb", "expected one of offline, online, disabled"),
    ("draft_size", ["--threads", "-1"], "--threads", THREADS_RANGE),
    ("draft_size", ["--reps", "0"], "--reps", COUNT),
    ("draft_size", ["--contexts", "1,16"], "--contexts", "expected an integer >= 2"),
    ("draft_size", ["--batch-sizes", "0"], "--batch-sizes", "expected an integer in 1..65536"),
    ("draft_size", ["--presets", "small,big"], "--presets", "expected a model preset"),
    ("train_ppo", ["--total-timesteps", "0"], "--total-timesteps", COUNT),
    ("train_ppo", ["--k-max", "0"], "--k-max", K_RANGE),
    ("train_ppo", ["--gamma", "nan"], "--gamma", "expected a number in (0, 1]"),
    ("train_ppo", ["--ent-coef", "-0.1"], "--ent-coef", "expected a number in [0, 1]"),
    ("train_ppo", ["--torch-threads", "0"], "--torch-threads", THREADS_RANGE),
    ("train_ppo", ["--n-envs", "-1"], "--n-envs", "expected an integer >= 0"),
]


@pytest.mark.parametrize(
    "script, argv, option, fragment",
    SCRIPT_CASES,
    ids=[f"{s} {' '.join(a)}" for s, a, _, _ in SCRIPT_CASES],
)
def test_experiment_scripts_refuse_a_bad_value_at_parse_time(
    script, argv, option, fragment, capsys, monkeypatch
):
    module = load_script(script)

    def ran(*args, **kwargs):
        raise AssertionError("the script ran")

    monkeypatch.setattr(module, "train" if script == "train_ppo" else "run", ran)
    _refused(capsys, lambda: module.main(argv), option, fragment)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_numeric_field_of_a_script_has_a_range(script, monkeypatch):
    module = load_script(script)
    monkeypatch.setattr("time.time", lambda: 1.0)  # train_ppo names its run by the time
    dataclass_cli.options(module.Args)  # raises for an unchecked one
    assert dataclass_cli.parse(module.Args, []) == module.Args()


@dataclasses.dataclass
class Unchecked:
    name: str = "x"
    """A name."""
    episodes: int = 3
    """Episodes."""


def test_a_numeric_field_without_a_range_is_a_programming_error():
    with pytest.raises(TypeError, match=r"Unchecked\.episodes: a numeric option needs its range"):
        dataclass_cli.parse(Unchecked, [])
