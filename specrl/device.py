"""The torch device a command runs on, checked before any model loads."""

from __future__ import annotations

import torch

from specrl.errors import SpecrlError


def require_device(device: str | torch.device) -> None:
    """Refuse ``device`` (``--device``) unless torch can use it here.

    A CUDA device with no GPU visible fails with the fix, instead of a CUDA error from deep
    inside the first ``.to(device)`` after minutes of loading weights."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise SpecrlError(
            f"--device {device}: not a torch device ({err}); use cpu, cuda or cuda:N"
        ) from None
    if dev.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise SpecrlError(
            f"--device {device}: no CUDA device is visible to torch "
            "(torch.cuda.is_available() is False); run on a GPU machine or use --device cpu"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise SpecrlError(
            f"--device {device}: torch sees {count} CUDA device(s), numbered from 0; "
            f"use --device cuda:0 to cuda:{count - 1}"
        )
