"""What the option modules share: the registries as the options read them, the phases, small helpers for rules.

The options only READ ``anysr.registry``'s registries; the packages that define the classes fill them when they are
imported. Whoever validates options imports those packages first (``anysr.plugins.load_plugins``: the command
line, ``anysr schema --markdown``, the tests' conftest); the options import no model, dataset, network,
loss or metric module themselves (no torch).
"""

from __future__ import annotations

from typing import Any

from anysr.options.fields import MISSING, Context
from anysr.registry import (
    ARCH_REGISTRY,
    DATASET_REGISTRY,
    DEGRADATION_REGISTRY,
    LOSS_REGISTRY,
    METRIC_REGISTRY,
    MODEL_REGISTRY,
    OPTIMIZER_REGISTRY,
    SCHEDULER_REGISTRY,
    Registry,
)

PHASES = ("train", "val", "test")

# Each kind of named class: its registry and the package whose import fills it.
REGISTRIES: dict[str, tuple[Registry, str]] = {
    "model": (MODEL_REGISTRY, "anysr.models"),
    "dataset": (DATASET_REGISTRY, "anysr.data"),
    "arch": (ARCH_REGISTRY, "anysr.archs"),
    "metric": (METRIC_REGISTRY, "anysr.metrics"),
    "loss": (LOSS_REGISTRY, "anysr.losses"),
    "optimizer": (OPTIMIZER_REGISTRY, "anysr.models"),
    "scheduler": (SCHEDULER_REGISTRY, "anysr.models"),
    "degradation": (DEGRADATION_REGISTRY, "anysr.data"),
}


class RegistryNotFilled(RuntimeError):
    """The options read a registry that nothing has filled: the packages that register its classes are not
    imported (a programming error of the caller, not a bad option)."""


def registry(kind: str) -> Registry:
    """The registry of ``kind`` ('model', 'dataset', 'arch', 'metric', 'loss', 'optimizer', 'scheduler').

    Raises ``RegistryNotFilled`` naming what to import when it is empty."""
    reg, package = REGISTRIES[kind]
    if not reg.keys():
        raise RegistryNotFilled(f"the {reg.name} registry is empty: validating options reads the registered "
                                f"classes; call anysr.plugins.load_plugins() (or import {package}) first")
    return reg


def known_names(kind: str, role: str | None = None) -> list[str]:
    """Names registered for ``kind`` (only classes whose ``role`` attribute is ``role``, when given)."""
    reg = registry(kind)
    return [n for n in reg.keys() if role is None or getattr(reg.get(n), "role", None) == role]


def registered(kind: str, name: Any) -> Any:
    """The class (or function) registered as ``name`` for ``kind``; None for an unknown or non-string name."""
    reg = registry(kind)
    return reg.get(name) if isinstance(name, str) and name in reg else None


def dataset_role(kind: Any) -> str | None:
    """The ``role`` a registered dataset class declares ('paired', 'synthesis_source'), or None."""
    return getattr(registered("dataset", kind), "role", None)


def good(out: dict[str, Any], key: str) -> bool:
    """The key is present, valid and not null."""
    return out.get(key, None) not in (None, MISSING)


def check_gt_size(size: Any, where: str, ctx: Context) -> None:
    """The one check of a GT patch size (``datasets.<name>.gt_size``, Real-ESRGAN's top-level ``gt_size``): a
    multiple of the scale, so the LQ patch (``anysr.data.transforms.lq_patch_size``) pairs with it exactly."""
    if isinstance(size, int) and not isinstance(size, bool) and ctx.scale is not None and size % ctx.scale:
        ctx.add(where, f"{size} is not a multiple of scale ({ctx.scale}); use e.g. "
                f"{max(1, size // ctx.scale) * ctx.scale}")


def phase_of(name: str) -> str | None:
    """The phase a dataset key names by its prefix (train, val, test), or None."""
    for phase in PHASES:
        if name.startswith(phase):
            return phase
    return None


def backend_types() -> list[str]:
    """The ``io_backend.type`` values the registered datasets read (their ``backend_types``), in their order."""
    reg = registry("dataset")
    kinds: list[str] = []
    for name in reg.keys():
        kinds += [k for k in getattr(reg.get(name), "backend_types", ()) if k not in kinds]
    return kinds
