"""Reading the JSON files users hand to specrl (profiles, traces) and comma-separated options."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path

from specrl.errors import SpecrlError


def read_json(path: str | Path, what: str, remake: str):
    """Parse ``path`` or raise a one-line error naming the file and ``remake``, the fix."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecrlError(f"{what} file {path} not found; {remake}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecrlError(f"{what} file {path} is not valid JSON ({err}); {remake}") from None
    except (RecursionError, ValueError) as err:  # nesting too deep, integers too long
        raise SpecrlError(f"{what} file {path} is not valid JSON ({err}); {remake}") from None


def positive_ints(text: str) -> list[int]:
    """argparse type for options like ``--batch-sizes 1,4,16,64``."""
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,4,16, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,4,16, got {text!r}")
    return values


def check_header(
    obj, source: str, *, fmt: str, version: int | tuple[int, ...], what: str, remake: str
) -> None:
    """Reject ``obj`` unless it is a JSON object with this ``format`` and ``version`` (one of
    them, for a tuple)."""
    if not isinstance(obj, Mapping):
        raise SpecrlError(f"{source}: expected a JSON object at the top level")
    if obj.get("format") != fmt:
        raise SpecrlError(f"{source}: field 'format' must be {fmt!r}; not a {what}")
    versions = version if isinstance(version, tuple) else (version,)
    found = obj.get("version")
    if isinstance(found, bool) or found not in versions:
        readable = " or ".join(str(v) for v in versions)
        raise SpecrlError(
            f"{source}: field 'version' is {found!r}; this specrl reads version "
            f"{readable}, {remake}"
        )


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that a kill (or a reader) at any moment sees the old file
    or the new one, never a part: a flushed, fsynced temporary file renamed into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
