"""Command lines from dataclasses, through tyro: one ``--option`` per field, its help the
docstring right below the field (cleanrl's ``tyro.cli(Args)``). ``TrainConfig``, ``specrl
train`` and the scripts in ``experiments/`` read their options this way.

A field whose value tyro's own reading would not check says how to read it, in its type:

* :func:`value`: one value, checked by an argparse type of :mod:`specrl.options`
  (``episodes: Annotated[int, value(positive_int)] = 3``);
* :func:`optional`: the same, or ``None``;
* :func:`comma_list`: a tuple written as one comma list (``--workloads ramp,day``), each item
  checked.

Every numeric field needs one (:func:`parse` raises ``TypeError`` for one without), and a bad
value is refused while the command line is parsed, in argparse's one line naming the option
(``seeds.py: error: argument --episodes: expected an integer >= 1, got '0'``, exit status
2), before anything trains.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, TypeVar

import tyro
from tyro.constructors import PrimitiveConstructorSpec

from specrl.errors import SpecrlError

T = TypeVar("T")


def value(convert: Callable[[str], object]) -> PrimitiveConstructorSpec:
    """Read the option's one value with ``convert`` (an argparse type)."""
    return PrimitiveConstructorSpec(
        nargs=1,
        metavar=_metavar(convert),
        instance_from_str=lambda args: convert(args[0]),
        is_instance=lambda _: True,
        str_from_instance=lambda x: [str(x)],
    )


def optional(convert: Callable[[str], object]) -> PrimitiveConstructorSpec:
    """Read the option's one value with ``convert``; ``None`` for the word None."""
    return PrimitiveConstructorSpec(
        nargs=1,
        metavar="{None}|" + _metavar(convert),
        instance_from_str=lambda args: None if args[0] == "None" else convert(args[0]),
        is_instance=lambda _: True,
        str_from_instance=lambda x: [str(x)],
    )


def comma_list(item: Callable[[str], object]) -> PrimitiveConstructorSpec:
    """Read a non-empty comma list, ``"64,64"`` -> ``(64, 64)``, each item with ``item``."""
    wanted = getattr(item, "wanted", "a name")

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

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar=f"{_metavar(item)},...",
        instance_from_str=lambda args: convert(args[0]),
        is_instance=lambda _: True,
        str_from_instance=lambda x: [",".join(str(v) for v in x)],
    )


def one_of(*names: str) -> Callable[[str], str]:
    """argparse type: one of ``names``."""

    def convert(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)}, got {text!r}")
        return text

    convert.__name__ = "str"
    convert.metavar = "{" + ",".join(names) + "}"
    return convert


def _metavar(convert: Callable[[str], object]) -> str:
    return getattr(convert, "metavar", convert.__name__.upper())


@dataclasses.dataclass(frozen=True)
class Option:
    """How tyro spells a field on the command line."""

    field: str
    flags: tuple[str, ...]
    """``("--seed",)``; a bool field: ``("--force-profile", "--no-force-profile")``."""
    spec: PrimitiveConstructorSpec | None
    """How its value is read (:func:`value`, :func:`optional`, :func:`comma_list`); None:
    tyro's own reading (a string, a flag)."""

    @property
    def is_flag(self) -> bool:
        return len(self.flags) == 2


def options(cls) -> list[Option]:
    """The options of dataclass ``cls``, in field order. A numeric field without a spec is a
    programming error (its range would go unchecked), raised here."""
    hints = typing.get_type_hints(cls, include_extras=True)
    found = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        specs = [
            m for m in getattr(hint, "__metadata__", ()) if isinstance(m, PrimitiveConstructorSpec)
        ]
        base = hint.__origin__ if typing.get_origin(hint) is Annotated else hint
        if not specs and _is_numeric(base):
            raise TypeError(
                f"{cls.__name__}.{f.name}: a numeric option needs its range; declare it as "
                f"{f.name}: Annotated[..., value(check)] with a type from specrl.options"
            )
        flag = "--" + f.name.replace("_", "-")
        flags = (flag, "--no-" + flag[2:]) if base is bool else (flag,)
        found.append(Option(f.name, flags, specs[0] if specs else None))
    return found


def _is_numeric(kind) -> bool:
    if kind in (int, float):
        return True
    if typing.get_origin(kind) in (tuple, typing.Union, types.UnionType):
        return any(_is_numeric(arg) for arg in typing.get_args(kind) if arg is not Ellipsis)
    return False


def parse(
    cls: type[T],
    argv: Sequence[str] | None = None,
    *,
    description: str | None = None,
    default: T | None = None,
    prog: str | None = None,
) -> T:
    """``cls`` from ``argv`` (``sys.argv[1:]`` when None) through ``tyro.cli``; ``description``'s
    first paragraph heads ``--help``. A refused value exits with status 2 after argparse's
    one line naming the option."""
    argv = list(sys.argv[1:] if argv is None else argv)
    found = options(cls)
    if description is not None:
        description = " ".join(description.strip().split("\n\n")[0].split())
    kwargs = {"default": default} if default is not None else {}
    try:
        return tyro.cli(cls, args=argv, prog=prog, description=description, **kwargs)
    except argparse.ArgumentTypeError as err:
        # tyro calls a spec without naming its option: find the first one refusing its value.
        flag = _refusing_flag(found, argv)
        where = f"argument {flag}: " if flag else ""
        print(f"{prog or Path(sys.argv[0]).name}: error: {where}{err}", file=sys.stderr)
        raise SystemExit(2) from None


def _refusing_flag(found: list[Option], argv: list[str]) -> str | None:
    specs = {flag: o.spec for o in found if o.spec for flag in o.flags}
    for i, token in enumerate(argv):
        flag, eq, text = token.partition("=")
        values = [text] if eq else argv[i + 1 : i + 2]
        if flag in specs and values:
            try:
                specs[flag].instance_from_str(values)
            except argparse.ArgumentTypeError:
                return flag
    return None


def script_main(cls, run: Callable, argv: Sequence[str] | None, doc: str | None, name: str) -> int:
    """Parse ``argv`` into ``cls`` and call ``run(args)``; a ``SpecrlError`` (a bad setting, or
    the run refused) becomes one line on stderr (``NAME: error: ...``) and exit status 2."""
    try:
        run(parse(cls, argv, description=doc, prog=f"{name}.py"))
    except SpecrlError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return 2
    return 0
