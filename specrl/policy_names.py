"""Controllers by command-line name, checked for form without building one: ``off``,
``fixed:K``, ``threshold:K:B``, ``threshold:tuned``, ``sweep``, ``schedule:FILE``, ``hf``,
``ema``, ``goodput``, ``oracle``, ``ppo:RUN_DIR`` and ``lookup:TABLE.json``. The policies
themselves are built by :func:`specrl.policies.make_policy`; a training config checks its
warm start's name here, below the policies it names."""

from __future__ import annotations

from specrl.errors import SpecrlError
from specrl.seeds import TUNE_SEED

VALID_FORMS = (
    "off (no speculation), fixed:K (K = 0..k_max every step), threshold:K:B (K up to batch "
    "B, off above), threshold:tuned and sweep (the engineer's: tuned in the surrogate on "
    f"seeds from {TUNE_SEED}), schedule:FILE (a vLLM, TensorRT-LLM or SGLang table, JSON), "
    "hf "
    "(transformers' heuristic), ema (SGLang's adaptive), goodput (SmartSpec's goodput "
    "model), oracle (surrogate only), ppo:RUN_DIR (a policy trained by `specrl train`), "
    "lookup:TABLE.json (a table written by `specrl export`)"
)
_NO_ARGS = ("off", "sweep", "hf", "ema", "goodput", "oracle")


def parse_policies(text: str) -> list[str]:
    """``"off,fixed:2,goodput"`` -> ``["off", "fixed:2", "goodput"]``, each checked for form
    (ranges are checked by :func:`make_policy`, which knows the env). A schedule file's path
    cannot hold a comma."""
    specs = [part.strip() for part in text.split(",") if part.strip()]
    if not specs:
        raise SpecrlError(f"no policy given in {text!r}; valid: {VALID_FORMS}")
    for spec in specs:
        split_spec(spec)
    return specs


def split_spec(spec: str) -> tuple[str, list[str]]:
    """``(kind, args)`` of a well-formed ``spec``, else a SpecrlError listing the forms."""
    kind, _, rest = spec.strip().partition(":")
    if kind in ("schedule", "ppo", "lookup"):
        args = [rest] if rest else []
        wanted = 1
    else:
        args = rest.split(":") if rest else []
        wanted = {"fixed": 1, "threshold": 2, **dict.fromkeys(_NO_ARGS, 0)}.get(kind)
        if kind == "threshold" and args == ["tuned"]:
            wanted = 1
    if wanted is None or len(args) != wanted:
        raise SpecrlError(f"unknown or malformed policy {spec!r}; valid: {VALID_FORMS}")
    return kind, args
