"""``specrl models ...`` subcommands."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("models", help="build and inspect the draft/target model pair")
    parser.set_defaults(func=lambda args: parser.print_help())
