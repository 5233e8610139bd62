"""The README's commands match the command line: every ``specrl`` and ``python experiments/``
line in its bash blocks parses as written, and every option an inline command names exists.

Inline spans are often synopses (``[--json F]``, ``surrogate|live``) or mentions (``specrl
export``), so only their subcommand and option names are checked, not their values."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from specrl.cli import build_parser
from specrl.dataclass_cli import options, parse
from specrl.errors import SpecrlError

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
SCRIPTS = ("train_ppo", "compare", "seeds", "draft_size", "engineer")


def _block_commands() -> list[str]:
    """Each ``specrl ...`` or ``python experiments/...`` command in a ```bash block, with its
    line continuations joined and its comment, ``VAR=`` prefixes and pipes dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#\s|^#", line)[0]
            for part in re.split(r"&&|;|\|\s", line):
                m = re.search(r"(?:^|\s)((?:specrl|python experiments/\w+\.py)\s.*)$", part)
                if m:
                    commands.append(m.group(1).strip())
    return commands


def _inline_commands(prefix: str) -> list[tuple[str, list[str]]]:
    """Each inline code span that starts with ``prefix``, and its words after the prefix with
    a synopsis's brackets taken off (``[--json`` -> ``--json``)."""
    text = README.replace("\n", " ")
    spans = [m.group(1) for m in re.finditer(rf"`({re.escape(prefix)}[^`]*)`", text)]
    skip = len(prefix.split())
    return [(span, [w.strip("[]") for w in span.split()[skip:]]) for span in spans]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return None


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _script(name: str):
    """The module of ``experiments/NAME.py``."""
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(REPO / "experiments"))


def _script_error(name: str, argv: list[str]) -> str:
    """'' when ``argv`` parses into ``experiments/NAME.py``'s ``Args`` (through tyro, as the
    script does), else the error it prints."""
    module = _script(name)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(module.Args, argv, description=module.__doc__)
    except SystemExit as exit:
        if exit.code:
            return " ".join(err.getvalue().split())
    except SpecrlError as error:
        return str(error)
    return ""


def _script_options(name: str) -> set[str]:
    """The options of ``experiments/NAME.py``: one per field of its ``Args``, and --help."""
    flags = {flag for option in options(_script(name).Args) for flag in option.flags}
    return flags | {"-h", "--help"}


def _no_abbreviations(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` and its subcommands refusing prefixes of options: the README spells them out."""
    parser.allow_abbrev = False
    for sub in (_subcommands(parser) or {}).values():
        _no_abbreviations(sub)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """'' when ``argv`` parses, else argparse's error line."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit as exit:
        if exit.code:
            return err.getvalue().strip().splitlines()[-1]
    return ""


def test_the_readme_has_commands_to_check():
    blocks = _block_commands()
    assert sum(c.startswith("specrl ") for c in blocks) >= 15
    assert len(_inline_commands("specrl ")) >= 50


def test_every_bash_block_command_parses():
    parser = _no_abbreviations(build_parser())
    failed = []
    for command in _block_commands():
        argv = shlex.split(command)
        if argv[0] == "specrl":
            error = _parse(parser, argv[1:])
        else:  # tyro takes no prefix of an option either
            error = _script_error(Path(argv[1]).stem, argv[2:])
        if error:
            failed.append(f"{command}\n    {error}")
    assert not failed, "README commands that do not parse:\n" + "\n".join(failed)


def _unknown_options(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """The ``--options`` in ``words`` (after nested subcommands) that ``parser`` lacks."""
    while words and (subs := _subcommands(parser)) is not None and words[0] in subs:
        parser, words = subs[words[0]], words[1:]
    named = {m.group(0) for w in words if (m := re.match(r"--[\w-]+", w))}
    return sorted(named - _options(parser))


def test_every_inline_specrl_command_names_real_options():
    parser = build_parser()
    subs = _subcommands(parser)
    failed = []
    for span, words in _inline_commands("specrl "):
        if not words or words[0] == "...":
            continue
        if words[0] not in subs and not words[0].startswith("-"):
            failed.append(f"{span}: no subcommand {words[0]!r}")
            continue
        if unknown := _unknown_options(parser, words):
            failed.append(f"{span}: {', '.join(unknown)}")
    assert not failed, "README inline commands with unknown names:\n" + "\n".join(failed)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_inline_experiment_command_names_real_options(name):
    known = _script_options(name)
    failed = []
    for span, words in _inline_commands(f"python experiments/{name}.py"):
        named = {m.group(0) for w in words if (m := re.match(r"--[\w-]+", w))}
        if unknown := sorted(named - known):
            failed.append(f"{span}: {', '.join(unknown)}")
    assert not failed, "README inline commands with unknown options:\n" + "\n".join(failed)


def test_the_readme_own_controller_snippet_runs_beside_the_baselines():
    start = README.index("class Mine(KPolicy)")
    block = README[
        README.rindex("```python", 0, start) + len("```python") : README.index("```", start)
    ]
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(block, "README.md", "exec"), scope)
    report = scope["report"]
    assert [r.policy for r in report.results] == ["off", "K=2", "goodput", "mine"]
    mine = report.result("mine")
    # It drafts 3 at small batches and stops at large ones, as written.
    assert mine.k_share["3"] > 0 and mine.k_share["0"] > 0
    assert set(k for k, share in mine.k_share.items() if share > 0) == {"0", "3"}
    assert "| mine |" in out.getvalue()
