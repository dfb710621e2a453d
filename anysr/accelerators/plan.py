"""What the parent process decides before any worker exists (no torch import: the CLI reads it cheaply)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The one launcher vocabulary: how the workers of a run come to exist (``LaunchPlan.launcher``).
LAUNCH_MODES = {
    "none": "this process is the only worker",
    "spawn": "we start nprocs local workers with torch.multiprocessing",
    "xla": "torch_xla.launch starts them",
    "torchrun": "torchrun (or torch.distributed.launch) started us; we join its world",
    "slurm": "srun started us (one task per device); we join its world",
}
EXTERNAL_LAUNCHERS = ("torchrun", "slurm")  # modes where someone else started us
LAUNCHER_ALIASES = {"pytorch": "torchrun"}  # BasicSR's name for torchrun
# What ``--launcher`` (and a BasicSR file's ``launcher``) accepts: auto (torchrun when its variables are set,
# else we decide), none (run here, alone), or an external launcher by name.
LAUNCHERS = ("auto", "none", *LAUNCHER_ALIASES, *EXTERNAL_LAUNCHERS)


def external_launcher(requested: str, *, torchrun_env: bool) -> str | None:
    """The external launcher (a ``LAUNCH_MODES`` name) that started us, or None when we start the workers.

    ``requested`` is a ``LAUNCHERS`` value; ``torchrun_env``: RANK and WORLD_SIZE are set (``auto`` joins them).
    """
    mode = LAUNCHER_ALIASES.get(requested, requested)
    if mode in EXTERNAL_LAUNCHERS:
        return mode
    return "torchrun" if mode == "auto" and torchrun_env else None


@dataclass(frozen=True)
class LaunchPlan:
    """What the parent process decided, without touching a device runtime.

    ``launcher`` is how workers come to exist, one of ``LAUNCH_MODES``.
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
    deep_samples: str | None = None  # what holds 16-bit samples ("16-bit input images"): precision auto means fp32
    precision_source: str = "set in the options or on the command line"  # why a forced precision is what it is
    ddp: dict[str, bool] = field(default_factory=dict)  # find_unused_parameters / static_graph for DDP
