"""The ``specrl`` command line: one module per subcommand in this package.

Every module listed in ``COMMAND_MODULES`` exposes ``add_parser(subparsers)``, which adds its
subcommand and sets ``func`` to a callable taking the parsed arguments. Modules are imported
only when the command line is built, so ``import specrl`` stays light.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings

from specrl.errors import SpecrlError, SpecrlWarning

COMMAND_MODULES = [
    "specrl.cli.models",
    "specrl.cli.demo",
    "specrl.cli.decode",
    "specrl.cli.bench",
    "specrl.cli.workload",
    "specrl.cli.profile",
    "specrl.cli.validate_surrogate",
    "specrl.cli.compare",
    "specrl.cli.train",
    "specrl.cli.export",
    "specrl.cli.sweep",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specrl",
        description="Learn when speculative decoding pays, and with how many draft tokens.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if not err.name or err.name.split(".")[0] == "specrl":
                raise
            _add_unavailable(sub, name, err.name)
        else:
            module.add_parser(sub)
    return parser


def _add_unavailable(sub: argparse._SubParsersAction, module: str, missing: str) -> None:
    """A command whose module needs a package this Python lacks: listed, and an error that
    names the package when run, so that the other commands still work (a GPU image with
    torch and transformers but not every dependency runs ``specrl profile``)."""
    command = module.rsplit(".", 1)[1].replace("_", "-")
    parser = sub.add_parser(
        command, help=f"(unavailable here: needs {missing})", add_help=False, prefix_chars="\x01"
    )
    parser.add_argument("args", nargs="*")  # no prefix chars: every word lands here

    def run(args: argparse.Namespace) -> None:
        raise SpecrlError(
            f"`specrl {command}` needs the package {missing!r}, which this Python cannot "
            "import; install specrl with its dependencies (`pip install -e .`) or that package"
        )

    parser.set_defaults(func=run)


@contextlib.contextmanager
def _plain_warnings():
    """Show specrl's own warnings (:class:`~specrl.errors.SpecrlWarning`) as ``specrl:
    warning: ...`` lines, without the file, line number and source line Python adds; other
    libraries' warnings keep Python's format."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, SpecrlWarning):
            print(f"specrl: warning: {message}", file=sys.stderr if file is None else file)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with _plain_warnings():
            return int(args.func(args) or 0)
    except SpecrlError as err:
        print(f"specrl: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
