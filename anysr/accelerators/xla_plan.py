"""XLA launch planning, in the parent process.

This module runs before any worker exists, so it never imports torch_xla at module level and never asks
the XLA runtime anything: everything it decides comes from the options and the environment
(``PJRT_DEVICE``, ``CPU_NUM_DEVICES``, ``TPU_*``). ``xla_launch`` is the only function here that imports
torch_xla, and it hands over to ``torch_xla.launch`` before any device is touched.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from typing import Any

from anysr.accelerators.hardware import check_precision
from anysr.accelerators.plan import LaunchPlan
from anysr.errors import AcceleratorError

_SUBSET_HINT = (
    "torch_xla starts either every local device or exactly one. Set num_gpu: auto (all devices) or 1; "
    "to use a subset of TPU chips, choose them in the environment before starting, for example "
    "TPU_VISIBLE_CHIPS=0,1 TPU_PROCESS_BOUNDS=1,1,1 TPU_CHIPS_PER_PROCESS_BOUNDS=1,2,1, with num_gpu: auto"
)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:
        return None


def pjrt_device() -> str:
    """The PJRT device kind workers will use: ``PJRT_DEVICE``, else TPU when chips are attached, else CPU."""
    name = os.environ.get("PJRT_DEVICE", "").strip().upper()
    if name:
        return name
    return "TPU" if local_tpu_chips() > 0 else "CPU"


def local_tpu_chips() -> int:
    """TPU chips this host exposes (device files only: /dev/accel* on v2-v4, /dev/vfio/N on v5e and later)."""
    visible = os.environ.get("TPU_VISIBLE_CHIPS", "").strip()
    if visible:
        return len([c for c in visible.split(",") if c.strip()])
    return len(glob.glob("/dev/accel*")) or len(glob.glob("/dev/vfio/[0-9]*"))


def tpu_hosts() -> int:
    """How many hosts the TPU slice has, as far as the environment says (1 when it says nothing)."""
    names = os.environ.get("TPU_WORKER_HOSTNAMES", "").strip()
    return len([h for h in names.split(",") if h.strip()]) if names else 1


def _local_processes(device: str) -> int:
    """The processes ``torch_xla.launch`` will start on this host (an estimate from device files)."""
    if device == "TPU":
        return max(1, local_tpu_chips())
    return 1  # CPU (and GPU plugins) run one process; its devices are threads


def xla_plan(count: int | None, *, precision: str, spmd: bool, compile: bool) -> LaunchPlan:
    """Decide how XLA workers start, from options and environment only (never the XLA runtime).

    ``count`` None or 0: every local device through ``torch_xla.launch`` (launcher ``xla``); 1: one device,
    in this process (launcher ``xla``, ``nprocs`` 1); anything else is an error. ``spmd``: one process that
    shards each batch over all local devices (launcher ``none``).
    """
    if compile:
        raise AcceleratorError("train.compile: true is not used on XLA, which compiles the whole step graph "
                               "itself; set train.compile: false")
    check_precision(precision, "xla")
    device = pjrt_device()
    hosts = tpu_hosts()
    extra: dict[str, Any] = {"pjrt_device": device, "hosts": hosts}
    worker_id = _env_int("TPU_WORKER_ID")
    if worker_id is not None:
        extra["worker_id"] = worker_id

    if count not in (None, 0, 1):
        raise AcceleratorError(f"num_gpu: {count} XLA devices asked for. {_SUBSET_HINT}")

    cpu_devices = _env_int("CPU_NUM_DEVICES") or 1
    if spmd:
        if count == 1:
            raise AcceleratorError("num_gpu: 1 with xla.spmd: true; SPMD shards each batch over every local "
                                   "device, so set num_gpu: auto (or xla.spmd: false for one device)")
        if hosts > 1:
            raise AcceleratorError(
                f"xla.spmd: true on a TPU slice of {hosts} hosts (TPU_WORKER_HOSTNAMES) is not supported by "
                "anysr yet; set xla.spmd: false to run one process per chip on every host")
        return LaunchPlan("xla", 1, "none", precision, spmd=True, extra=extra)

    if count == 1:
        if hosts > 1:
            raise AcceleratorError(
                f"num_gpu: 1 on a TPU slice of {hosts} hosts (TPU_WORKER_HOSTNAMES): every host would train "
                "alone and write the same files; set num_gpu: auto and run the same command on every host")
        extra["all_devices"] = False
        return LaunchPlan("xla", 1, "xla", precision, extra=extra)

    if device == "CPU" and cpu_devices > 1:
        raise AcceleratorError(
            f"CPU_NUM_DEVICES={cpu_devices} without spmd: XLA:CPU runs its devices as threads of one process "
            "and their collectives stall (torch_xla 2.9); set xla.spmd: true to use several CPU devices, "
            "or unset CPU_NUM_DEVICES")
    extra["all_devices"] = True
    return LaunchPlan("xla", _local_processes(device), "xla", precision, extra=extra)


def _xla_entry(index: int, worker: Callable[..., Any], plan: LaunchPlan, fn: Callable[..., Any],
               args: tuple[Any, ...], box: list[Any], parent_pid: int | None) -> None:
    """Runs in each XLA process (or thread): hands over to ``worker`` with this device's local index.

    ``parent_pid``: set when torch_xla starts separate processes, which then die with the parent."""
    del index  # torch_xla passes the global ordinal; the worker wants the local one
    import torch_xla.runtime as xr  # noqa: PLC0415 - only ever inside a worker

    own_process = parent_pid is not None and os.getpid() != parent_pid
    result = worker(xr.local_ordinal(), plan, fn, args, parent_pid if own_process else None)
    if xr.global_ordinal() == 0:
        box.append(result)


def xla_launch(plan: LaunchPlan, worker: Callable[..., Any], fn: Callable[..., Any],
               args: tuple[Any, ...]) -> Any:
    """Start the XLA workers with ``torch_xla.launch``; each runs ``worker(local_index, plan, fn, args)``.

    With one device (``nprocs`` 1, not all devices) torch_xla runs the worker in this process and its
    result is returned; otherwise workers are separate processes and None is returned.
    """
    import torch_xla  # noqa: PLC0415 - the parent must not load the runtime before this point

    box: list[Any] = []
    single = plan.nprocs == 1 and not plan.extra.get("all_devices", False)
    torch_xla.launch(_xla_entry, args=(worker, plan, fn, args, box, None if single else os.getpid()),
                     debug_single_process=single)
    return box[0] if box else None
