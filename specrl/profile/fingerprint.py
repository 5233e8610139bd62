"""Where a profile was measured, and whether it may stand in for a given engine.

A fingerprint names the device, the library versions, the model pair (ids and a hash of the
weights) and ``k_max``. Timings only transfer between identical devices and identical
weights; versions may shift timings a little, so a version mismatch only warns.
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from functools import cache

import torch
import transformers

from specrl.errors import SpecrlError, SpecrlWarning
from specrl.profile.freshness import REMEASURE

HARD_KEYS = ("device", "target_sha256", "draft_sha256")
SOFT_KEYS = ("torch", "transformers", "threads")


@cache
def device_name(device: str = "cpu") -> str:
    """A stable name for the hardware, e.g. ``cpu: AMD EPYC x2`` or ``cuda: NVIDIA H200``."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{dev.type}: {model} x{os.cpu_count()}"


def weights_sha256(model) -> str:
    """SHA-256 over the model's parameters and buffers, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _model_id(model, path) -> str:
    if path:
        return str(path)
    return str(getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__)


def profile_threads(profile, threads: int | None = None) -> int:
    """The torch thread count to run ``profile`` at: ``threads`` or, by default, the one it
    was measured with (torch's current count for a profile that does not say)."""
    return int(threads or profile.fingerprint.get("threads") or torch.get_num_threads())


def measuring_threads(device: str = "cpu", threads: int | None = None) -> int:
    """The torch thread count a profile is measured with: ``threads`` where given; on a CPU,
    one fewer than the machine's cores (at least 1), which leaves a core to the engine's
    Python loop and to whatever else the machine runs; on a GPU, torch's own count.

    Why: with every core in torch's parallel regions, a step waits for the slowest core, and
    on a small VM the step times then swing with the VM by more than a profile's checks
    allow (docs/profile.md#threads)."""
    if threads:
        return int(threads)
    if torch.device(device).type == "cpu":
        return max(1, (os.cpu_count() or 1) - 1)
    return torch.get_num_threads()


def use_profile_threads(profile, threads: int | None = None) -> int:
    """Set torch's thread count to :func:`profile_threads` and return the count now in use. A
    profile's step times hold only at its own count: another count speeds up some batch
    sizes and slows others, so it moves the crossover itself (docs/profile.md#threads)."""
    torch.set_num_threads(profile_threads(profile, threads))
    return torch.get_num_threads()


def pair_fingerprint(pair, *, k_max: int, device: str = "cpu") -> dict:
    """The fingerprint of ``pair`` (a ``specrl.models.ModelPair``) on ``device``."""
    return {
        "device": device_name(str(device)),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "target_id": _model_id(pair.target, getattr(pair, "target_path", None)),
        "target_sha256": weights_sha256(pair.target),
        "draft_id": _model_id(pair.draft, getattr(pair, "draft_path", None)),
        "draft_sha256": weights_sha256(pair.draft) if pair.draft is not None else "",
        "k_max": k_max,
    }


def other_weights(theirs: dict, here: dict) -> list[str]:
    """Which of ``"target"`` and ``"draft"`` fingerprint ``theirs`` names with other weights
    (sha256) than fingerprint ``here``."""
    return [r for r in ("target", "draft") if theirs.get(f"{r}_sha256") != here[f"{r}_sha256"]]


def check_compatible(
    profile,
    fingerprint: dict,
    *,
    force: bool = False,
    source: str = "",
    remeasure: str = REMEASURE,
) -> None:
    """Refuse ``profile`` for an engine with ``fingerprint`` unless they match; the refusal
    names ``remeasure``, the command that measures this engine's pair
    (:func:`specrl.profile.freshness.remeasure_command`).

    Device or weights differ: :class:`SpecrlError`, or a warning with ``force=True``.
    Library versions or torch's thread count differ: a warning. The engine's ``k_max`` beyond
    the profile's: always an error (there is nothing measured to stand in for it).
    """
    where = source or "profile"
    theirs = profile.fingerprint
    if fingerprint.get("k_max", 0) > profile.k_max:
        raise SpecrlError(
            f"{where}: k_max is {profile.k_max} but the engine uses k_max="
            f"{fingerprint['k_max']}; measure a profile with `specrl profile --k-max "
            f"{fingerprint['k_max']}` or lower k_max"
        )
    hard = [k for k in HARD_KEYS if theirs.get(k) != fingerprint.get(k)]
    if hard:
        detail = "; ".join(f"{k}: {theirs.get(k)!r} vs here {fingerprint.get(k)!r}" for k in hard)
        message = (
            f"{where} was measured on other hardware or another model pair ({detail}); "
            f"measure this machine with `{remeasure}`, or force it "
            "(--force / force_profile=True) to use it anyway"
        )
        if not force:
            raise SpecrlError(message)
        warnings.warn(message, category=SpecrlWarning, stacklevel=2)
    soft = [k for k in SOFT_KEYS if theirs.get(k) != fingerprint.get(k)]
    if soft:
        warnings.warn(
            f"{where}: {', '.join(soft)} differ from where it was measured "
            f"({', '.join(f'{theirs.get(k)} vs here {fingerprint.get(k)}' for k in soft)}); "
            "timings may have shifted",
            category=SpecrlWarning,
            stacklevel=2,
        )
