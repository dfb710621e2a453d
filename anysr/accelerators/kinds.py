"""The table of accelerator kinds: one class per device kind, read by the launcher, the options and the CLI.

Each kind says whether this machine has it (``available``), why not (``missing``), and turns the options into a
``LaunchPlan`` (``plan``) - all in the parent process, without touching a device runtime: CUDA devices are counted
through NVML, TPU chips through their device files, and nothing here imports torch_xla. Adding a backend (say
TorchTPU) is one more class here and its ``Accelerator`` subclass.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import socket
from abc import ABC, abstractmethod
from typing import Any

from anysr.accelerators.hardware import check_precision
from anysr.accelerators.plan import LAUNCHERS, LaunchPlan
from anysr.accelerators.xla_backends import BACKENDS, any_installed, choose_xla_backend
from anysr.accelerators.xla_plan import local_tpu_chips, xla_plan
from anysr.errors import AcceleratorError, did_you_mean

# Names people try for a device kind -> what to say (the nearest spelling would mislead: 'tpu' -> 'cpu').
ACCELERATOR_HINTS = {"tpu": "TPUs are accelerator: xla", "gpu": "NVIDIA GPUs are accelerator: cuda (Apple: mps)",
                     "nvidia": "NVIDIA GPUs are accelerator: cuda", "rocm": "AMD GPUs under ROCm are accelerator: cuda",
                     "hip": "AMD GPUs under ROCm are accelerator: cuda", "metal": "Apple GPUs are accelerator: mps",
                     "apple": "Apple GPUs are accelerator: mps", "pjrt": "PJRT devices are accelerator: xla"}


# --------------------------------------------------------------------------------------------- probes
def cuda_count() -> int:
    """Visible CUDA devices, counted through NVML so the parent never creates a CUDA context."""
    try:
        import torch  # noqa: PLC0415 - the parent process resolves kinds without torch
        import torch.cuda as tc  # noqa: PLC0415 - the parent process resolves kinds without torch

        if not torch.backends.cuda.is_built():  # a CPU-only build: no driver to ask
            return 0
        count = tc._device_count_nvml()  # noqa: SLF001 - NVML count, no context
        if count < 0:
            count = tc.device_count()
        return max(0, count)
    except (RuntimeError, AttributeError, OSError):
        return 0


def mps_available() -> bool:
    import torch  # noqa: PLC0415 - the parent process resolves kinds without torch

    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def cpu_cores() -> int:
    return os.cpu_count() or 1


def free_port() -> int:
    """A free TCP port on localhost for the spawned workers' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What the options ask of the launch (the kind's ``plan`` turns it into a ``LaunchPlan``)."""

    count: int | None  # num_gpu: None = auto / all
    precision: str = "auto"
    launcher: str = "auto"  # one of plan.LAUNCHERS
    spmd: bool = False
    compile: bool = False
    dist_backend: str | None = None
    master_port: int | None = None
    channels_last: bool | None = None
    find_unused_parameters: bool = False
    static_graph: bool = False
    xla_backend: str = "auto"  # xla.backend (xla_backends.XLA_BACKENDS)
    matmul_precision: str = "default"  # xla.matmul_precision (torchax)


# --------------------------------------------------------------------------------------------- kinds
class Kind(ABC):
    """One device kind."""

    name: str
    accelerator_class_path: str  # "module:Class" of its Accelerator, imported inside the worker only
    default_backend: str | None = None
    compile_ok = False

    @abstractmethod
    def available(self) -> bool:
        """Whether this machine has the kind (no device runtime is started)."""

    def wanted(self) -> bool:
        """Whether ``accelerator: auto`` picks this kind (tried in ``AUTO_ORDER``)."""
        return self.available()

    def missing(self) -> str:
        """Why it is not available, and what to do."""
        return f"accelerator: {self.name} was asked for but is not available here; set accelerator: cpu or auto"

    def device_count(self, request: PlanRequest) -> int:
        """How many local workers the plan starts (checks num_gpu)."""
        n = 1 if request.count in (None, 0) else request.count
        return int(n)

    def check(self, request: PlanRequest) -> None:
        """Refuse what this kind cannot do (precision, compile)."""
        if request.compile and not self.compile_ok:
            raise AcceleratorError(f"train.compile: torch.compile is supported here on cpu and cuda, not {self.name}")

    def backend(self, request: PlanRequest) -> tuple[str | None, tuple[str, ...]]:
        """The process-group backend and notes (a BasicSR file's nccl on CPU ranks is replaced, with a note)."""
        return request.dist_backend, ()

    def plan(self, request: PlanRequest, external: str | None) -> LaunchPlan:
        """The launch plan; ``external`` names a launcher that already started us (``plan.EXTERNAL_LAUNCHERS``)."""
        self.check(request)
        backend, notes = self.backend(request)
        common: dict[str, Any] = dict(
            precision=request.precision, compile=request.compile, dist_backend=backend,
            channels_last=request.channels_last, notes=notes,
            ddp={"find_unused_parameters": request.find_unused_parameters, "static_graph": request.static_graph})
        if external:
            return LaunchPlan(self.name, 1, external, master_port=request.master_port, **common)
        n = self.device_count(request)
        if n > 1:
            return LaunchPlan(self.name, n, "spawn", master_port=request.master_port or free_port(), **common)
        return LaunchPlan(self.name, 1, "none", **common)

    def accelerator_class(self, plan: LaunchPlan | None = None) -> type:
        """The ``Accelerator`` subclass of this kind (``plan``: for kinds with several backends)."""
        del plan
        module, _, cls = self.accelerator_class_path.partition(":")
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


class CPUKind(Kind):
    name = "cpu"
    accelerator_class_path = "anysr.accelerators.torch_dist:CPUAccelerator"
    default_backend = "gloo"
    compile_ok = True

    def available(self) -> bool:
        return True

    def check(self, request: PlanRequest) -> None:
        super().check(request)
        check_precision(request.precision, self.name)

    def device_count(self, request: PlanRequest) -> int:
        n = super().device_count(request)
        if n > cpu_cores():
            raise AcceleratorError(f"num_gpu: {n} CPU ranks asked for but this machine has {cpu_cores()} cores; "
                                   f"set num_gpu to at most {cpu_cores()}")
        return n

    def backend(self, request: PlanRequest) -> tuple[str | None, tuple[str, ...]]:
        if request.dist_backend not in (None, "gloo"):
            return "gloo", (f"dist_params.backend: {request.dist_backend} cannot serve CPU ranks; using gloo",)
        return request.dist_backend, ()


class CUDAKind(Kind):
    name = "cuda"
    accelerator_class_path = "anysr.accelerators.torch_dist:CUDAAccelerator"
    default_backend = "nccl"
    compile_ok = True

    def available(self) -> bool:
        return cuda_count() > 0

    def missing(self) -> str:
        return ("accelerator: cuda was asked for but no CUDA device is visible (torch built without CUDA, no "
                "driver, or CUDA_VISIBLE_DEVICES empty); set accelerator: cpu or auto")

    def device_count(self, request: PlanRequest) -> int:
        available = cuda_count()
        n = available if request.count in (None, 0) else request.count
        if n > available:
            raise AcceleratorError(
                f"num_gpu: {n} CUDA devices asked for, {available} visible; set num_gpu: auto "
                f"(uses all {available}) or a number <= {available}, or change CUDA_VISIBLE_DEVICES")
        return int(n)


class MPSKind(Kind):
    name = "mps"
    accelerator_class_path = "anysr.accelerators.torch_dist:MPSAccelerator"

    def available(self) -> bool:
        return mps_available()

    def missing(self) -> str:
        return "accelerator: mps was asked for but MPS is not available here; set accelerator: cpu or auto"

    def device_count(self, request: PlanRequest) -> int:
        n = super().device_count(request)
        if n != 1:
            raise AcceleratorError(f"num_gpu: {n} asked for on mps; there is one MPS device, set num_gpu: 1")
        return n


class XLAKind(Kind):
    """XLA devices through one of the backends of ``xla_backends`` (torch_xla, torchax)."""

    name = "xla"
    accelerator_class_path = "anysr.accelerators.xla:XLAAccelerator"  # torch_xla's; the plan names the backend

    def available(self) -> bool:
        return any_installed()

    def wanted(self) -> bool:
        """``auto`` picks XLA when an XLA backend is installed and PJRT_DEVICE is set or TPU chips are attached."""
        return self.available() and ("PJRT_DEVICE" in os.environ or local_tpu_chips() > 0)

    def missing(self) -> str:
        return ("accelerator: xla was asked for but torch_xla is not installed (nor torchax); pip install "
                "'anysr[xla]' (torch_xla 2.9 with torch 2.9) or jax and torchax (current torch), or set "
                "accelerator: cpu")

    def plan(self, request: PlanRequest, external: str | None) -> LaunchPlan:
        """torch_xla starts its own workers (torch_xla.launch) or runs SPMD in one process (``xla_plan``);
        torchax runs one process that shards each batch over a mesh of its local JAX devices."""
        # XLA assigns tensor layouts itself when it compiles the graph: channels_last is only recorded (the
        # worker's choice says it is ignored).
        del external
        backend = choose_xla_backend(request.xla_backend)
        if backend.name == "torchax":
            plan = torchax_plan(request)
        else:
            plan = xla_plan(request.count, precision=request.precision, spmd=request.spmd, compile=request.compile)
        extra = {**plan.extra, "backend": backend.name, "matmul_precision": request.matmul_precision}
        return dataclasses.replace(plan, channels_last=request.channels_last, extra=extra)

    def accelerator_class(self, plan: LaunchPlan | None = None) -> type:
        name = plan.extra.get("backend", "torch_xla") if plan is not None else "torch_xla"
        module, _, cls = BACKENDS[name].accelerator_class_path.partition(":")
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def torchax_plan(request: PlanRequest) -> LaunchPlan:
    """One process over the local JAX devices (``num_gpu: auto``: all; 1: the first); no device is touched here."""
    if request.compile:
        raise AcceleratorError("train.compile: true is not used on XLA, which compiles the whole step graph "
                               "itself; set train.compile: false")
    if request.spmd:
        raise AcceleratorError("xla.spmd: true is torch_xla's mode; torchax always runs one process that shards "
                               "each batch over its devices: remove xla.spmd")
    check_precision(request.precision, "xla")
    if request.count not in (None, 0, 1):
        raise AcceleratorError(f"num_gpu: {request.count} with xla.backend torchax: set num_gpu: auto (every local "
                               "JAX device) or 1; choose devices in the environment (TPU_VISIBLE_CHIPS, or "
                               "XLA_FLAGS=--xla_force_host_platform_device_count=N on the CPU)")
    extra: dict[str, Any] = {"all_devices": request.count in (None, 0)}
    return LaunchPlan("xla", 1, "none", request.precision, extra=extra)


KINDS: dict[str, Kind] = {k.name: k for k in (CPUKind(), CUDAKind(), MPSKind(), XLAKind())}
AUTO_ORDER = ("xla", "cuda", "mps", "cpu")
ACCELERATORS = ("auto", *KINDS)
__all__ = ["ACCELERATORS", "ACCELERATOR_HINTS", "AUTO_ORDER", "KINDS", "LAUNCHERS", "Kind", "PlanRequest", "pick_kind"]


def pick_kind(name: str) -> Kind:
    """Resolve ``auto`` (XLA when PJRT_DEVICE is set or TPU chips exist, then CUDA, MPS, CPU) and check."""
    if name not in ACCELERATORS:
        hint = f" ({ACCELERATOR_HINTS[name.lower()]})" if name.lower() in ACCELERATOR_HINTS \
            else did_you_mean(name, ACCELERATORS)
        raise AcceleratorError(f"accelerator: '{name}' is not one of {', '.join(ACCELERATORS)}{hint}")
    if name == "auto":
        return next(KINDS[k] for k in AUTO_ORDER if KINDS[k].wanted())
    kind = KINDS[name]
    if not kind.available():
        raise AcceleratorError(kind.missing())
    return kind
