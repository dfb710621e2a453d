"""Switching autocast off around computations that must run in their inputs' dtype.

Used by archs (kernel folding), ops and data (degradations, DiffJPEG) alike; it knows no accelerator, only the
device type of what it is given.
"""

from __future__ import annotations

import contextlib

import torch


def autocast_off(where: torch.Tensor | torch.device | str) -> contextlib.AbstractContextManager:
    """A context in which autocast is off on the device type of ``where`` (a tensor, a device or a device type).

    It is ``torch.autocast(device_type, enabled=False)`` when autocast is on for that device type, else a no-op
    (also where the device type has no autocast at all, e.g. 'meta'): inside it, operations run in their inputs'
    dtype on CPU, CUDA, MPS and XLA alike.
    """
    if isinstance(where, torch.Tensor):
        kind = where.device.type
    elif isinstance(where, torch.device):
        kind = where.type
    else:
        kind = torch.device(where).type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()


__all__ = ["autocast_off"]
