"""Reading the JSON files users hand to specrl (profiles, traces), writing files atomically,
and comma-separated options."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from specrl.errors import SpecrlError


def read_json(path: str | Path, what: str, remake: str):
    """Parse ``path`` or raise a one-line error naming the file and ``remake``, the fix."""
    path = Path(path)
    try:
        return json.loads(path.read_text(), object_pairs_hook=unique_keys)
    except DuplicateKeyError as err:
        raise SpecrlError(f"{what} file {path}: {err}; keep one of them") from None
    except FileNotFoundError:
        raise SpecrlError(f"{what} file {path} not found; {remake}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecrlError(f"{what} file {path} is not valid JSON ({err}); {remake}") from None
    except (RecursionError, ValueError) as err:  # nesting too deep, integers too long
        raise SpecrlError(f"{what} file {path} is not valid JSON ({err}); {remake}") from None


class DuplicateKeyError(ValueError):
    pass


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object, refusing a key given twice (json.loads would keep the last silently)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise DuplicateKeyError(f"key {twice!r} appears twice in one object")
    return obj


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
    if not isinstance(found, int) or isinstance(found, bool) or found not in versions:
        readable = " or ".join(str(v) for v in versions)
        raise SpecrlError(
            f"{source}: field 'version' is {found!r}; this specrl reads version "
            f"{readable}, {remake}"
        )


def check_output(path: str | Path, option: str) -> Path:
    """Check, before any long work, that ``path`` can be written: not a directory, its
    directory made (as writing would) and writable. Raises a SpecrlError naming ``option``."""
    path = Path(path)
    if path.is_dir():
        raise SpecrlError(
            f"{option} {path} is a directory; give a file path in it, like {path}/out.json"
        )
    if path.exists() and not Path(os.path.realpath(path)).is_file():
        raise SpecrlError(f"{option} {path} is not a regular file (a device?); give a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpecrlError(
            f"{option} {path}: cannot create the directory {path.parent} ({err.strerror or err}); "
            "choose another path"
        ) from None
    if not os.access(path.parent, os.W_OK):
        raise SpecrlError(f"{option} {path}: {path.parent} is not writable; choose another path")
    return path


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that a kill (or a reader) at any moment sees the old file
    or the new one, never a part: a flushed, fsynced temporary file renamed into place (its
    directory made first where missing). A failure raises a SpecrlError naming ``path``."""
    # Through a symlink to the file it names (a deployment's `current.json -> v3.json`);
    # never over a device, a FIFO or a directory.
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise SpecrlError(f"could not write {path}: it is not a regular file; give a file path")
    tmp = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise SpecrlError(f"could not write {path} ({err.strerror or err})") from None


def write_json(path: str | Path, obj, **dumps) -> None:
    """``obj`` as indented JSON (``dumps`` go to :func:`json.dumps`), written atomically."""
    write_atomic(path, json.dumps(obj, indent=1, **dumps) + "\n")
