"""Command-line options from a dataclass, cleanrl style: one ``--option`` per field, its
help the docstring right below the field. Shared by the scripts in ``experiments/``.

A numeric field states its range with :func:`arg`: ``episodes: int = arg(3, positive_int)``
(the argparse types of :mod:`specrl.options`), and a bad value is refused while the command
line is parsed (``seeds.py: error: argument --episodes: expected an integer >= 1, got '0'``,
exit status 2), before anything trains. A numeric field without one is a programming error,
raised when the parser is built."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from collections.abc import Callable


def field_docs(cls) -> dict[str, str]:
    """Each field's docstring (the string right below it in the class body)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr):
            if isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[node.target.id] = after.value.value
    return docs


def arg(default, check: Callable[[str], object]):
    """A field whose option takes what ``check`` (an argparse type) accepts; for a tuple
    field, each item of the comma list."""
    return dataclasses.field(default=default, metadata={"check": check})


def one_of(*names: str) -> Callable[[str], str]:
    """argparse type: one of ``names``."""

    def convert(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)}, got {text!r}")
        return text

    convert.__name__ = "str"
    return convert


def _tuple_of(item: Callable[[str], object]):
    """argparse type for a non-empty comma list: ``"64,64"`` -> ``(64, 64)``, each item
    converted (and checked) by ``item``."""
    wanted = getattr(item, "wanted", None) or {int: "an integer", float: "a number"}.get(
        item, "a name"
    )

    def convert(text: str) -> tuple:
        parts = [x for x in text.split(",") if x]
        if not parts:
            raise argparse.ArgumentTypeError(
                f"expected a non-empty comma list, each {wanted}, got {text!r}"
            )
        try:
            return tuple(item(x) for x in parts)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err} (in the list {text!r})") from None
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma list, each {wanted}, got {text!r}"
            ) from None

    return convert


NUMBERS = (int, float)


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
        check = f.metadata.get("check")
        item = type(f.default[0]) if kind is tuple and f.default else kind
        if check is None and item in NUMBERS:
            raise TypeError(
                f"{cls.__name__}.{f.name}: a numeric option needs its range; declare it as "
                f"{f.name}: ... = arg(default, check) with a type from specrl.options"
            )
        if kind is tuple:
            convert = _tuple_of(check or (str if item is tuple else item))
            shown = ",".join(str(x) for x in f.default)
        else:
            convert, shown = check or kind, f.default
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
