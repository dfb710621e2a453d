"""What the parent process decides before any worker exists (no torch import: the CLI reads it cheaply)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LaunchPlan:
    """What the parent process decided, without touching a device runtime.

    ``launcher`` is how workers come to exist: ``none`` (this process is the only worker),
    ``spawn`` (we start ``nprocs`` local workers with torch.multiprocessing), ``xla`` (torch_xla.launch),
    ``torchrun`` / ``slurm`` / ``pjrt`` (someone else started us; we join their world).
    ``precision`` is one of ``PRECISION_CHOICES`` and ``channels_last`` True, False or None (auto): what the
    options ask for. ``auto`` is decided by each worker's accelerator from its device (``Precision.decide``),
    because only the worker may look at the device.
    """

    accelerator: str
    nprocs: int = 1
    launcher: str = "none"
    precision: str = "auto"
    spmd: bool = False
    compile: bool = False
    dist_backend: str | None = None
    master_port: int | None = None
    channels_last: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # decisions worth one log line each (a replaced process-group backend)
    ddp: dict[str, bool] = field(default_factory=dict)  # find_unused_parameters / static_graph for DDP
