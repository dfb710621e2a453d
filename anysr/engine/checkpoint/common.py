"""Names shared by the checkpoint modules."""

from __future__ import annotations

import os

import torch

PathLike = str | os.PathLike
STATE_FORMAT = 1  # the training-state layout (``state['__anysr__']['format']``); the one place it is defined
WEIGHTS_FORMAT = 1  # the anysr .safetensors metadata layout
STATE_KEY = "__anysr__"


def compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a copy when it is a view into a larger storage (torch.save would store it all)."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone()
    return t


def first(names: list[str], n: int = 10) -> str:
    """The first ``n`` names, and how many more there are."""
    shown = ", ".join(names[:n])
    return shown + (f", ... ({len(names) - n} more)" if len(names) > n else "")
