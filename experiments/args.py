"""Command-line options from a dataclass, cleanrl style: one ``--option`` per field, its
help the docstring right below the field. Shared by the scripts in ``experiments/``."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect


def field_docs(cls) -> dict[str, str]:
    """Each field's docstring (the string right below it in the class body)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr):
            if isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[node.target.id] = after.value.value
    return docs


def _tuple_of(item: type):
    """argparse type for a comma list: ``"64,64"`` -> ``(64, 64)``."""

    def convert(text: str) -> tuple:
        return tuple(item(x) for x in text.split(",") if x)

    return convert


def dataclass_parser(cls, doc: str | None) -> argparse.ArgumentParser:
    """One ``--option`` per field of ``cls``; a tuple field is a comma list, a bool field a
    ``--x/--no-x`` pair. ``doc``'s first paragraph is the description."""
    first_paragraph = (doc or "").strip().split("\n\n")[0]
    parser = argparse.ArgumentParser(description=" ".join(first_paragraph.split()))
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        option = "--" + f.name.replace("_", "-")
        kind = f.default.__class__
        if kind is bool:
            parser.add_argument(
                option,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=f"{docs[f.name]} (default: {f.default})",
            )
            continue
        if kind is tuple:
            convert = _tuple_of(type(f.default[0]) if f.default else str)
            shown = ",".join(str(x) for x in f.default)
        else:
            convert, shown = kind, f.default
        parser.add_argument(
            option, type=convert, default=f.default, help=f"{docs[f.name]} (default: {shown})"
        )
    return parser


def parse_dataclass(cls, argv: list[str] | None, doc: str | None):
    """An instance of ``cls`` from ``argv`` (options as :func:`dataclass_parser` builds them)."""
    return cls(**vars(dataclass_parser(cls, doc).parse_args(argv)))


def script_main(cls, run, argv: list[str] | None, doc: str | None, name: str) -> int:
    """Parse ``argv`` into ``cls``, call ``run(args)``; a ``SpecrlError`` becomes one line on
    stderr (``NAME: error: ...``) and exit status 2."""
    import sys

    from specrl.errors import SpecrlError

    args = parse_dataclass(cls, argv, doc)
    try:
        run(args)
    except SpecrlError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return 2
    return 0
