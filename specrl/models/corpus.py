"""The offline corpus: the Python standard library that ships with the running interpreter.

Every file is a *document*. Whole files are held out from training, chosen by a hash of their
path relative to the stdlib root (``HELD_OUT_MODULUS``), so the split is deterministic for a
given Python version and never leaks part of a held-out file into training.

Evaluation domains (``DOMAINS``), all drawn from held-out material only:

- ``code``: held-out ``.py`` files with docstrings and full-line comments removed, so the
  domain is code and nothing else.
- ``prose``: the docstrings and comments of the same held-out files, English text.
- ``hard``: text that neither model was trained on and that a shallow draft cannot guess:
  CPython's own test vectors (``math_testcases.txt``, ``cmath_testcases.txt``: dense float
  literals) and CJK text (``cjkencodings/*-utf8.txt``). Training reads ``.py`` files only, so
  none of it is in the training split. Some distributions strip ``Lib/test``; there the domain
  falls back to seeded float-literal tables from ``random.Random(0)``, which are just as
  high-entropy and identical on every machine.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import random
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path

from specrl.errors import SpecrlError

DOMAINS = ("code", "prose", "hard")
HELD_OUT_MODULUS = 32
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_HARD_TEST_FILES = ("math_testcases.txt", "cmath_testcases.txt")


@dataclass(frozen=True)
class Document:
    path: str  # relative to the stdlib root, '/'-separated
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(rel_path: str) -> bool:
    digest = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_MODULUS == 0


@functools.lru_cache(maxsize=1)
def _all_documents() -> tuple[Document, ...]:
    root = stdlib_root()
    documents = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _SKIP_DIRS.intersection(rel.split("/")):
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # a few test files are deliberately not UTF-8
        if text.strip():
            documents.append(Document(rel, text))
    if not documents:
        raise SpecrlError(f"no Python source found under {root}; specrl needs the stdlib sources")
    return tuple(documents)


def training_documents() -> list[Document]:
    """All stdlib ``.py`` files except the held-out ones, sorted by path."""
    return [d for d in _all_documents() if not is_held_out(d.path)]


def held_out_files() -> list[Document]:
    """The held-out ``.py`` files, unmodified, sorted by path.

    A held-out file whose text also appears verbatim in the training split (empty
    ``__init__.py`` files, vendored copies) is left out: the models have seen it.
    """
    seen = {d.text for d in training_documents()}
    return [d for d in _all_documents() if is_held_out(d.path) and d.text not in seen]


def held_out_documents(domain: str) -> list[str]:
    """Held-out evaluation text for ``domain`` (one of ``DOMAINS``), in a fixed order."""
    if domain not in DOMAINS:
        raise SpecrlError(f"unknown domain {domain!r}; choose one of: {', '.join(DOMAINS)}")
    return list(_held_out_cached(domain))


@functools.cache
def _held_out_cached(domain: str) -> tuple[str, ...]:
    if domain == "hard":
        return tuple(_hard_documents())
    out = []
    for doc in held_out_files():
        code, prose = split_code_and_prose(doc.text)
        text = code if domain == "code" else prose
        if len(text) >= 200:
            out.append(text)
    return tuple(out)


def split_code_and_prose(source: str) -> tuple[str, str]:
    """Split Python source into (code without docstrings/comment lines, docstrings+comments)."""
    try:
        tree = ast.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, tokenize.TokenError, ValueError):
        return source, ""
    prose: list[tuple[int, str]] = []
    drop_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    first = body[0]
                    prose.append((first.lineno, ast.get_docstring(node) or ""))
                    drop_lines.update(range(first.lineno, first.end_lineno + 1))
    lines = source.splitlines(keepends=True)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            text = tok.string.lstrip("#").strip()
            if text and not text.startswith("!"):
                prose.append((row, text))
            if lines[row - 1].strip().startswith("#"):
                drop_lines.add(row)
    code = "".join(line for i, line in enumerate(lines, 1) if i not in drop_lines)
    prose.sort(key=lambda item: item[0])
    return code, "\n\n".join(text for _, text in prose if text)


def _hard_documents() -> list[str]:
    test_dir = stdlib_root() / "test"
    files = [test_dir / name for name in _HARD_TEST_FILES]
    files += sorted((test_dir / "cjkencodings").glob("*-utf8.txt"))
    texts = []
    for path in files:
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        # Drop the license/comment headers of the test-vector files: they are prose.
        body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
        if body.strip():
            texts.append(body)
    return texts or _synthetic_float_tables()


def _synthetic_float_tables(n_docs: int = 8, rows: int = 200) -> list[str]:
    rng = random.Random(0)
    docs = []
    for d in range(n_docs):
        lines = []
        for r in range(rows):
            a, b = rng.uniform(-1e3, 1e3), rng.expovariate(0.01)
            lines.append(f"case{d:02d}{r:04d} f {a!r} {b!r} -> {a * b!r} {a / (b + 1)!r}")
        docs.append("\n".join(lines))
    return docs
