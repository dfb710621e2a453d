"""The only package that knows devices, processes, collectives, precision and torch_xla.

Names are imported on first use, so ``anysr --help`` and the options checker do not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Accelerator": "anysr.accelerators.base",
    "LaunchPlan": "anysr.accelerators.base",
    "create_accelerator": "anysr.accelerators.launcher",
    "device_scalar": "anysr.accelerators.base",
    "launch": "anysr.accelerators.launcher",
    "resolve_plan": "anysr.accelerators.launcher",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'anysr.accelerators' has no attribute {name!r}")
